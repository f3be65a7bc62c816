"""UltraServers as group devices: which nodes form each UltraServer, and the ResourceSlices that publish each one
as one schedulable device (docs/ultraserver.md).

Membership comes from what every node's driver publishes on its own slice (the `neuron-node` device: instance
type, `ultraserverServerId4/2`, `ultraserverNodeId4/2`, `ultraserverMode`, `ultraserverId`, `capacityBlockId`),
never from node names. A node belongs to the set its `ultraserverMode` says (4: the nodes sharing `server_id_4`,
2: sharing `server_id_2`, 1: the node alone; an empty mode file: the catalog's UltraServer size); its slot in the
set is its node id. A 4-node set also publishes its two 2-node halves (the hardware runs mode-2 jobs inside it).

Each group is one slice with no `nodeName`: a `nodeSelector` naming exactly its members by their
`kubernetes.io/hostname` label (one term: a field selector names one node only), one device with resourceType
`ultraserver`. Where the API server serves partitionable devices (1.36+), a 4-node set and its two halves are one
pool: a slice of shared counters (one per member slot) and the three device slices, the whole consuming all four
counters and each half its two, so the scheduler never allocates the whole and a half at once (docs/ultraserver.md
§2a); elsewhere each group is its own pool of one slice and nothing keeps them apart. A member that is missing
(its slice or Node gone, or NotReady) or has an unhealthy device taints the group device where the API server keeps
device taints (1.36+); elsewhere the device is withdrawn (the slice stays, empty). The previous members come back
from the group slice's annotation, so a vanished node stays a (missing) member across controller restarts. Pure
functions: the controller (driver/groups) does the I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.k8s_names import ULTRASERVER_GROUP, is_label_value, ultraserver_label_keys
from neuron_dra.driver.model.slices import MAX_STRING_VALUE, NEURON_NODE
from neuron_dra.driver.model.taints import unhealthy_taint_key

MODES = (1, 2, 4)  # the set sizes the class files express (server_id_2/4, node_id_2/4)
MEMBERS_ANNOTATION = "neuron-dra/ultraserver-members"  # the group's members as last published (JSON)
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "neuron-dra-ultraserver"
MISSING_TAINT = "member-missing"  # key <driver>/member-missing; unhealthy members: <driver>/unhealthy
UNHEALTHY_VALUE = "member-unhealthy"
POOL_PREFIX = "ultraserver-"  # pools `ultraserver-<size>/<id>`: a '/' no node name (hence no node pool) has
WHOLE_DEVICE = "ultraserver"
HALF_DEVICE = "ultraserver-half"  # a half in its own pool; with shared counters `ultraserver-half-<0|1>`
COUNTER_SET = "members"  # a 4-node set's shared counters: `node-<slot>`, value 1 each
COUNTERS_PART = "counters"  # the counter slice's name part
MAX_ID = 200  # characters of a sanitised server id in a pool name (pool names: at most 253)
_NOT_NAME = re.compile(r"[^a-z0-9.-]+")
_EDGE = re.compile(r"^[^a-z0-9]+|[^a-z0-9]+$")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
LABEL_ID_MAX = 52  # characters of a server id kept in a label value before its hash (52 + 1 + 10 = 63)
TAINTING_EFFECTS = ("NoSchedule", "NoExecute")
HOSTNAME_LABEL = "kubernetes.io/hostname"  # kubelet sets it on its Node (the node name unless overridden)


@dataclass(frozen=True)
class MemberFacts:
    """What one node's slices say about its UltraServer."""

    node_name: str
    instance_type: str
    server_id_4: str
    server_id_2: str
    node_id_4: int
    node_id_2: int
    mode: int | None  # the node's ultraserver_mode; None: not published (empty file)
    ultraserver_id: str
    capacity_block_id: str | None = None
    unhealthy: bool = False  # a device of the node carries the driver's unhealthy taint


@dataclass(frozen=True)
class Problem:
    """Why a node or a group is left out: the subject, the field, the value and what is allowed."""

    subject: str
    field: str
    value: object
    allowed: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.field} {self.value!r} is not allowed; allowed: {self.allowed}"


@dataclass(frozen=True)
class Slot:
    """One place in a group: the node holding it and whether it is there and healthy."""

    node_id: int
    node_name: str
    present: bool
    unhealthy: bool = False
    server_id_2: str = ""  # which half of a 4-node set
    hostname: str = ""  # the Node's kubernetes.io/hostname label ("": its name), what the selector names


@dataclass(frozen=True)
class Group:
    """One UltraServer set (or the half of one): its identity and its slots."""

    server_id: str  # server_id_4, server_id_2 (halves, 2-node sets) or the node's own id (1-node sets)
    size: int  # nodes the set has (1, 2 or 4), whether or not all are there
    instance_type: str
    ultraserver_id: str
    capacity_block_id: str | None
    slots: tuple[Slot, ...]
    half_of: str | None = None  # the 4-node set's server_id_4, for a half
    half: int = 0  # which half (slots 0-1: 0, slots 2-3: 1)

    @property
    def pool_name(self) -> str:
        return f"{POOL_PREFIX}{self.size}/{sanitised_id(self.server_id)}"

    @property
    def device_name(self) -> str:
        return HALF_DEVICE if self.half_of is not None else WHOLE_DEVICE

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(sorted(s.node_name for s in self.slots))

    @property
    def hostnames(self) -> tuple[str, ...]:
        return tuple(sorted(s.hostname or s.node_name for s in self.slots))

    @property
    def missing(self) -> int:
        """Slots empty or held by a node that is not there."""
        return self.size - sum(1 for s in self.slots if s.present)

    @property
    def unhealthy(self) -> tuple[str, ...]:
        return tuple(sorted(s.node_name for s in self.slots if s.present and s.unhealthy))

    @property
    def ready(self) -> bool:
        return not self.missing and not self.unhealthy


@dataclass(frozen=True)
class Membership:
    groups: tuple[Group, ...]
    problems: tuple[Problem, ...] = field(default_factory=tuple)


def sanitised_id(server_id: str) -> str:
    """A server id as one DNS subdomain (a pool-name segment): lowercased, other characters as '-'; when that
    changed anything, a hash of the original follows, so two ids never map to one name."""
    low = server_id.lower()
    clean = _EDGE.sub("", _NOT_NAME.sub("-", low))[:MAX_ID]
    if clean == server_id and clean:
        return clean
    digest = hashlib.sha256(server_id.encode()).hexdigest()[:10]
    return f"{clean}-{digest}" if clean else digest


# --- reading the nodes' slices -------------------------------------------------------------------------------


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> object:
    value = attrs.get(name, attrs.get(f"{driver}/{name}"))
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    (inner,) = value.values()
    return inner


def _latest_node_pools(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, list[Mapping[str, Any]]]:
    """Node name -> the slices of its own pool at the pool's highest generation (what the scheduler uses)."""
    pools: dict[str, tuple[int, list[Mapping[str, Any]]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        node, pool = spec.get("nodeName"), spec.get("pool") or {}
        if spec.get("driver") != driver or not isinstance(node, str) or not node or pool.get("name") != node:
            continue
        generation = pool.get("generation")
        generation = generation if isinstance(generation, int) else 0
        have = pools.get(node)
        if have is None or generation > have[0]:
            pools[node] = (generation, [s])
        elif generation == have[0]:
            have[1].append(s)
    return {node: found for node, (_, found) in pools.items()}


def _tainted(device: Mapping[str, Any], key: str) -> bool:
    return any(isinstance(t, Mapping) and t.get("key") == key and t.get("effect") in TAINTING_EFFECTS
               for t in device.get("taints") or ())


def member_facts(slices: Iterable[Mapping[str, Any]], driver: str) -> tuple[dict[str, MemberFacts], list[Problem]]:
    """Each UltraServer node's facts, read from the `neuron-node` device of its slices; nodes without one (not an
    UltraServer type) are not members. A node whose values are malformed is left out with a Problem."""
    facts: dict[str, MemberFacts] = {}
    problems: list[Problem] = []
    unhealthy_key = unhealthy_taint_key(driver)
    for node, pool_slices in sorted(_latest_node_pools(slices, driver).items()):
        devices = [d for s in pool_slices for d in (s.get("spec") or {}).get("devices") or ()
                   if isinstance(d, Mapping)]
        node_devices = [d for d in devices
                        if _attribute(d.get("attributes") or {}, driver, "resourceType") == NEURON_NODE]
        if not node_devices:
            continue
        attrs = node_devices[0].get("attributes") or {}
        subject = f"node {node}"
        strings: dict[str, str] = {}
        for name in ("instanceType", "ultraserverServerId4", "ultraserverServerId2", "ultraserverId"):
            value = _attribute(attrs, driver, name)
            if not isinstance(value, str) or not value or len(value) > MAX_STRING_VALUE:
                problems.append(Problem(subject, name, value, f"a string of 1 to {MAX_STRING_VALUE} characters"))
                break
            strings[name] = value
        else:
            ints: dict[str, int | None] = {}
            for name, allowed in (("ultraserverNodeId4", (0, 1, 2, 3)), ("ultraserverNodeId2", (0, 1)),
                                  ("ultraserverMode", MODES)):
                value = _attribute(attrs, driver, name)
                if value is None and name == "ultraserverMode":
                    ints[name] = None
                    continue
                if isinstance(value, bool) or value not in allowed:
                    problems.append(Problem(subject, name, value, ", ".join(map(str, allowed))))
                    break
                assert isinstance(value, int)
                ints[name] = value
            else:
                block = _attribute(attrs, driver, "capacityBlockId")
                node_id_4, node_id_2 = ints["ultraserverNodeId4"], ints["ultraserverNodeId2"]
                assert node_id_4 is not None and node_id_2 is not None
                facts[node] = MemberFacts(
                    node, strings["instanceType"], strings["ultraserverServerId4"], strings["ultraserverServerId2"],
                    node_id_4, node_id_2, ints["ultraserverMode"], strings["ultraserverId"],
                    block if isinstance(block, str) and block else None,
                    any(_tainted(d, unhealthy_key) for d in devices))
    return facts, problems


# --- the previous members (from our own group slices) ----------------------------------------------------------


@dataclass(frozen=True)
class PreviousGroup:
    """A group as last published: its pool and its slots' nodes (from MEMBERS_ANNOTATION)."""

    pool_name: str
    slots: tuple[Slot, ...]


def previous_groups(group_slices: Iterable[Mapping[str, Any]]) -> dict[str, PreviousGroup]:
    """Pool name -> the members our slices last named. A malformed annotation (someone edited it) counts as no
    memory: the group is rebuilt from the nodes that are there."""
    out: dict[str, PreviousGroup] = {}
    for s in group_slices:
        pool = ((s.get("spec") or {}).get("pool") or {}).get("name")
        text = ((s.get("metadata") or {}).get("annotations") or {}).get(MEMBERS_ANNOTATION)
        if not isinstance(pool, str) or not isinstance(text, str) or len(text) > 4096:
            continue
        try:
            doc = json.loads(text)
            slots = tuple(Slot(int(m["nodeId"]), str(m["node"]), False, False, str(m.get("serverId2", "")),
                               str(m.get("hostname", "")))
                          for m in doc)
        except (ValueError, TypeError, KeyError):
            continue
        if len(slots) <= max(MODES) and len(slots) > len(out[pool].slots if pool in out else ()):
            out[pool] = PreviousGroup(pool, slots)  # with shared counters, the whole's slice names all 4 slots
    return out


def members_annotation(group: Group) -> str:
    return json.dumps([{"nodeId": s.node_id, "node": s.node_name, "serverId2": s.server_id_2,
                        "hostname": s.hostname or s.node_name} for s in group.slots], separators=(",", ":"))


# --- grouping --------------------------------------------------------------------------------------------------


def _set_size(f: MemberFacts, catalog: Catalog) -> int | None:
    if f.mode is not None:
        return f.mode
    spec = catalog.types.get(f.instance_type)
    if spec is not None and spec.ultraserver is not None:
        return max(m for m in MODES if m <= spec.ultraserver.servers)
    return None


def _set_key(f: MemberFacts, size: int) -> tuple[str, int]:
    """The id the set's nodes share and the node's slot in it."""
    if size == 4:
        return f.server_id_4, f.node_id_4
    if size == 2:
        return f.server_id_2, f.node_id_2
    return f"{f.server_id_4}.{f.node_id_4}", 0


def group_ultraservers(facts: Mapping[str, MemberFacts], previous: Mapping[str, PreviousGroup] | None = None,
                       ready_nodes: Iterable[str] | None = None, catalog: Catalog = BUILTIN,
                       hostnames: Mapping[str, str] | None = None) -> Membership:
    """The UltraServer sets (and halves of 4-node sets) from the members' facts. `previous` keeps a member that
    vanished as a missing slot; `ready_nodes` (None: all) are the Nodes that exist and are Ready; `hostnames` maps
    node names to their `kubernetes.io/hostname` label (missing: the name)."""
    names = hostnames or {}
    ready = None if ready_nodes is None else frozenset(ready_nodes)
    problems: list[Problem] = []
    buckets: dict[tuple[str, int, str], list[tuple[int, MemberFacts]]] = {}
    for f in facts.values():
        size = _set_size(f, catalog)
        spec = catalog.types.get(f.instance_type)
        most = spec.ultraserver.servers if spec is not None and spec.ultraserver is not None else max(MODES)
        if size is None or size > most:
            problems.append(Problem(f"node {f.node_name}", "ultraserverMode", f.mode if size is None else size,
                                    f"1, 2 or 4 and at most the {most} servers of a {f.instance_type} UltraServer"))
            continue
        key, slot = _set_key(f, size)
        buckets.setdefault((f.instance_type, size, key), []).append((slot, f))
    groups: list[Group] = []
    seen_nodes = set(facts)
    for (instance_type, size, key), members in sorted(buckets.items()):
        by_slot: dict[int, MemberFacts] = {}
        clash = False
        for slot, f in members:
            if slot in by_slot:
                problems.append(Problem(f"UltraServer {key}", "node id", slot,
                                        f"one node per id; {by_slot[slot].node_name} and {f.node_name} both claim "
                                        "it, so the group is not published until one leaves"))
                clash = True
            by_slot[slot] = f
        if clash:
            continue
        slots = {slot: Slot(slot, f.node_name, ready is None or f.node_name in ready, f.unhealthy, f.server_id_2,
                            names.get(f.node_name, f.node_name))
                 for slot, f in by_slot.items()}
        pool = Group(key, size, instance_type, "", None, ()).pool_name
        old = previous.get(pool) if previous else None
        for s in old.slots if old else ():
            # A node that was a member and is gone (not re-homed elsewhere) stays as a missing slot.
            if s.node_id not in slots and s.node_id < size and s.node_name not in seen_nodes:
                slots[s.node_id] = Slot(s.node_id, s.node_name, False, False, s.server_id_2,
                                        names.get(s.node_name, s.hostname))
        firsts = [f for _, f in sorted(members, key=lambda m: m[0])]
        ids = {f.ultraserver_id for f in firsts}
        blocks = {f.capacity_block_id for f in firsts if f.capacity_block_id}
        if len(ids) > 1 or len(blocks) > 1:
            problems.append(Problem(f"UltraServer {key}", "ultraserverId/capacityBlockId",
                                    sorted(ids | blocks), "one value on all members; the lowest node id's is used"))
        whole = Group(key, size, instance_type, firsts[0].ultraserver_id, firsts[0].capacity_block_id,
                      tuple(slots[i] for i in sorted(slots)))
        groups.append(whole)
        if size == 4:
            groups += _halves(whole)
    return Membership(tuple(groups), tuple(problems))


def _halves(whole: Group) -> list[Group]:
    """The two 2-node halves of a 4-node set: slots 0-1 and 2-3 (node_id_4 // 2), named by their server_id_2."""
    out = []
    for half in (0, 1):
        slots = tuple(Slot(s.node_id % 2, s.node_name, s.present, s.unhealthy, s.server_id_2, s.hostname)
                      for s in whole.slots if s.node_id // 2 == half)
        ids = {s.server_id_2 for s in slots if s.server_id_2}
        server_id = min(ids) if ids else f"{whole.server_id}.half{half}"
        out.append(Group(server_id, 2, whole.instance_type, whole.ultraserver_id, whole.capacity_block_id, slots,
                         half_of=whole.server_id, half=half))
    return out


# --- rendering -------------------------------------------------------------------------------------------------


def slice_name(pool_name: str, driver: str, part: str = "") -> str:
    """A group slice's name: fixed per pool and part (the whole's slice: none; `counters`, `half-0`, `half-1`), so
    a create retried after a lost answer cannot make two."""
    base = pool_name.replace("/", ".") + (f".{part}" if part else "")
    name = f"{base}.{driver}"
    if len(name) <= 253:
        return name
    return f"{base[:200]}.{hashlib.sha256(name.encode()).hexdigest()[:10]}.{driver}"


def group_taints(group: Group, driver: str, effect: str = "NoSchedule") -> list[dict[str, str]]:
    """The group device's taints: a missing member, an unhealthy one (no timeAdded: the API server sets it, and
    the controller keeps the stored one)."""
    taints = []
    if group.missing:
        taints.append({"key": f"{driver}/{MISSING_TAINT}", "value": f"{group.missing}-of-{group.size}",
                       "effect": effect})
    if group.unhealthy:
        taints.append({"key": unhealthy_taint_key(driver), "value": UNHEALTHY_VALUE, "effect": effect})
    return taints


def _counter(slot: int) -> str:
    return f"node-{slot}"


def counters_consumed(group: Group) -> list[dict[str, Any]]:
    """What the group's device consumes of its 4-node set's counters: one per slot it spans."""
    slots = range(4) if group.half_of is None else (2 * group.half, 2 * group.half + 1)
    return [{"counterSet": COUNTER_SET, "counters": {_counter(i): {"value": "1"} for i in slots}}]


def group_device(group: Group, driver: str, taints_served: bool, effect: str = "NoSchedule",
                 counters: bool = False) -> dict[str, Any] | None:
    """The group's device; None when it is withdrawn (not ready, and the API server keeps no taints). With
    `counters` a device of a 4-node set (whole or half) consumes its slots' shared counters and a half is named
    `ultraserver-half-<half>` (it shares the whole's pool)."""
    attrs: dict[str, Any] = {
        "resourceType": {"string": ULTRASERVER_GROUP},
        "instanceType": {"string": group.instance_type},
        "ultraserverId": {"string": group.ultraserver_id},
        "ultraserverServerId": {"string": group.server_id},
        "nodeCount": {"int": group.size},
        "ultraserverMode": {"int": group.size},
    }
    if group.capacity_block_id:
        attrs["capacityBlockId"] = {"string": group.capacity_block_id}
    partitioned = counters and (group.half_of is not None or group.size == 4)
    name = f"{HALF_DEVICE}-{group.half}" if partitioned and group.half_of is not None else group.device_name
    device: dict[str, Any] = {"name": name, "attributes": attrs}
    if partitioned:
        device["consumesCounters"] = counters_consumed(group)
    taints = group_taints(group, driver, effect)
    if taints and not taints_served:
        return None
    if taints:
        device["taints"] = taints
    return device


def node_selector(hostnames: Sequence[str]) -> dict[str, Any]:
    """One term naming the members by their `kubernetes.io/hostname` label. A ResourceSlice's selector takes exactly
    one term, and a `metadata.name` matchFields requirement exactly one value, so a field selector can name one
    node only (docs/ultraserver.md §2)."""
    return {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(hostnames)}]}]}


def selected_nodes(selector: Mapping[str, Any]) -> list[str]:
    """The hostnames a group slice's nodeSelector names (the inverse of node_selector)."""
    return sorted(v for term in selector.get("nodeSelectorTerms") or () for e in term.get("matchExpressions") or ()
                  if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" for v in e.get("values") or ())


def _slice(group: Group, driver: str, pool: str, part: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(pool, driver, part),
                     "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                     "annotations": {MEMBERS_ANNOTATION: members_annotation(group)}},
        "spec": {"driver": driver,
                 "pool": {"name": pool, "generation": 0, "resourceSliceCount": 1},
                 "nodeSelector": node_selector(group.hostnames)},
    }


def group_slice(group: Group, driver: str, taints_served: bool = True, effect: str = "NoSchedule",
                counters: bool = False) -> dict[str, Any]:
    """The group's ResourceSlice (resource.k8s.io/v1): no nodeName, the members named in the nodeSelector, one
    device (none when withdrawn). Its own pool of one slice; with `counters`, a half's slice is in its whole's pool
    (`desired_slices` sets the pool's slice count). Generation 0: the controller sets it."""
    partitioned = counters and group.half_of is not None
    pool = f"{POOL_PREFIX}4/{sanitised_id(group.half_of)}" if partitioned and group.half_of else group.pool_name
    out = _slice(group, driver, pool, f"half-{group.half}" if partitioned else "")
    device = group_device(group, driver, taints_served, effect, counters)
    out["spec"]["devices"] = [device] if device is not None else []
    return out


def counter_slice(whole: Group, driver: str) -> dict[str, Any]:
    """The shared counters of a 4-node set, in its pool: `node-0` .. `node-3`, value 1 each, which the whole
    device consumes all of and each half two of. A slice holds counters or devices, never both (API validation);
    its selector is the whole's (the scheduler reads counter slices whatever their selector)."""
    out = _slice(whole, driver, whole.pool_name, COUNTERS_PART)
    out["spec"]["sharedCounters"] = [{"name": COUNTER_SET,
                                      "counters": {_counter(i): {"value": "1"} for i in range(4)}}]
    return out


def desired_slices(membership: Membership, driver: str, taints_served: bool = True, effect: str = "NoSchedule",
                   counters: bool = False) -> list[dict[str, Any]]:
    """Every group's slice, ordered by pool name (a pool's counter slice first); a group with no known node
    (nothing to select) has none. With `counters` (partitionable devices served: 1.36+) each 4-node set is one
    pool of its counter slice, the whole's slice and its halves' slices, so the whole and a half exclude each
    other; every slice of a pool carries the pool's slice count."""
    out = []
    for g in membership.groups:
        if not g.slots:
            continue
        if counters and g.size == 4 and g.half_of is None:
            out.append(counter_slice(g, driver))
        out.append(group_slice(g, driver, taints_served, effect, counters))
    sizes: dict[str, int] = {}
    for s in out:
        sizes[s["spec"]["pool"]["name"]] = sizes.get(s["spec"]["pool"]["name"], 0) + 1
    for s in out:
        s["spec"]["pool"]["resourceSliceCount"] = sizes[s["spec"]["pool"]["name"]]
    return sorted(out, key=lambda s: (s["spec"]["pool"]["name"], "devices" in s["spec"], s["metadata"]["name"]))


def is_group_slice(s: Mapping[str, Any], driver: str) -> bool:
    """One of the controller's slices: this driver, no nodeName, its label and a group pool name."""
    spec, meta = s.get("spec") or {}, s.get("metadata") or {}
    pool = (spec.get("pool") or {}).get("name")
    return (spec.get("driver") == driver and not spec.get("nodeName")
            and (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
            and isinstance(pool, str) and pool.startswith(POOL_PREFIX) and "/" in pool)


def _without_times(devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in sorted(devices, key=lambda d: str(d.get("name"))):
        copy = dict(d)
        if d.get("taints"):
            copy["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
        out.append(copy)
    return out


def slice_content(s: Mapping[str, Any]) -> str:
    """What must match for a stored group slice to be up to date: all but the generation and taint times."""
    spec, meta = s.get("spec") or {}, s.get("metadata") or {}
    pool = spec.get("pool") or {}
    return json.dumps({"pool": pool.get("name"), "count": pool.get("resourceSliceCount"),
                       "selector": spec.get("nodeSelector"), "devices": _without_times(spec.get("devices") or ()),
                       "counters": spec.get("sharedCounters"),
                       "members": (meta.get("annotations") or {}).get(MEMBERS_ANNOTATION)},
                      sort_keys=True, separators=(",", ":"))


def keep_taint_times(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
    """A taint already stored (same device, key, value, effect) keeps its timeAdded."""
    times = {(d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t.get("timeAdded")
             for d in (stored.get("spec") or {}).get("devices") or () for t in d.get("taints") or ()}
    for d in desired["spec"].get("devices") or ():
        for t in d.get("taints") or ():
            when = times.get((d.get("name"), t.get("key"), t.get("value"), t.get("effect")))
            if when:
                t["timeAdded"] = when


# --- the members' Node labels (docs/ultraserver.md §3a) ------------------------------------------------------------


def label_value(server_id: str) -> str:
    """A server id as a label value: itself when it is one; else its label characters (at most LABEL_ID_MAX) and a
    hash of the original, so two ids never share a value."""
    if server_id and is_label_value(server_id):
        return server_id
    clean = _LABEL_EDGE.sub("", _LABEL_EDGE.sub("", _NOT_LABEL.sub("-", server_id))[:LABEL_ID_MAX])
    digest = hashlib.sha256(server_id.encode()).hexdigest()[:10]
    return f"{clean}-{digest}" if clean else digest


def node_labels(membership: Membership, driver: str) -> dict[str, dict[str, str]]:
    """Node name -> the UltraServer labels it should carry: `<driver>/ultraserver` the id of its set (any size),
    `<driver>/ultraserver-pair` the id of the two nodes a 2-node job may span (its half of a 4-node set, or its
    2-node set). Every slot's node, present or not (a NotReady member stays a member); nodes of no group, none."""
    whole_key, pair_key = ultraserver_label_keys(driver)
    out: dict[str, dict[str, str]] = {}
    for g in membership.groups:
        value = label_value(g.server_id)
        for s in g.slots:
            labels = out.setdefault(s.node_name, {})
            if g.half_of is not None:
                labels[pair_key] = value
                continue
            labels[whole_key] = value
            if g.size == 2:
                labels[pair_key] = value
    return out


def label_patches(nodes: Iterable[Mapping[str, Any]], desired: Mapping[str, Mapping[str, str]],
                  driver: str) -> dict[str, dict[str, str | None]]:
    """Node name -> the merge patch of `metadata.labels` that makes its UltraServer labels what `desired` says (a
    key to remove: None), for the Nodes that differ only; other labels are never named."""
    keys = ultraserver_label_keys(driver)
    out: dict[str, dict[str, str | None]] = {}
    for n in nodes:
        meta = n.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        have = meta.get("labels")
        have = have if isinstance(have, Mapping) else {}
        want = desired.get(name, {})
        patch = {k: want.get(k) for k in keys if have.get(k) != want.get(k)}
        if patch:
            out[name] = patch
    return out
