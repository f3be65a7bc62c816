"""Seeded cases for the differential test of the allocator simulation against kube-scheduler's allocator.

A case is claims x an emulated node of a catalog instance type (its Neuron slice + EFA slice, the
DeviceClasses) x devices already allocated on it. Both allocators run every case in both modes:
"fit-one" (all claims together: satisfiable or not) and "count" (copies of the first claim, one after
another: how many fit). Categories:

- `typed`: one `Neuron(...)` request from the typed classes (counts, instance types, families, Connected /
  RingSegment groups on devicegroup or topology ids, LNC, kernel driver version, HBM and core minimums);
- `raw`: hand-made ExactCount 1..17 requests with selectors on instanceType, family, deviceId, the
  `cores` and `memory` capacities (quantity), the standard NUMA node, the `draDriverVersion` semver and
  matchAttribute on devicegroup{4,8,16}_id / topology{N}_id (any N, so also groups the host lacks);
- `all`: allocationMode All, with selectors and with constraints that hold or break;
- `efa`: Neuron + EFA requests, aligned on a devicegroup or not, and EFA alone;
- `first-available`: firstAvailable with 2-3 subrequests (typed and hand-made, constraints on subrequests);
- `multi-claim`: 2-3 claims allocated together (fit-one) - count mode counts copies of the first;
- `ultraserver`: the trn2u UltraServer pseudo-device with and without the node's devices;
- `unsatisfiable`: claims made not to fit (17 devices, other instance types, groups larger than the host's,
  EFA on hosts without, selectors nothing passes);
- `cel-error`: selectors without the resourceType guard or reading attributes some devices lack, which
  fail at runtime on some devices (Kubernetes then aborts the allocation with an error);
- `examples`: every example template of `neuron_dra.claim_templates.examples` on every node;
- `pools`: the node's slices split into two slices of one pool, with a slice missing (incomplete
  pool), with a stale older generation alongside, and with a duplicated device name (invalid pool).

Already allocated devices: none, random fractions, k random Neuron devices, and structured sets (one device
per torus row or ring segment, whole rows, every other device, half or all of the EFAs, all but one).

Go's search is a plain depth-first search without any counting shortcut, so a case whose search is large
(a 16-device claim on a node with 15 free devices, a claim whose last request fails after many orderings
of the first) runs into the scheduler's 10 s filter timeout. Such cases are left out by design:
`SearchEstimator` runs the product's simulator (`neuron_dra.claim_templates.allocator`) with its cut and
memo off, which makes Go's allocateOne calls in Go's order, counts them, and the generator drops a case
whose count passes the budget; how many were dropped is reported per category. The count is only a cost
bound, never an answer the test compares with.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.claim_templates import (
    ALL,
    AnyTopology,
    AtLeast,
    ClaimTemplate,
    Connected,
    Efa,
    FirstAvailable,
    GroupAttribute,
    Neuron,
    RingSegment,
    TemplateError,
    UltraServerNode,
)
from neuron_dra.claim_templates.allocator import DeviceId, Mode, SearchBudgetExceeded, Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.examples import OFFICIAL_SAMPLES, RICHER_CASES
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from neuron_dra.driver.model.catalog import CATALOG, FAMILIES, TopologyKind

NEURON_DRIVER = "neuron.aws.com"
NEURON_CLASS = "neuron.aws.com"
EFA_DRIVER = "dra.net"
EFA_CLASS = "efa.networking.k8s.aws"
AWS = "resource.aws.com"
A = f"device.attributes['{NEURON_DRIVER}']"
CAP = f"device.capacity['{NEURON_DRIVER}']"
K8S = "device.attributes['resource.kubernetes.io']"
GUARD = f"{A}.resourceType == 'neuron_device'"
MODES: tuple[Mode, ...] = ("fit-one", "count")
# allocateOne calls per allocation. Go makes about 170 000 a second here (each scans every device of the node),
# so a case stays near 0.1 s, far from the 10 s filter timeout.
DEFAULT_BUDGET = 10_000

CATEGORY_WEIGHTS: Mapping[str, int] = {
    "typed": 16, "raw": 18, "all": 7, "efa": 12, "first-available": 10, "multi-claim": 9, "ultraserver": 4,
    "unsatisfiable": 8, "cel-error": 5, "pools": 5,
}  # plus `examples`: every example on every node with three allocated sets


@dataclass(frozen=True)
class Case:
    """Claims on one node with some devices already allocated."""

    id: str
    category: str
    instance_type: str
    claims: tuple[dict[str, Any], ...]  # ResourceClaims: metadata + spec
    allocated: tuple[DeviceId, ...]
    allocated_label: str  # how `allocated` was chosen
    slices: tuple[dict[str, Any], ...] | None = None  # None: the node model's slices
    note: str = ""  # what makes the case special, for the report

    def node_slices(self, node: NodeModel) -> tuple[dict[str, Any], ...]:
        return self.slices if self.slices is not None else node.slices

    def go_input(self, node: NodeModel, mode: Mode) -> dict[str, Any]:
        """The case as `tests/support/allocsim.py` runs it."""
        return {"id": f"{self.id}/{mode}", "slices": list(self.node_slices(node)),
                "deviceClasses": list(node.device_classes),
                "claims": [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **c} for c in self.claims],
                "allocated": [{"driver": d.driver, "pool": d.pool, "device": d.device} for d in self.allocated],
                "nodeName": node.node_name, "nodeLabels": node_labels(node), "mode": mode}

    def describe(self) -> str:
        """One compact line per claim: requests, selectors (abbreviated), constraints; then the allocated set."""
        lines = [f"{self.id} [{self.category}] on {self.instance_type}{' (' + self.note + ')' if self.note else ''}",
                 f"  allocated ({self.allocated_label}): "
                 f"{','.join(d.device.removeprefix('neuron-device-') for d in self.allocated) or '-'}"]
        for claim in self.claims:
            lines.append(f"  claim {claim['metadata']['name']}: {describe_spec(claim['spec'])}")
        return "\n".join(lines)


def node_labels(node: NodeModel) -> dict[str, str]:
    """Labels of an EKS Neuron node (slices name the node, so only for completeness)."""
    return {"node.kubernetes.io/instance-type": node.instance_type,
            "eks.amazonaws.com/compute-type": "ec2"}


def _short(expr: str) -> str:
    return expr.replace(A, "A").replace(CAP, "CAP")


def _describe_request(body: Mapping[str, Any]) -> str:
    mode = body.get("allocationMode") or "ExactCount"
    count = "All" if mode == "All" else str(body.get("count", 1))
    cls = "efa" if body.get("deviceClassName") == EFA_CLASS else "neuron"
    sels = [_short(s["cel"]["expression"]) for s in body.get("selectors") or [] if s["cel"]["expression"] != GUARD]
    guard = "" if any(s["cel"]["expression"] == GUARD for s in body.get("selectors") or []) else " unguarded"
    admin = " adminAccess" if body.get("adminAccess") else ""
    return f"{count} {cls}{guard}{admin}" + (f" [{'; '.join(sels)}]" if sels else "")


def describe_spec(spec: Mapping[str, Any]) -> str:
    devices = spec["devices"]
    parts = []
    for r in devices["requests"]:
        if "firstAvailable" in r:
            subs = " | ".join(f"{s['name']}: {_describe_request(s)}" for s in r["firstAvailable"])
            parts.append(f"{r['name']}=firstAvailable({subs})")
        else:
            parts.append(f"{r['name']}={_describe_request(r['exactly'])}")
    for c in devices.get("constraints") or []:
        parts.append(f"match {c['matchAttribute'].split('/')[-1]} over {','.join(c.get('requests') or ['*'])}")
    return "; ".join(parts)


# --- Go's search size -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SearchEstimate:
    """Go's search size on a case (allocateOne calls): the largest single allocation and the sum over both modes."""

    largest: int
    total: int


class SearchEstimator:
    """Go's search size on cases of catalog nodes: the product's simulator without its cut and memo
    (prune=False visits every subtree as Go does), counting allocateOne calls up to a budget per allocation.
    One simulator per node serves all its cases (selection is cached per claim spec)."""

    def __init__(self, catalog: NodeCatalog, cel: CelEnvironment, budget: int = DEFAULT_BUDGET) -> None:
        self.catalog = catalog
        self.cel = cel
        self.budget = budget
        self.simulators: dict[str, Simulator] = {}

    def estimate(self, case: Case) -> SearchEstimate | None:
        """None when some allocation of the case exceeds the budget."""
        node = self.catalog.node(case.instance_type)
        slices = case.node_slices(node)
        simulator = self.simulators.get(case.instance_type) if case.slices is None else None
        if simulator is None:
            simulator = Simulator(slices, node.device_classes, node.node_name, node_labels(node), self.cel,
                                  prune=False, budget=self.budget)
            if case.slices is None:
                self.simulators[case.instance_type] = simulator
        searches: list[int] = []
        for mode in MODES:
            try:
                result = simulate(slices, node.device_classes, list(case.claims), node_name=node.node_name,
                                  allocated=case.allocated, mode=mode, simulator=simulator)
            except SearchBudgetExceeded:
                return None
            searches += result.searches
        return SearchEstimate(max(searches, default=0), sum(searches))


# --- the generator ---------------------------------------------------------------------------------------

@dataclass
class GeneratedCases:
    cases: list[Case]
    rejected: list[Case] = field(default_factory=list)  # dropped: Go's search would exceed the budget
    invalid: Counter[str] = field(default_factory=Counter)  # per category: typed templates that refused the draw
    estimates: dict[str, SearchEstimate] = field(default_factory=dict)


def _claim(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": copy.deepcopy(dict(spec))}


def _template_claim(name: str, template: ClaimTemplate) -> dict[str, Any]:
    return _claim(name, template.to_manifest()["spec"]["spec"])


def _sel(*exprs: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in exprs]


def _exact(count: int | None, selectors: Sequence[str], cls: str = NEURON_CLASS) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls}
    if selectors:
        body["selectors"] = _sel(*selectors)
    if count is None:
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = count
    return body


Constraints = list[tuple[list[str], str]]  # (request names, empty for all; matchAttribute)


def _spec(requests: list[dict[str, Any]], constraints: Constraints | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = [{"requests": list(r), "matchAttribute": a} if r else {"matchAttribute": a}
                                  for r, a in constraints]
    return {"devices": devices}


def group_attribute(rng: random.Random, sizes: Sequence[int] = (1, 2, 3, 4, 6, 8, 12, 16)) -> str:
    """A matchAttribute on AWS's devicegroup ids or this driver's topology ids (any size)."""
    aws = [n for n in (4, 8, 16) if n in sizes]
    if aws and rng.random() < 0.4:
        return f"{AWS}/devicegroup{rng.choice(aws)}_id"
    return f"{NEURON_DRIVER}/topology{rng.choice(sizes)}_id"


class CaseGenerator:
    """Deterministic for a seed: the same seed gives the same cases in the same order."""

    def __init__(self, seed: int, catalog: NodeCatalog, cel: CelEnvironment, budget: int = DEFAULT_BUDGET) -> None:
        self.rng = random.Random(seed)
        self.catalog = catalog
        self.types = list(CATALOG)
        self.estimator = SearchEstimator(catalog, cel, budget)
        self.max_count = 17  # lowered while drawing the claims of one multi-claim case
        self._builders: dict[str, Callable[[str], list[dict[str, Any]] | None]] = {
            "typed": self._typed, "raw": self._raw, "all": self._all, "efa": self._efa,
            "first-available": self._first_available, "multi-claim": self._multi_claim,
            "ultraserver": self._ultraserver, "unsatisfiable": self._unsatisfiable, "cel-error": self._cel_error,
        }

    # the driver

    def generate(self, total: int, *, examples: bool = True) -> GeneratedCases:
        """`total` cases: the examples on every node (unless left out), the rest drawn by category weight."""
        out = GeneratedCases([])
        for case in self._examples() if examples else []:
            self._keep(out, case)
        categories = sorted(CATEGORY_WEIGHTS)
        weights = [CATEGORY_WEIGHTS[c] for c in categories]
        attempts = 0
        while len(out.cases) < total:
            attempts += 1
            case_id = f"{attempts}"
            if attempts > total * 20:
                raise RuntimeError(f"case generation stalled after {attempts} draws: {len(out.rejected)} over budget, "
                                   f"{out.invalid} refused")
            category = self.rng.choices(categories, weights)[0]
            instance_type = self._instance_type(category)
            if category == "pools":
                case = self._pools(f"pools-{case_id}", instance_type)
            else:
                claims = self._builders[category](instance_type)
                if claims is None:
                    out.invalid[category] += 1
                    continue
                label, allocated = self.allocated(instance_type)
                case = Case(f"{category}-{case_id}", category, instance_type, tuple(claims), allocated, label)
            self._keep(out, case)
        return out

    def _keep(self, out: GeneratedCases, case: Case) -> None:
        estimate = self.estimator.estimate(case)
        if estimate is None:
            out.rejected.append(case)
            return
        out.cases.append(case)
        out.estimates[case.id] = estimate

    def _instance_type(self, category: str) -> str:
        if category in ("ultraserver",) and self.rng.random() < 0.7:
            return "trn2u.48xlarge"
        if category in ("efa",) and self.rng.random() < 0.7:
            return self.rng.choice([t for t, s in CATALOG.items() if s.has_device_efa])
        # multi-device hosts are where searches and constraints matter; single-device hosts stay in
        return self.rng.choice(self.types if self.rng.random() < 0.3 else
                               [t for t, s in CATALOG.items() if s.device_count > 1])

    # already allocated devices

    def allocated(self, instance_type: str) -> tuple[str, tuple[DeviceId, ...]]:
        node = self.catalog.node(instance_type)
        spec = CATALOG[instance_type]
        # every slice of the node: counter sets have no devices, NeuronCores are devices of their own
        devices = [(s["spec"]["driver"], d) for s in node.slices for d in s["spec"].get("devices") or []]
        neurons = [DeviceId(NEURON_DRIVER, node.node_name, d["name"]) for driver, d in devices
                   if driver == NEURON_DRIVER and d["attributes"]["resourceType"]["string"] == "neuron_device"]
        everything = [DeviceId(driver, node.node_name, d["name"]) for driver, d in devices]
        efas = [d for d in everything if d.driver == EFA_DRIVER]
        n = len(neurons)
        rng = self.rng
        pick = rng.random()
        if pick < 0.25:
            return "none", ()
        if pick < 0.45:
            p = rng.choice((0.1, 0.25, 0.5, 0.75))
            return f"random {int(p * 100)}%", tuple(d for d in everything if rng.random() < p)
        if pick < 0.6:
            k = rng.randint(1, max(1, n - 1))
            return f"{k} random neuron", tuple(sorted(rng.sample(neurons, min(k, n))))
        shapes = ["every other", "all but one", "first k"]
        if spec.topology is TopologyKind.TORUS_4X4:
            shapes += ["one per row", "one per row", "whole rows", "one per column"]
        if spec.topology is TopologyKind.RING:
            shapes += ["one per segment", "one per segment"]
        if efas:
            shapes += ["half the EFAs", "all EFAs", "one per row + EFAs"] if spec.device_count == 16 else []
        if instance_type == "trn2u.48xlarge":
            shapes += ["the UltraServer node"]
        shape = rng.choice(shapes)
        by_id = {int(d.device.rsplit("-", 1)[1]): d for d in neurons}
        if shape == "every other":
            start = rng.randint(0, 1)
            return shape, tuple(by_id[i] for i in range(start, n, 2))
        if shape == "all but one":
            keep = rng.randrange(n)
            return shape, tuple(by_id[i] for i in range(n) if i != keep)
        if shape == "first k":
            k = rng.randint(1, n)
            return f"first {k}", tuple(by_id[i] for i in range(k))
        if shape in ("one per row", "one per row + EFAs"):
            taken = tuple(by_id[row * 4 + rng.randrange(4)] for row in range(4))
            if shape == "one per row + EFAs":
                taken += tuple(rng.sample(efas, rng.randint(1, len(efas) // 2)))
            return shape, taken
        if shape == "one per column":
            return shape, tuple(by_id[rng.randrange(4) * 4 + col] for col in range(4))
        if shape == "whole rows":
            rows = sorted(rng.sample(range(4), rng.randint(1, 3)))
            return f"rows {rows}", tuple(by_id[r * 4 + c] for r in rows for c in range(4))
        if shape == "one per segment":
            size = rng.choice([s for s in spec.group_sizes() if s > 1])
            return f"one per {size}-segment", tuple(by_id[g * size + rng.randrange(size)] for g in range(n // size))
        if shape == "half the EFAs":
            return shape, tuple(sorted(rng.sample(efas, len(efas) // 2)))
        if shape == "all EFAs":
            return shape, tuple(efas)
        ultraserver = [d for d in everything if d.device == "neuron-node"]
        return shape, tuple(ultraserver)

    # selectors

    def selector(self, instance_type: str) -> str:
        """One selector on a published attribute or capacity; true on some devices of some nodes."""
        rng = self.rng
        spec = CATALOG[instance_type]
        kind = rng.choice(("instanceType", "family", "deviceId", "deviceId", "coreCount", "memory", "version",
                           "kernel", "numa", "topologyKind"))
        if kind == "instanceType":
            t = instance_type if rng.random() < 0.85 else rng.choice(self.types)
            return f"{A}.instanceType == '{t}'"
        if kind == "family":
            families = sorted(rng.sample(sorted(FAMILIES), rng.randint(1, 3)))
            if spec.family.name not in families and rng.random() < 0.8:
                families.append(spec.family.name)
            return f"{A}.family in [{', '.join(repr(f) for f in families)}]"
        if kind == "deviceId":
            form = rng.randrange(4)
            if form == 0:
                return f"{A}.deviceId < {rng.randint(1, 16)}"
            if form == 1:
                return f"{A}.deviceId >= {rng.randint(0, 12)}"
            if form == 2:
                return f"{A}.deviceId % 2 == {rng.randint(0, 1)}"
            ids = sorted(rng.sample(range(16), rng.randint(2, 10)))
            return f"{A}.deviceId in {ids}"
        if kind == "coreCount":
            return f"{CAP}.cores.compareTo(quantity('{rng.choice((2, 8))}')) {rng.choice(('>=', '==', '<'))} 0"
        if kind == "memory":
            q = rng.choice(("16Gi", "32Gi", "64Gi", "96Gi", "100Gi", "34359738368"))
            form = rng.randrange(3)
            if form == 0:
                return f"{CAP}.memory.compareTo(quantity('{q}')) >= 0"
            if form == 1:
                return f"{CAP}.memory.isGreaterThan(quantity('{q}'))"
            return f"{CAP}.memory.compareTo(quantity('{q}')) == 0"
        if kind == "version":
            v = rng.choice(("0.0.9", "0.1.0", "0.1.1", "1.0.0"))
            form = rng.randrange(3)
            if form == 0:
                return f"{A}.draDriverVersion.compareTo(semver('{v}')) >= 0"
            if form == 1:
                return f"{A}.draDriverVersion.isLessThan(semver('{v}'))"
            return f"{A}.draDriverVersion.major() == {rng.randint(0, 1)}"
        if kind == "kernel":
            v = rng.choice(("2.25.4.0", "2.24.0.0"))
            return f"{A}.neuronDriverVersion {rng.choice(('==', '!='))} '{v}'"
        if kind == "numa":
            return f"{K8S}.numaNode == {rng.randint(0, 1)}"
        return f"{A}.topologyKind == '{rng.choice(('torus4x4', 'ring', 'single'))}'"

    def selectors(self, instance_type: str, most: int = 2) -> list[str]:
        return [self.selector(instance_type) for _ in range(self.rng.randint(0, most))]

    def _count(self, instance_type: str, low: int = 1, high: int = 17) -> int:
        """A count, biased to small ones, the connected group sizes and the host's size (and one more)."""
        n = CATALOG[instance_type].device_count
        high = min(high, self.max_count)
        pick = self.rng.random()
        if pick < 0.4:
            choices = [c for c in (1, 1, 2, 2, 3, 4, 4, 6, 8, 8, 12, 16, n, n + 1) if low <= c <= high]
            return self.rng.choice(choices or [low])
        if pick < 0.75:
            return self.rng.randint(low, max(low, min(high, 4)))
        return self.rng.randint(low, max(low, high))

    # categories

    def _neuron(self, instance_type: str, name: str = "neurons", count: Any = None) -> Neuron | None:
        rng = self.rng
        kw: dict[str, Any] = {"name": name}
        target = rng.random()
        if target < 0.35:
            kw["instance_types"] = instance_type if rng.random() < 0.9 else rng.choice(self.types)
        elif target < 0.6:
            family = CATALOG[instance_type].family.name
            kw["families"] = family if rng.random() < 0.9 else rng.choice(sorted(FAMILIES))
        topo = rng.random()
        if topo < 0.4:
            kw["topology"] = Connected(rng.choice((None, None, 4, 8, 16, 2, 3, 6, 12)),
                                       rng.choice((GroupAttribute.AUTO, GroupAttribute.AWS, GroupAttribute.NEURON)))
        elif topo < 0.5:
            kw["topology"] = RingSegment(rng.choice((None, 2, 3, 4, 6, 12)))
        else:
            kw["topology"] = AnyTopology()
        if rng.random() < 0.2:
            kw["lnc"] = rng.choice((1, 2))
        if rng.random() < 0.2:
            kw["kernel_driver"] = rng.choice(("2.25.4.0", "2.24.0.0", AtLeast("2.25"), AtLeast("2.26"),
                                              AtLeast("2"), AtLeast("2.25.4")))
        if rng.random() < 0.2:
            kw["min_memory"] = rng.choice(("16Gi", "32Gi", "64Gi", "96Gi"))
        if rng.random() < 0.15:
            kw["min_cores"] = rng.choice((1, 2, 8))
        if rng.random() < 0.2:
            kw["selectors"] = tuple(self.selectors(instance_type, 1))
        try:
            return Neuron(count if count is not None else self._count(instance_type, 1, 16), **kw)
        except TemplateError:
            return None

    def _typed(self, instance_type: str) -> list[dict[str, Any]] | None:
        neuron = self._neuron(instance_type)
        if neuron is None:
            return None
        return [_template_claim("c0", ClaimTemplate("typed", neuron))]

    def _raw_request(self, instance_type: str, count: int | None) -> dict[str, Any]:
        guard = [GUARD] if self.rng.random() < 0.85 else []
        return _exact(count, guard + self.selectors(instance_type))

    def _raw(self, instance_type: str) -> list[dict[str, Any]]:
        rng = self.rng
        request = self._raw_request(instance_type, self._count(instance_type))
        if rng.random() < 0.06:
            request["adminAccess"] = True  # in-use devices stay selectable; copies never use devices up
        requests = [{"name": "neurons", "exactly": request}]
        constraints: Constraints = []
        if rng.random() < 0.6:
            constraints.append((["neurons"] if rng.random() < 0.7 else [], group_attribute(rng)))
        if rng.random() < 0.15:
            constraints.append((["neurons"], group_attribute(rng)))
        if rng.random() < 0.2:  # a second Neuron request, maybe in the same group
            requests.append({"name": "more", "exactly": self._raw_request(instance_type, rng.randint(1, 4))})
            if rng.random() < 0.5:
                constraints.append((["neurons", "more"], group_attribute(rng, (4, 8, 16))))
        return [_claim("c0", _spec(requests, constraints))]

    def _all(self, instance_type: str) -> list[dict[str, Any]] | None:
        rng = self.rng
        if rng.random() < 0.3:
            neuron = self._neuron(instance_type, count=ALL)
            return None if neuron is None else [_template_claim("c0", ClaimTemplate("all", neuron))]
        constraints: Constraints = [([], group_attribute(rng))] if rng.random() < 0.4 else []
        return [_claim("c0", _spec([{"name": "neurons", "exactly": self._raw_request(instance_type, None)}],
                                   constraints))]

    def _efa(self, instance_type: str) -> list[dict[str, Any]] | None:
        rng = self.rng
        form = rng.random()
        if form < 0.15:  # EFA alone, maybe grouped
            group = rng.choice((1, 4, 8, 16))
            constraints: Constraints = [([], f"{AWS}/devicegroup{group}_id")] if rng.random() < 0.5 else []
            body = _exact(rng.randint(1, 16), [], EFA_CLASS)
            return [_claim("c0", _spec([{"name": "efa", "exactly": body}], constraints))]
        if form < 0.3:  # hand-made alignment, possibly on a group the counts cannot fill
            n, m = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4, 8))
            attribute = f"{AWS}/devicegroup{rng.choice((1, 4, 8, 16))}_id"
            return [_claim("c0", _spec([{"name": "neurons", "exactly": self._raw_request(instance_type, n)},
                                        {"name": "efa", "exactly": _exact(m, [], EFA_CLASS)}],
                                       [(["neurons", "efa"], attribute)]))]
        counts = [c for c in (1, 2, 4, 4, 8, 8, 16) if c <= self.max_count]
        neuron = self._neuron(instance_type, count=rng.choice(counts))
        if neuron is None:
            return None
        aligned = rng.random() < 0.75
        try:
            efa = Efa(rng.choice((1, 2, 4, 8)) if rng.random() < 0.3 else min(8, neuron.max_devices()),
                      aligned_to="neurons" if aligned else None,
                      group=rng.choice((None, None, 1, 4, 8, 16)) if aligned else None)
            return [_template_claim("c0", ClaimTemplate("efa", neuron, efa))]
        except TemplateError:
            return None

    def _first_available(self, instance_type: str) -> list[dict[str, Any]] | None:
        rng = self.rng
        k = rng.choice((2, 2, 3))
        if rng.random() < 0.1:
            # 4 + 4 + (25 or 2): the first alternative would pass the 32-device limit, the search skips it
            return [_claim("c0", _spec([
                {"name": "neurons", "exactly": _exact(4, [GUARD])},
                {"name": "efa", "exactly": _exact(4, [], EFA_CLASS)},
                {"name": "more", "firstAvailable": [{"name": "many", **_exact(25, [], EFA_CLASS)},
                                                    {"name": "two", **_exact(2, [], EFA_CLASS)}]}],
                [(["neurons", "efa"], f"{AWS}/devicegroup4_id")]))]
        if rng.random() < 0.6:
            options = [self._neuron(instance_type, name=f"o{i}") for i in range(k)]
            if any(o is None for o in options):
                return None
            items: list[Any] = [FirstAvailable(*[o for o in options if o is not None])]
            if rng.random() < 0.25:
                items.append(Efa(rng.choice((1, 2, 4))))
            try:
                return [_template_claim("c0", ClaimTemplate("fa", *items))]
            except TemplateError:
                return None
        subs: list[dict[str, Any]] = []
        constraints: Constraints = []
        for i in range(k):
            subs.append({"name": f"s{i}", **self._raw_request(instance_type, self._count(instance_type))})
            if rng.random() < 0.5:
                constraints.append(([f"neurons/s{i}"], group_attribute(rng)))
        if rng.random() < 0.2:
            constraints.append((["neurons"], group_attribute(rng)))
        requests: list[dict[str, Any]] = [{"name": "neurons", "firstAvailable": subs}]
        if rng.random() < 0.2:
            requests.append({"name": "more", "exactly": self._raw_request(instance_type, rng.randint(1, 4))})
        return [_claim("c0", _spec(requests, constraints))]

    def _multi_claim(self, instance_type: str) -> list[dict[str, Any]] | None:
        claims = []
        self.max_count = self.rng.choice((2, 4, 4, 8))  # several claims on one node: mostly small ones
        try:
            for i in range(self.rng.choice((2, 2, 3))):
                build = self.rng.choice((self._typed, self._raw, self._efa, self._first_available))
                got = build(instance_type)
                if got is None:
                    return None
                claims.append({**got[0], "metadata": {"name": f"c{i}", "namespace": "default"}})
        finally:
            self.max_count = 17
        return claims

    def _ultraserver(self, instance_type: str) -> list[dict[str, Any]] | None:
        rng = self.rng
        items: list[Any] = [UltraServerNode(rng.choice((1, 2, 4)), lnc=rng.choice((None, 1, 2)))]
        extra = rng.random()
        if extra < 0.4:
            items.append(Neuron(ALL, families=rng.choice(("trn2u", "trn2")), lnc=rng.choice((None, 1))))
        elif extra < 0.7:
            neuron = self._neuron(instance_type)
            if neuron is None:
                return None
            items.append(neuron)
        try:
            return [_template_claim("c0", ClaimTemplate("us", *items))]
        except TemplateError:
            return None

    def _unsatisfiable(self, instance_type: str) -> list[dict[str, Any]]:
        rng = self.rng
        spec = CATALOG[instance_type]
        other = rng.choice([t for t in self.types if t != instance_type])
        form = rng.randrange(7)
        if form == 6:  # more than the 32 devices a claim may get (the allocator refuses the claim)
            first = rng.randint(16, 17)
            return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(first, [GUARD])},
                                        {"name": "efa", "exactly": _exact(33 - first, [], EFA_CLASS)}]))]
        if form == 0:  # 17 devices, kept in groups so the search stays small
            request = _exact(17, [GUARD])
            return [_claim("c0", _spec([{"name": "neurons", "exactly": request}],
                                       [([], group_attribute(rng, (4,)))]))]
        if form == 1:
            request = _exact(rng.randint(1, 4), [GUARD, f"{A}.instanceType == '{other}'"])
            return [_claim("c0", _spec([{"name": "neurons", "exactly": request}]))]
        if form == 2:  # one device more than a connected group holds (groups of at most 8 keep Go's search small)
            size = rng.choice([n for n in spec.group_sizes() if n <= 8])
            count = size + 1
            return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(count, [GUARD])}],
                                       [([], f"{NEURON_DRIVER}/topology{size}_id")]))]
        if form == 3:
            more = f"{CAP}.memory.compareTo(quantity('{spec.hbm_bytes_per_device + 1}')) >= 0"
            return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(rng.randint(1, 3), [GUARD, more])}]))]
        if form == 4:  # more EFAs than a devicegroup has
            return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(4, [GUARD])},
                                        {"name": "efa", "exactly": _exact(rng.choice((5, 8, 9)), [], EFA_CLASS)}],
                                       [(["neurons", "efa"], f"{AWS}/devicegroup4_id")]))]
        return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(None, [GUARD, f"{A}.deviceId > 100"])}]))]

    def _cel_error(self, instance_type: str) -> list[dict[str, Any]]:
        rng = self.rng
        expr = rng.choice((f"{CAP}.cores.compareTo(quantity('2')) >= 0", f"{A}.topology_x < 2",
                           f"{A}.topology4_id == 0",
                           f"{CAP}.memory.compareTo(quantity('32Gi')) >= 0", f"{A}.topology2_id == 1",
                           f"{A}.deviceId < 8"))
        guarded = [GUARD] if rng.random() < 0.3 else []
        count = rng.choice((None, 1, 2, 4))
        constraints: Constraints = []
        if count and count > 1 and rng.random() < 0.4:
            constraints.append(([], group_attribute(rng, (4, 8))))
        return [_claim("c0", _spec([{"name": "neurons", "exactly": _exact(count, [*guarded, expr])}], constraints))]

    def _examples(self) -> list[Case]:
        cases = []
        for template in (*OFFICIAL_SAMPLES, *RICHER_CASES):
            for instance_type in self.types:
                for j in range(3):
                    label, allocated = ("none", ()) if j == 0 else self.allocated(instance_type)
                    cases.append(Case(f"examples-{template.name}-{instance_type}-{j}", "examples", instance_type,
                                      (_template_claim("c0", template),), allocated, label))
        return cases

    def _pools(self, case_id: str, instance_type: str) -> Case:
        """The node's slices reshaped: a pool split over two slices, one slice missing, a stale generation,
        a duplicated device name. Invalid pools only on hosts with a single pool: with two pools, Go's
        outcome depends on its (random) map order of pools."""
        rng = self.rng
        node = self.catalog.node(instance_type)
        neuron_slice = node.slices[0]
        devices = neuron_slice["spec"]["devices"]
        shapes = ["split", "split", "incomplete", "incomplete", "stale generation"]
        if len(node.slices) == 1:
            shapes.append("duplicate name")
        shape = rng.choice(shapes)
        half = max(1, len(devices) // 2)

        def part(devs: list[dict[str, Any]], generation: int, count: int, suffix: str) -> dict[str, Any]:
            s = copy.deepcopy(neuron_slice)
            s["metadata"] = {"name": f"{neuron_slice['metadata']['name']}-{suffix}"}
            s["spec"]["devices"] = copy.deepcopy(devs)
            s["spec"]["pool"] = {**s["spec"]["pool"], "generation": generation, "resourceSliceCount": count}
            return s

        if shape == "split":
            neuron = [part(devices[:half], 1, 2, "a"), part(devices[half:], 1, 2, "b")]
        elif shape == "incomplete":
            keep = rng.choice(((0, half), (half, len(devices))))
            neuron = [part(devices[keep[0]:keep[1]], 1, 2, "a")]
        elif shape == "stale generation":
            stale = [{**d, "name": d["name"].replace("neuron-device", "old-device")} for d in devices]
            neuron = [part(stale, 0, 1, "old"), part(devices, 1, 1, "new")]
            rng.shuffle(neuron)
        else:
            neuron = [part([*devices, copy.deepcopy(devices[0])], 1, 1, "dup")]
        slices = (*neuron, *node.slices[1:])
        if rng.random() < 0.5:
            claim = _claim("c0", _spec([{"name": "neurons", "exactly": self._raw_request(
                instance_type, rng.choice((1, 2, 4, 8, len(devices))))}],
                [([], f"{NEURON_DRIVER}/topology{rng.choice((1, 4, 8))}_id")] if rng.random() < 0.5 else []))
        else:
            claim = _claim("c0", _spec([{"name": "neurons", "exactly": self._raw_request(
                instance_type, None if rng.random() < 0.3 else rng.randint(1, 3))}]))
        label, allocated = ("none", ()) if rng.random() < 0.6 else self.allocated(instance_type)
        return Case(case_id, "pools", instance_type, (claim,), allocated, label, slices, note=shape)


def case_digest(cases: Sequence[Case]) -> str:
    """A short fingerprint of generated cases (determinism checks)."""
    import hashlib

    digest = hashlib.sha256()
    for c in cases:
        digest.update(json.dumps([c.id, c.instance_type, c.claims, c.allocated, c.slices], sort_keys=True).encode())
    return digest.hexdigest()[:16]
