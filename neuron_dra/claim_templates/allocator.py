"""A simulation of kube-scheduler's structured DRA allocator (k8s.io/dynamic-resource-allocation/structured,
read from 1.34's "experimental" implementation, updated to 1.36), on the same API dicts as the real one:
- pools: slices for the node (nodeName, allNodes or a matching nodeSelector), newest generation only; an
  incomplete pool gives no devices and fails an `All` request; an invalid one (duplicate device names) also
  makes a failed search an error;
- depth-first search with backtracking over claims, requests (firstAvailable: subrequests in order), device
  slots, pools, slices and devices in order; the first complete solution wins; at most 32 devices per claim;
- a device is selectable when every class selector, then every request selector, is true; a CEL error
  aborts the allocation; `All` takes every selectable device of the node at once, at least one;
- matchAttribute: same type and value over the named requests (or all), checked as devices are added;
- device taints (`device_taints=False` for 1.34/1.35): an untolerated NoSchedule/NoExecute taint skips
  the device; tolerations match as resourceclaim.ToleratesTaint does.

Differences that change no answer: the search skips a slot when fewer usable devices remain than the
request needs, and remembers failed subtrees by the devices taken (Go re-visits one per ordering, which is
exponential), in a memo of at most MEMO_LIMIT entries; there is no timeout; pools go in the order their first
slice appears. prune=False turns both off and makes Go's allocateOne calls in Go's order, counted in
`SimulationResult.searches` and bounded by a budget (SearchBudgetExceeded), which keeps the differential
test's cases clear of Go's filter timeout. Partitionable devices (shared counters) follow `partitionable`; alpha
features (per-device node selection, consumable capacity, binding conditions) are off, as on EKS.

Modes, as in tests/support/go/allocsim: "fit-one" allocates all claims together once; "count" allocates
copies of claims[0] one after another, each added to the allocated set.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal, NamedTuple

from neuron_dra.claim_templates.cel_env import (
    CelCompileError,
    CelDevice,
    CelEnvironment,
    CelEvaluationError,
)
from neuron_dra.claim_templates.cel_types import Quantity

MAX_DEVICES_PER_CLAIM = 32  # resource.k8s.io/v1 AllocationResultsMaxSize
# Failed subtrees the search remembers at most (a few hundred bytes each); past it the memo starts again.
MEMO_LIMIT = 200_000
COUNT_CAP = 256  # copies counted at most: above any node (16 devices + 128 NeuronCores at LNC=1)

Mode = Literal["fit-one", "count"]


class DeviceId(NamedTuple):
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class DeviceResult:
    """One allocated device, as in `status.allocation.devices.results[]`."""

    request: str  # "req" or "req/subreq"
    driver: str
    pool: str
    device: str
    admin_access: bool = False  # not counted as allocated afterwards (the scheduler's claim tracker)

    @property
    def id(self) -> DeviceId:
        return DeviceId(self.driver, self.pool, self.device)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.admin_access:
            out["adminAccess"] = True
        return out


@dataclass(frozen=True)
class SimulationResult:
    satisfiable: bool
    count: int
    allocation: tuple[tuple[DeviceResult, ...], ...]  # fit-one: one per claim; count: one per copy
    error: str | None = None  # the allocator returned an error (Kubernetes: the pod is unschedulable here)
    # allocateOne calls of each allocation run, in order (with prune=False, the calls Go's search makes).
    # A measure of the search, not part of the answer: left out of equality.
    searches: tuple[int, ...] = field(default=(), compare=False)
    # the most failed subtrees the memo held at once, per run (at most MEMO_LIMIT); also left out of equality
    memo_peaks: tuple[int, ...] = field(default=(), compare=False)


class AllocationError(Exception):
    """What the Go allocator returns as an error."""


class SearchBudgetExceeded(Exception):
    """One allocation took more allocateOne calls than the Simulator's budget: no answer (a Go search that
    large runs into the scheduler's filter timeout)."""

    def __init__(self, budget: int) -> None:
        super().__init__(f"the allocator search exceeded its budget of {budget:,} allocateOne calls")
        self.budget = budget


class _MaxSizeExceeded(Exception):
    """errAllocationResultMaxSizeExceeded: internal backtracking signal."""


# --- pools -----------------------------------------------------------------------------------------

@dataclass
class _Device:
    id: DeviceId
    api: Mapping[str, Any]
    pool: _Pool
    index: int = -1  # position among the Simulator's devices (the search's per-device state is indexed by it)

    @cached_property
    def cel(self) -> CelDevice:
        return CelDevice.from_api(self.id.driver, self.api, self.id.pool)

    @cached_property
    def consumption(self) -> Consumption:
        return _consumption(self.api)

    def attribute(self, qualified: str) -> tuple[Any, ...] | None:
        """lookupAttribute: the fully qualified name, or the bare name when the domain is the driver."""
        attrs: Mapping[str, Mapping[str, Any]] = self.api.get("attributes") or {}
        value = attrs.get(qualified)
        if value is None:
            domain, sep, name = qualified.partition("/")
            if not sep or domain != self.id.driver:
                return None
            value = attrs.get(name)
        if value is None:
            return None
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return (kind, value[kind])
        return ("unknown",)  # an unknown value type never matches


@dataclass
class _Pool:
    driver: str
    name: str
    generation: int
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    devices: list[_Device] = field(default_factory=list)
    incomplete: bool = False
    invalid: bool = False
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)  # sharedCounters, by set name


Consumption = dict[tuple[str, str], Fraction]  # (counter set, counter) -> amount


def _consumption(device: Mapping[str, Any]) -> Consumption:
    out: Consumption = {}
    for c in device.get("consumesCounters") or ():
        for name, counter in (c.get("counters") or {}).items():
            key = (c["counterSet"], name)
            out[key] = out.get(key, Fraction(0)) + Quantity.parse(str(counter["value"])).value
    return out


def _node_matches(node_name: str, labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    """A v1 NodeSelector: terms are ORed, the requirements of a term ANDed."""
    for term in selector.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue  # an empty term matches nothing
        if all(_requirement(labels, r) for r in exprs) and \
                all(_requirement({"metadata.name": node_name}, r) for r in fields):
            return True
    return False


def _requirement(values: Mapping[str, str], req: Mapping[str, Any]) -> bool:
    key, op, wanted = req["key"], req["operator"], list(req.get("values") or [])
    present = key in values
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if op == "Gt" else have < limit
    return {"In": present and values.get(key) in wanted, "NotIn": not present or values.get(key) not in wanted,
            "Exists": present, "DoesNotExist": not present}.get(op, False)


def _for_node(spec: Mapping[str, Any], node_name: str, labels: Mapping[str, str], partitionable: bool) -> bool:
    if spec.get("perDeviceNodeSelection") is not None:
        return False  # per-device node selection is not modelled
    if spec.get("sharedCounters"):
        return partitionable  # counter sets are needed to use a pool, whatever node they name
    if spec.get("nodeName"):
        return bool(spec["nodeName"] == node_name)
    if spec.get("allNodes"):
        return True
    return spec.get("nodeSelector") is not None and _node_matches(node_name, labels, spec["nodeSelector"])


def gather_pools(slices: Iterable[Mapping[str, Any]], node_name: str, node_labels: Mapping[str, str],
                 partitionable: bool = True) -> list[_Pool]:
    labels = {"kubernetes.io/hostname": node_name, **node_labels}
    pools: dict[tuple[str, str], _Pool] = {}
    for s in slices:
        spec = s["spec"]
        if not _for_node(spec, node_name, labels, partitionable):
            continue
        key = (spec["driver"], spec["pool"]["name"])
        generation = int(spec["pool"].get("generation", 0))
        pool = pools.get(key)
        if pool is None:
            pool = pools[key] = _Pool(key[0], key[1], generation)
        elif generation < pool.generation:
            continue
        elif generation > pool.generation:
            pool.slices, pool.generation = [], generation
        pool.slices.append(s)
    for pool in pools.values():
        _fill_pool(pool, partitionable)
    return list(pools.values())


def _fill_pool(pool: _Pool, partitionable: bool) -> None:
    """A pool's devices and counter sets from its slices, and whether it is incomplete or invalid."""
    pool.incomplete = len(pool.slices) != int(pool.slices[0]["spec"]["pool"].get("resourceSliceCount", 1))
    pool.slices.sort(key=lambda x: str((x.get("metadata") or {}).get("name", "")))  # 1.36 visits them by name
    seen: set[str] = set()
    for s in pool.slices:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] in pool.counter_sets:
                pool.invalid = True  # duplicate counter set name
            pool.counter_sets[cs["name"]] = {
                n: Quantity.parse(str(c["value"])).value for n, c in (cs.get("counters") or {}).items()}
        for d in s["spec"].get("devices") or []:
            if d["name"] in seen:
                pool.invalid = True
            seen.add(d["name"])
            pool.devices.append(_Device(DeviceId(pool.driver, pool.name, d["name"]), d, pool))
    for device in pool.devices if partitionable else ():  # each consumption names a counter of the pool
        for (set_name, counter) in _consumption(device.api):
            if counter not in pool.counter_sets.get(set_name, {}):
                pool.invalid = True


# --- requests ----------------------------------------------------------------------------------------

# A device of a request's search loop, and whether its selection must be evaluated on reaching it (its
# selectors failed: the error is raised there, naming the claim that reaches it, as Kubernetes does).
_LoopEntry = tuple[_Device, bool]


@dataclass
class _Request:
    claim: int
    index: int
    sub: int
    name: str  # base request name
    sub_name: str | None
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool
    tolerations: tuple[Mapping[str, Any], ...] = ()
    num: int = 0
    all_devices: list[_Device] = field(default_factory=list)
    applicable: list[_MatchAttribute] = field(default_factory=list)  # the claim's constraints over this request
    loop: list[_LoopEntry] | None = None  # Simulator.loop, once the search reaches the request

    @property
    def full_name(self) -> str:
        return self.name if self.sub_name is None else f"{self.name}/{self.sub_name}"

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.claim, self.index, self.sub)


@dataclass
class _MatchAttribute:
    requests: frozenset[str]
    attribute: str
    values: Sequence[tuple[Any, ...] | None]  # the attribute of every device, by _Device.index
    value: tuple[Any, ...] | None = None
    num: int = 0

    def applies(self, base: str, sub: str | None) -> bool:
        if not self.requests:
            return True
        return base in self.requests or (sub is not None and f"{base}/{sub}" in self.requests)

    def add(self, device: _Device) -> bool:
        """For a request it applies to (_Request.applicable)."""
        value = self.values[device.index]
        if value is None:
            return False
        if self.num == 0:
            self.value, self.num = value, 1
            return True
        if value[0] == "unknown" or value != self.value:
            return False
        self.num += 1
        return True


def _claim_label(claim: Mapping[str, Any], index: int) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or f'claim-{index}'}"


# --- the search --------------------------------------------------------------------------------------

class Simulator:
    """One node's pools and the device classes; allocates claims against an allocated set."""

    def __init__(self, slices: Sequence[Mapping[str, Any]], device_classes: Sequence[Mapping[str, Any]],
                 node_name: str, node_labels: Mapping[str, str] | None = None, cel: CelEnvironment | None = None,
                 prune: bool = True, device_taints: bool = True, partitionable: bool = True,
                 budget: int | None = None) -> None:
        self.pools = gather_pools(slices, node_name, node_labels or {}, partitionable)
        self.devices = [d for pool in self.pools for d in pool.devices]
        for i, device in enumerate(self.devices):
            device.index = i
        # the devices an ExactCount search visits, in its order (incomplete and invalid pools give none)
        self.searched = [d for pool in self.pools if not (pool.invalid or pool.incomplete) for d in pool.devices]
        self.partitionable = partitionable  # DRAPartitionableDevices (1.36+): else counters are ignored
        self.prune = prune  # False: visit every subtree as the Go search does (tests, baselines, search sizes)
        self.device_taints = device_taints  # DRADeviceTaints (1.36+)
        # allocateOne calls one allocation may make (SearchBudgetExceeded beyond); None: unbounded
        self.budget = budget
        self.classes = {c["metadata"]["name"]: c for c in device_classes}
        self.cel = cel or CelEnvironment()
        # Selection does not depend on what is allocated, so it is cached per (claim spec, request, device),
        # and so are the search loops built from it and the constraint attributes per device.
        self._selectable: dict[tuple[str, tuple[int, int, int], DeviceId], bool | AllocationError] = {}
        self._loops: dict[tuple[str, tuple[int, int, int]], list[_LoopEntry]] = {}
        self._attributes: dict[str, list[tuple[Any, ...] | None]] = {}

    def allocate(self, claims: Sequence[Mapping[str, Any]], allocated: Iterable[DeviceId] = ()
                 ) -> tuple[tuple[DeviceResult, ...], ...] | None:
        """The allocation of every claim, or None when the node cannot satisfy them; AllocationError
        where Kubernetes' allocator returns an error."""
        return _Search(self, claims, set(allocated)).run()

    def selectable(self, spec_key: str, req: _Request, claim_label: str, device: _Device) -> bool:
        key = (spec_key, req.key, device.id)
        cached = self._selectable.get(key)
        if cached is None:
            cached = self._selectable[key] = self._try_select(req, claim_label, device)
        if isinstance(cached, AllocationError):
            raise cached
        return cached

    def loop(self, spec_key: str, req: _Request, claim_label: str) -> list[_LoopEntry]:
        """The devices an ExactCount request's search tries, in order: the selectable ones it may take (not
        tainted against it, no counters without partitionable devices), and those whose selectors fail.
        A failure found here is not cached: the claim that reaches the device evaluates it again."""
        key = (spec_key, req.key)
        loop = self._loops.get(key)
        if loop is None:
            loop = []
            for device in self.searched:
                cached = self._selectable.get((spec_key, req.key, device.id))
                if cached is None:
                    cached = self._try_select(req, claim_label, device)
                    if not isinstance(cached, AllocationError):
                        self._selectable[(spec_key, req.key, device.id)] = cached
                if isinstance(cached, AllocationError):
                    loop.append((device, True))
                elif cached and not self.tainted(req, device) and (self.partitionable or not device.consumption):
                    loop.append((device, False))
            self._loops[key] = loop
        return loop

    def attribute_values(self, qualified: str) -> list[tuple[Any, ...] | None]:
        values = self._attributes.get(qualified)
        if values is None:
            values = self._attributes[qualified] = [d.attribute(qualified) for d in self.devices]
        return values

    def tainted(self, req: _Request, device: _Device) -> bool:
        return self.device_taints and bool(device.api.get("taints")) and \
            taint_prevents_allocation(device.api, req.tolerations)

    def _try_select(self, req: _Request, claim_label: str, device: _Device) -> bool | AllocationError:
        try:
            return self._select(req, claim_label, device)
        except AllocationError as e:
            return e

    def _select(self, req: _Request, claim_label: str, device: _Device) -> bool:
        if device.api.get("bindingConditions"):
            return False  # DRADeviceBindingConditions (alpha) is off
        cls = self.classes.get(req.class_name)
        if cls is not None:
            class_selectors = [(s.get("cel") or {}).get("expression")
                               for s in (cls.get("spec") or {}).get("selectors") or []]
            if not self._all_match(class_selectors, f"class {req.class_name}", device):
                return False
        return self._all_match(req.selectors, f"claim {claim_label}", device)

    def _all_match(self, expressions: Sequence[str | None], owner: str, device: _Device) -> bool:
        for i, expr in enumerate(expressions):
            if expr is None:
                raise AllocationError(f"{owner}, selector #{i}: CEL expression empty (unsupported selector type?)")
            try:
                compiled = self.cel.compile(expr)
            except CelCompileError as e:
                raise AllocationError(f"{owner}: selector #{i}: CEL compile error: {e.message}") from e
            try:
                if not self.cel.evaluate(compiled, device.cel):
                    return False
            except CelEvaluationError as e:
                raise AllocationError(f"{owner}: selector #{i} on device {device.id}: CEL runtime error: "
                                      f"{e.message}") from e
        return True


class _Search:
    def __init__(self, sim: Simulator, claims: Sequence[Mapping[str, Any]], allocated: set[DeviceId]) -> None:
        self.sim = sim
        self.claims = claims
        self.labels = [_claim_label(c, i) for i, c in enumerate(claims)]
        # Claims with the same spec share selection results (count mode allocates copies).
        self.spec_keys = [json.dumps(c.get("spec"), sort_keys=True) for c in claims]
        self.allocated = allocated
        # Per device (by _Device.index): allocated before, and held by how many claims of this allocation;
        # per claim: the devices it holds.
        self.taken = [d.id in allocated for d in sim.devices]
        self.holders = [0] * len(sim.devices)
        self.held: list[set[int]] = [set() for _ in claims]
        self.requests: dict[tuple[int, int, int], _Request] = {}
        # claim -> request -> its subrequests (firstAvailable) or itself; and which requests are firstAvailable
        self.table: list[list[list[_Request]]] = [[] for _ in claims]
        self.first_available: list[list[bool]] = [[] for _ in claims]
        self.constraints: list[list[_MatchAttribute]] = []
        self.results: list[list[tuple[_Request, _Device]]] = [[] for _ in claims]
        self.failed: dict[tuple[Any, ...], bool] = {}  # failed subtree state -> raised max-size (else False)
        # per claim, per request: the devices whose state the rest of the search can see (_relevance)
        self.relevant: list[list[frozenset[int]]] = []
        self.admin: list[bool] = []  # per claim: whether a request has adminAccess
        # per pool: counters left after the allocated devices, and consumed by the devices being allocated
        self.available: dict[tuple[str, str], Consumption] = {}
        self.consuming: dict[tuple[str, str], Consumption] = {}
        # per request: devices that are selectable, or whose selectors error (selection is static)
        self.candidates: dict[tuple[int, int, int], list[tuple[_Device, AllocationError | None]]] = {}
        self.calls = 0  # allocateOne calls
        self.memo_peak = 0
        self.budget = sys.maxsize if sim.budget is None else sim.budget

    def run(self) -> tuple[tuple[DeviceResult, ...], ...] | None:
        self._prepare()
        try:
            done = self._allocate_one(0, 0, 0, 0, False)
        except _MaxSizeExceeded:
            raise AllocationError("allocation max size exceeded") from None
        if not done:
            if any(p.invalid for p in self.sim.pools):
                raise AllocationError("invalid resource pools were encountered")
            return None
        return tuple(tuple(DeviceResult(req.full_name, d.id.driver, d.id.pool, d.id.device, req.admin)
                           for req, d in devs) for devs in self.results)

    # requests and constraints, checked up front as Kubernetes does

    def _prepare(self) -> None:
        for ci, claim in enumerate(self.claims):
            devices = (claim.get("spec") or {}).get("devices") or {}
            min_devices = 0
            for ri, request in enumerate(devices.get("requests") or []):
                subs = request.get("firstAvailable") or []
                if subs:
                    self.first_available[ci].append(True)
                    options = []
                    least = None
                    for si, sub in enumerate(subs):
                        req = self._request(ci, ri, si, request["name"], sub["name"], sub, admin=False)
                        options.append(req)
                        least = req.num if least is None else min(least, req.num)
                    self.table[ci].append(options)
                    min_devices += least or 0
                else:
                    exactly = request.get("exactly")
                    if exactly is None:
                        raise AllocationError(f"claim {self.labels[ci]}, request {request['name']}: missing device "
                                              "class name (unsupported request type?)")
                    req = self._request(ci, ri, 0, request["name"], None, exactly,
                                        admin=bool(exactly.get("adminAccess")))
                    self.first_available[ci].append(False)
                    self.table[ci].append([req])
                    min_devices += req.num
            if min_devices > MAX_DEVICES_PER_CLAIM:
                raise AllocationError(f"claim {self.labels[ci]}: number of requested devices {min_devices} exceeds "
                                      f"the claim limit of {MAX_DEVICES_PER_CLAIM}")
            constraints = []
            for i, c in enumerate(devices.get("constraints") or []):
                if not c.get("matchAttribute"):
                    raise AllocationError(f"claim {self.labels[ci]}, constraint #{i}: empty constraint "
                                          "(unsupported constraint type?)")
                constraints.append(_MatchAttribute(frozenset(c.get("requests") or []), c["matchAttribute"],
                                                   self.sim.attribute_values(c["matchAttribute"])))
            self.constraints.append(constraints)
        for req in self.requests.values():
            req.applicable = [c for c in self.constraints[req.claim] if c.applies(req.name, req.sub_name)]
        if self.sim.prune:
            self._relevance()

    def _relevance(self) -> None:
        """The devices a failed subtree's outcome can depend on, for the memo's key: from request `ri` of claim `ci`
        on, those of the remaining requests' loops, their `All` devices, and whatever shares a counter set with
        them. Other devices are left out of the key, so subtrees differing only in them are one failure."""
        sharing: dict[tuple[str, str, str], set[int]] = {}
        for d in self.sim.devices:
            for counter_set, _ in d.consumption:
                sharing.setdefault((d.pool.driver, d.pool.name, counter_set), set()).add(d.index)

        def devices_of(req: _Request) -> set[int]:
            if req.loop is None:
                req.loop = self.sim.loop(self.spec_keys[req.claim], req, self.labels[req.claim])
            found = {d.index for d, _ in req.loop} | {d.index for d in req.all_devices}
            found |= {d.index for d, _ in self._candidates(req)}
            for i in list(found):
                d = self.sim.devices[i]
                for counter_set, _ in d.consumption:
                    found |= sharing[(d.pool.driver, d.pool.name, counter_set)]
            return found

        later: set[int] = set()
        per_claim: list[list[frozenset[int]]] = []
        for ci in reversed(range(len(self.claims))):
            suffix: list[frozenset[int]] = []
            for options in reversed(self.table[ci]):
                for req in options:
                    later |= devices_of(req)
                suffix.append(frozenset(later))
            suffix.reverse()
            suffix.append(frozenset(later))  # past the claim's last request: the later claims'
            per_claim.append(suffix)
        per_claim.reverse()
        self.relevant = per_claim
        self.admin = [any(r.admin for options in self.table[ci] for r in options) for ci in range(len(self.claims))]

    def _request(self, ci: int, ri: int, si: int, name: str, sub_name: str | None, spec: Mapping[str, Any],
                 admin: bool) -> _Request:
        label = f"claim {self.labels[ci]}, request {name if sub_name is None else f'{name}/{sub_name}'}"
        selectors = []
        for i, s in enumerate(spec.get("selectors") or []):
            expr = (s.get("cel") or {}).get("expression")
            if expr is None:
                raise AllocationError(f"{label}, selector #{i}: CEL expression empty (unsupported selector type?)")
            selectors.append(expr)
        class_name = spec.get("deviceClassName") or ""
        if not class_name:
            raise AllocationError(f"{label}: missing device class name (unsupported request type?)")
        if class_name not in self.sim.classes:
            raise AllocationError(f"{label}: could not retrieve device class {class_name}: "
                                  f'deviceclasses.resource.k8s.io "{class_name}" not found')
        mode = spec.get("allocationMode") or "ExactCount"
        req = _Request(ci, ri, si, name, sub_name, class_name, selectors, mode, int(spec.get("count", 1)), admin,
                       tuple(spec.get("tolerations") or ()))
        self.requests[req.key] = req
        if mode == "ExactCount":
            req.num = req.count
        elif mode == "All":
            for pool in self.sim.pools:
                if pool.incomplete:
                    raise AllocationError(f"{label}: asks for all devices, but resource pool {pool.driver}/{pool.name}"
                                          " is currently being updated")
                if pool.invalid:
                    raise AllocationError(f"{label}: asks for all devices, but resource pool {pool.driver}/{pool.name}"
                                          " is currently invalid")
                for device in pool.devices:
                    if self._selectable(req, device):
                        req.all_devices.append(device)
            req.num = len(req.all_devices)
        else:
            raise AllocationError(f"{label}: unsupported count mode {mode}")
        return req

    def _selectable(self, req: _Request, device: _Device) -> bool:
        return self.sim.selectable(self.spec_keys[req.claim], req, self.labels[req.claim], device)

    # the depth-first search (allocateOne)

    def _allocate_one(self, ci: int, ri: int, si: int, di: int, in_subrequest: bool) -> bool:
        """allocateOne, remembering subtrees that failed: a subtree's outcome depends only on which
        devices are taken (not in which order) and on the claim's constraint state, so a state that
        failed once fails again, and the Go search's re-visits of it (one per ordering) are skipped."""
        self.calls += 1
        if self.calls > self.budget:
            raise SearchBudgetExceeded(self.budget)
        if ci >= len(self.claims) or not self.sim.prune:
            return self._allocate_one_search(ci, ri, si, di, in_subrequest)
        # Which relevant devices are held (2d+1: by this claim, whose admin requests skip only its own), how many
        # devices the claim has (the 32-device limit) and its constraints' state.
        relevant = self.relevant[ci][ri]
        held = 0
        own = self.admin[ci]  # only a claim with adminAccess requests tells its own devices from others'
        for c, devices in enumerate(self.held):
            for d in devices:
                if d in relevant:
                    held |= 1 << (2 * d + (own and c == ci))
        key = (ci, ri, si, di, in_subrequest, len(self.results[ci]), held,
               tuple((c.value if c.num else None, c.num) for c in self.constraints[ci]))
        known = self.failed.get(key)
        if known is not None:
            if known:
                raise _MaxSizeExceeded
            return False
        try:
            done = self._allocate_one_search(ci, ri, si, di, in_subrequest)
        except _MaxSizeExceeded:
            self._remember(key, True)
            raise
        if not done:
            self._remember(key, False)
        return done

    def _remember(self, key: tuple[Any, ...], max_size: bool) -> None:
        """Memo a failed subtree, forgetting every entry when MEMO_LIMIT is reached: the memo only skips
        re-visits, so forgetting costs time, never an answer, and its memory stays bounded."""
        if len(self.failed) >= MEMO_LIMIT:
            self.failed.clear()
        self.failed[key] = max_size
        self.memo_peak = max(self.memo_peak, len(self.failed))

    def _allocate_one_search(self, ci: int, ri: int, si: int, di: int, in_subrequest: bool) -> bool:
        if ci >= len(self.claims):
            return True
        requests = self.table[ci]
        if ri >= len(requests):
            try:
                return self._allocate_one(ci + 1, 0, 0, 0, False)
            except _MaxSizeExceeded:
                return False
        options = requests[ri]
        if not in_subrequest and self.first_available[ci][ri]:
            return self._first_available(ci, ri, len(options))
        req = options[si]
        if req.mode == "All" and not req.all_devices:
            return False
        if di >= req.num:
            return self._allocate_one(ci, ri + 1, 0, 0, False)
        if len(self.results[ci]) + req.num - di > MAX_DEVICES_PER_CLAIM:
            raise _MaxSizeExceeded
        if req.mode == "All":
            device = req.all_devices[di]
            if not self._allocate_device(req, device, must=True):
                return False
            return self._descend(req, device, ci, ri, si, di, in_subrequest)
        if self.sim.prune and not self._enough_candidates(req, req.num - di):
            return False
        return self._exact_count(req, ci, ri, si, di, in_subrequest)

    def _first_available(self, ci: int, ri: int, subs: int) -> bool:
        """Each subrequest in order; _MaxSizeExceeded when every one of them exceeds the claim's size."""
        all_exceeded = True
        for sub in range(subs):
            try:
                done = self._allocate_one(ci, ri, sub, 0, True)
            except _MaxSizeExceeded:
                continue
            all_exceeded = False
            if done:
                return True
        if all_exceeded:
            raise _MaxSizeExceeded
        return False

    def _exact_count(self, req: _Request, ci: int, ri: int, si: int, di: int, in_subrequest: bool) -> bool:
        """Device slot `di` of an ExactCount request: each device of its loop that can be taken, in order."""
        # The hot loop, _allocate_device inlined: selection and taints are settled by the loop list; the
        # constraints are checked before the counters (a refusal has no effect, so the order cannot matter).
        if req.loop is None:
            req.loop = self.sim.loop(self.spec_keys[ci], req, self.labels[ci])
        held, taken, holders, admin, results = self.held[ci], self.taken, self.holders, req.admin, self.results[ci]
        constraints = req.applicable
        for device, evaluate in req.loop:
            i = device.index
            if (i in held) if admin else (taken[i] or holders[i]):
                continue
            if evaluate and not self._selectable(req, device):  # raises the selector's error
                continue
            added = 0
            for constraint in constraints:
                if not constraint.add(device):
                    break
                added += 1
            if added < len(constraints):
                for constraint in constraints[:added]:
                    constraint.num -= 1
                continue
            if device.consumption and not self._take_counters(device):
                for constraint in constraints:
                    constraint.num -= 1
                continue
            holders[i] += 1
            held.add(i)
            results.append((req, device))
            if self._descend(req, device, ci, ri, si, di, in_subrequest):
                return True
        return False

    def _descend(self, req: _Request, device: _Device, ci: int, ri: int, si: int, di: int,
                 in_subrequest: bool) -> bool:
        try:
            done = self._allocate_one(ci, ri, si, di + 1, in_subrequest)
        except BaseException:
            self._deallocate_device(req, device)
            raise
        if not done:
            self._deallocate_device(req, device)
        return done

    def _busy(self, req: _Request, device: _Device) -> bool:
        if req.admin:
            return device.index in self.held[req.claim]
        return self.taken[device.index] or self.holders[device.index] > 0

    def _allocate_device(self, req: _Request, device: _Device, must: bool) -> bool:
        """allocateDevice: availability, then constraints; False when the device cannot be taken."""
        if self._busy(req, device):
            return False
        if device.consumption and not self._take_counters(device):
            return False
        if self.sim.tainted(req, device):
            self._release_counters(device)
            return False
        constraints = req.applicable
        for i, constraint in enumerate(constraints):
            if not constraint.add(device):
                self._release_counters(device)
                if must:
                    raise AllocationError(f"claim {self.labels[req.claim]}, request {req.name}: cannot add device "
                                          f"{device.id} because a claim constraint would not be satisfied")
                for earlier in constraints[:i]:
                    earlier.num -= 1
                return False
        self.holders[device.index] += 1
        self.held[req.claim].add(device.index)
        self.results[req.claim].append((req, device))
        return True

    def _deallocate_device(self, req: _Request, device: _Device) -> None:
        for constraint in req.applicable:
            constraint.num -= 1
        self.holders[device.index] -= 1
        self.held[req.claim].discard(device.index)
        self.results[req.claim].pop()
        self._release_counters(device)

    def _take_counters(self, device: _Device) -> bool:
        """checkAvailableCounters: reserve the device's counters, or False when some counter of its pool would go
        below zero."""
        if not self.sim.partitionable:
            return False  # a device that consumes counters is never allocated without the feature
        pool = device.pool
        key = (pool.driver, pool.name)
        available = self.available.get(key)
        if available is None:
            available = {(s, n): v for s, counters in pool.counter_sets.items() for n, v in counters.items()}
            for other in pool.devices:  # the allocated devices' consumption (fixed during this allocation)
                if self.taken[other.index]:
                    for k, v in other.consumption.items():
                        if k in available:
                            available[k] -= v
            self.available[key] = available
        consuming = self.consuming.setdefault(key, {})
        for k, v in device.consumption.items():
            consuming[k] = consuming.get(k, Fraction(0)) + v
        if any(left < consuming.get(k, 0) for k, left in available.items()):
            self._release_counters(device)
            return False
        return True

    def _release_counters(self, device: _Device) -> None:
        if device.consumption:
            consuming = self.consuming[(device.pool.driver, device.pool.name)]
            for k, v in device.consumption.items():
                consuming[k] -= v

    def _enough_candidates(self, req: _Request, needed: int) -> bool:
        """Whether enough devices remain for this request's remaining slots (a sound cut of the search).

        When too few remain and a free device's selector errors, the Go search would reach that device
        while failing through this subtree and return its error, so that error is raised here."""
        candidates: list[_Device] = []
        first_error: AllocationError | None = None
        for device, error in self._candidates(req):
            if self._busy(req, device):
                continue
            if error is not None:
                first_error = first_error or error
            elif not self.sim.tainted(req, device):
                candidates.append(device)
        compatible = [d for d in candidates if all(self._compatible(c, d) for c in req.applicable)]
        enough = len(compatible) >= needed
        for c in req.applicable:
            if enough and c.num == 0:
                groups = Counter(c.values[d.index] for d in compatible)
                enough = max(groups.values(), default=0) >= needed
        if not enough and first_error is not None:
            raise first_error
        return enough

    def _candidates(self, req: _Request) -> list[tuple[_Device, AllocationError | None]]:
        found = self.candidates.get(req.key)
        if found is None:
            found = []
            for device in self.sim.searched:
                try:
                    if self._selectable(req, device):
                        found.append((device, None))
                except AllocationError as e:
                    found.append((device, e))
            self.candidates[req.key] = found
        return found

    @staticmethod
    def _compatible(c: _MatchAttribute, device: _Device) -> bool:
        value = c.values[device.index]
        if value is None or value[0] == "unknown":
            return False
        return c.num == 0 or value == c.value

def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """resourceclaim.ToleratesTaint: effect and key match when set; Equal (the default) compares values."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return bool(operator == "Exists")


def taint_prevents_allocation(device: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a NoSchedule/NoExecute taint of the device is not tolerated (other effects never prevent it)."""
    tolerations = tuple(tolerations)
    return any(t.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(tol, t) for tol in tolerations)
               for t in device.get("taints") or ())


def simulate(slices: Sequence[Mapping[str, Any]], device_classes: Sequence[Mapping[str, Any]],
             claims: Sequence[Mapping[str, Any]], *, node_name: str, node_labels: Mapping[str, str] | None = None,
             allocated: Iterable[DeviceId] = (), mode: Mode = "fit-one", cel: CelEnvironment | None = None,
             simulator: Simulator | None = None) -> SimulationResult:
    """Run the allocator on one node. Inputs and outputs as in the Go comparison program.
    SearchBudgetExceeded when an allocation passes the simulator's budget."""
    if not claims:
        raise ValueError("simulate needs at least one claim")
    sim = simulator or Simulator(slices, device_classes, node_name, node_labels, cel)
    taken = set(allocated)
    searches: list[int] = []
    peaks: list[int] = []

    def allocate(claims: Sequence[Mapping[str, Any]]) -> tuple[tuple[DeviceResult, ...], ...] | None:
        search = _Search(sim, claims, taken)
        try:
            return search.run()
        finally:
            searches.append(search.calls)
            peaks.append(search.memo_peak)

    if mode == "fit-one":
        try:
            result = allocate(claims)
        except AllocationError as e:
            return SimulationResult(False, 0, (), str(e), tuple(searches), tuple(peaks))
        fits = result is not None
        return SimulationResult(fits, int(fits), result or (), searches=tuple(searches), memo_peaks=tuple(peaks))
    if mode != "count":
        raise ValueError(f"mode {mode!r} is not allowed; allowed: fit-one, count")
    rounds: list[tuple[DeviceResult, ...]] = []
    error = None
    base = claims[0]
    meta = base.get("metadata") or {}
    while len(rounds) < COUNT_CAP:
        copy = {**base, "metadata": {**meta, "name": f"{meta.get('name') or 'claim-0'}-{len(rounds)}"}}
        try:
            result = allocate([copy])
        except AllocationError as e:
            error = str(e)
            break
        if result is None:
            break
        rounds.append(result[0])
        taken.update(d.id for d in result[0] if not d.admin_access)
    return SimulationResult(bool(rounds), len(rounds), tuple(rounds), error, tuple(searches), tuple(peaks))
