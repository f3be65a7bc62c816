"""ResourceClaims as prepare sees them: the narrow lookup interface, the per-claim errors, and the
allocation results and opaque configs that belong to this driver on this node (its own pool's devices, and the
UltraServer group device of a shared job claim when this node is one of the group's members)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from neuron_dra.driver.daemon.claims.cdi import CdiDevice, qualified_id
from neuron_dra.driver.daemon.claims.checkpoint import PreparedDevice
from neuron_dra.driver.errortext import capped, shown
from neuron_dra.driver.kubeletplugin import Claim, ClaimFailed, ClaimRef
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.catalog import InstanceSpec
from neuron_dra.driver.model.config import ConfigError, EffectiveConfig, OpaqueConfig, check_applies, decode
from neuron_dra.driver.model.devices import UltraServer
from neuron_dra.driver.model.k8s_names import DNS_LABEL_RULE, is_dns_label
from neuron_dra.driver.model.neuron_env import EnvError, ultraserver_env


class Reason(StrEnum):
    """Why a claim failed; the label of the errors metric."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    MALFORMED_CLAIM = "malformed_claim"
    UID_MISMATCH = "uid_mismatch"
    NOT_ALLOCATED = "not_allocated"
    NOT_FOR_THIS_NODE = "not_for_this_node"
    UNKNOWN_DEVICE = "unknown_device"
    BAD_CONFIG = "bad_config"
    DEVICE_BUSY = "device_busy"
    ALLOCATION_CHANGED = "allocation_changed"
    UNPREPARED_MEANWHILE = "unprepared_meanwhile"
    API_ERROR = "api_error"
    ABANDONED = "abandoned"
    LOCK_TIMEOUT = "lock_timeout"  # the other instance of the driver (surge rollout) held the node's lock
    INTERNAL = "internal"


class ClaimError(ClaimFailed):
    """One claim cannot be prepared (or unprepared); reported in that claim's `error`, nothing changed."""

    reason: Reason

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message, reason)


@dataclass(frozen=True)
class GroupAllocation:
    """An UltraServer group device (docs/ultraserver.md §6): pool `ultraserver-<size>/<id>`, device `ultraserver`
    or `ultraserver-half`, allocated to a claim that every pod of a job shares."""

    pool: str
    size: int  # the group's nodes: the UltraServer mode its pods run in
    server_id: str  # the pool's id segment: the sanitised server id of the set (model/ultraserver.py)
    half: int | None = None  # `ultraserver-half-<half>` in its 4-node set's pool (shared counters, 1.36+)


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver on this node, with the config that applies to it."""

    request: str  # as in the result: "req" or "req/subreq"
    device: str
    admin_access: bool
    config: EffectiveConfig
    group: GroupAllocation | None = None  # set: an UltraServer group device this node is a member of

    @property
    def base_request(self) -> str:
        return self.request.split("/", 1)[0]


# --- the claim's fields, type-checked ------------------------------------------------------------------------
# The API server validates claims, but what it answers is read defensively: a wrong type (an `allocation` that is
# a list, a result that is a string) is a MALFORMED_CLAIM error naming the field, never a crash of the caller.

_KINDS: dict[type, str] = {str: "a string", bool: "true or false", list: "a list"}


def _malformed(ref: ClaimRef, where: str, value: object, expected: str) -> ClaimError:
    return ClaimError(Reason.MALFORMED_CLAIM, f"claim {ref}: {where} is {shown(value)} ({type(value).__name__}); "
                                              f"expected {expected}")


def _object(ref: ClaimRef, where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _malformed(ref, where, value, "an object")
    return value


def _member(ref: ClaimRef, parent: Mapping[str, Any], where: str, key: str, kind: type, default: Any) -> Any:
    """parent[key] when it is of `kind`; `default` when missing or null; MALFORMED_CLAIM otherwise."""
    value = parent.get(key)
    if value is None:
        return default
    if kind is Mapping:
        return _object(ref, f"{where}.{key}", value)
    if type(value) is not kind:
        raise _malformed(ref, f"{where}.{key}", value, _KINDS[kind])
    return value


@dataclass(frozen=True)
class Result:
    """One allocation result (status.allocation.devices.results[i]) of any driver."""

    driver: str
    pool: str
    device: str
    request: str
    admin_access: bool


def results_of(allocation: Mapping[str, Any], ref: ClaimRef) -> tuple[Result, ...]:
    where = "status.allocation.devices"
    devices = _member(ref, allocation, "status.allocation", "devices", Mapping, {})
    out = []
    for i, item in enumerate(_member(ref, devices, where, "results", list, [])):
        if type(item) is dict:  # what the JSON decoder gives: the common case checked at once, without names
            driver, pool, device = item.get("driver"), item.get("pool"), item.get("device")
            request, admin = item.get("request"), item.get("adminAccess")
            if (type(driver) is str and type(pool) is str and type(device) is str and type(request) is str
                    and (admin is None or type(admin) is bool)):
                out.append(Result(driver, pool, device, request, admin is True))
                continue
        at = f"{where}.results[{i}]"  # a missing field, or one of another type: named, or defaulted when null
        r = _object(ref, at, item)
        out.append(Result(_member(ref, r, at, "driver", str, ""), _member(ref, r, at, "pool", str, ""),
                          _member(ref, r, at, "device", str, ""), _member(ref, r, at, "request", str, ""),
                          _member(ref, r, at, "adminAccess", bool, False)))
    return tuple(out)


def _applies(requests: Sequence[str], result_request: str) -> bool:
    # A config lists requests by name; "req" covers its subrequests, "req/sub" only that subrequest.
    if not requests:
        return True
    return result_request in requests or result_request.split("/", 1)[0] in requests


def _configs(allocation: Mapping[str, Any], ref: ClaimRef, driver: str, spec: InstanceSpec
             ) -> list[tuple[tuple[str, ...], OpaqueConfig]]:
    devices = _member(ref, allocation, "status.allocation", "devices", Mapping, {})
    listed = _member(ref, devices, "status.allocation.devices", "config", list, [])
    entries = [(i, _object(ref, f"status.allocation.devices.config[{i}]", e)) for i, e in enumerate(listed)]
    # FromClass before FromClaim; within a source the listed order; later entries win.
    entries.sort(key=lambda e: (0 if e[1].get("source") == "FromClass" else 1, e[0]))
    out = []
    for i, entry in entries:
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        at = f"status.allocation.devices.config[{i}]"
        requests = _member(ref, entry, at, "requests", list, [])
        for j, name in enumerate(requests):
            if type(name) is not str:
                raise _malformed(ref, f"{at}.requests[{j}]", name, "a request name")
        where = f"{at} ({shown(entry.get('source', 'unknown source'), 40)})"
        try:
            config = decode(opaque.get("parameters"))
            check_applies(config, spec)
        except ConfigError as e:
            raise ClaimError(Reason.BAD_CONFIG, f"{where}: {e}") from e
        out.append((tuple(requests), config))
    return out


def allocated_devices(claim: Claim, driver: str, pool: str, spec: InstanceSpec) -> tuple[AllocatedDevice, ...]:
    """The results of `driver` in `pool` (this node), checked as kubelet's drivers must (the helper checked the
    claim's UID and that it is allocated: Claim.checked)."""
    ref, allocation = claim.ref, claim.allocation
    results = results_of(allocation, ref)
    ours = [r for r in results if r.driver == driver]
    groups = member_groups(allocation, ours, ref, pool)
    if not ours:
        found = ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r in results[:8]) or "none"
        more = f" and {len(results) - 8} more" if len(results) > 8 else ""
        raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                         f"claim {ref} has no devices of driver {driver} (allocated: {capped(found)}{more})")
    elsewhere = sorted({r.pool for r in ours if r.pool != pool and r.pool not in groups})
    if elsewhere:
        raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                         f"claim {ref} is allocated to pool {capped(', '.join(elsewhere))}, not to this node's pool "
                         f"{pool}")
    by_request: dict[str, Result] = {}  # each request name once: results usually share a few
    for r in ours:
        by_request.setdefault(r.request, r)
    for name, r in by_request.items():  # the request name goes into CDI device names and ids
        parts = name.split("/")
        if len(parts) > 2 or not all(is_dns_label(p) for p in parts):
            raise _malformed(ref, f"status.allocation.devices.results[device {shown(r.device, 70)}].request",
                             name, f"a request name ({DNS_LABEL_RULE}), or request/subrequest")
    configs = _configs(allocation, ref, driver, spec)
    effective: dict[str, EffectiveConfig] = {}
    for name in by_request:
        merged = EffectiveConfig()
        for requests, config in configs:
            if _applies(requests, name):
                merged = merged.merged(config)
        effective[name] = merged
    return tuple(AllocatedDevice(r.request, r.device, r.admin_access, effective[r.request], groups.get(r.pool))
                 for r in ours)


# --- UltraServer group devices (docs/ultraserver.md §6) --------------------------------------------------------


def group_of(r: Result) -> GroupAllocation | None:
    """The group a result names (pool `ultraserver-<1|2|4>/<id>`, device `ultraserver`, or `ultraserver-half` in
    a size-2 pool, or `ultraserver-half-<0|1>` in the pool of its 4-node set where shared counters are served);
    None for any other result. Node pools are node names, which never contain '/'."""
    prefix, slash, server_id = r.pool.partition("/")
    if not slash:
        return None
    size_text = prefix.removeprefix(us.POOL_PREFIX)
    if prefix == size_text or not server_id or size_text not in {str(m) for m in us.MODES}:
        return None
    size = int(size_text)
    if size == 4 and r.device in (f"{us.HALF_DEVICE}-0", f"{us.HALF_DEVICE}-1"):
        return GroupAllocation(r.pool, 2, server_id, int(r.device[-1]))
    if r.device != us.WHOLE_DEVICE and not (r.device == us.HALF_DEVICE and size == 2):
        return None
    return GroupAllocation(r.pool, size, server_id)


def member_groups(allocation: Mapping[str, Any], ours: Sequence[Result], ref: ClaimRef, node: str
                  ) -> dict[str, GroupAllocation]:
    """The group pools among `ours`, checked to include this node: the allocation's node selector (copied by the
    scheduler from the group slice) must name `node` by its `kubernetes.io/hostname` label, which kubelet sets to
    the node name (the driver's pool name) unless overridden. NOT_FOR_THIS_NODE otherwise."""
    groups = {g.pool: g for g in (group_of(r) for r in ours) if g is not None}
    if not groups:
        return groups
    selector = _member(ref, allocation, "status.allocation", "nodeSelector", Mapping, {})
    try:
        members = us.selected_nodes(selector)
    except (AttributeError, TypeError) as e:  # a term or requirement that is not an object
        raise _malformed(ref, "status.allocation.nodeSelector", selector, "a node selector") from e
    if node not in members:
        shown_members = ", ".join(members[:8]) or "none"
        raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                         f"claim {ref}: node {node} is not a member of UltraServer group "
                         f"{capped(', '.join(sorted(groups)))} (its node selector names {capped(shown_members)} by "
                         f"{us.HOSTNAME_LABEL})")
    return groups


def _member_server_id(group: GroupAllocation, host: UltraServer) -> str:
    """This host's id for a set of the group's size, as model/ultraserver.py keys (and names) the set."""
    if group.size == 4:
        return host.server_id_4
    if group.size == 2:
        return host.server_id_2
    return f"{host.server_id_4}.{host.node_id_4}"


def prepare_groups(ref: ClaimRef, allocated: Sequence[AllocatedDevice], host: UltraServer | None,
                   instance_type: str) -> list[tuple[CdiDevice, PreparedDevice]]:
    """For each group device of the claim: the CDI device that gives the pod's containers the UltraServer
    environment of this node in that group (mode = the group's size, this host's server and node ids), and the
    answer for kubelet. The host's class files must put it in the group's set (NOT_FOR_THIS_NODE otherwise); a
    config's ultraserverMode other than the group's size is BAD_CONFIG."""
    out = []
    for a in allocated:
        group = a.group
        if group is None:
            continue
        where = f"claim {ref}, request {a.request!r}, UltraServer group {group.pool}"
        if host is None:
            raise ClaimError(Reason.NOT_FOR_THIS_NODE, f"{where}: this {instance_type} host has no UltraServer "
                                                       "class files (server_id_4, node_id_4, ...): not a member")
        own = _member_server_id(group, host) if group.half is None else host.server_id_4
        if group.half is not None and host.node_id_4 // 2 != group.half:
            raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                             f"{where}: this host is node {host.node_id_4} of its 4-node set (its class files), so "
                             f"in half {host.node_id_4 // 2}, not the group's half {group.half}: not a member")
        if us.sanitised_id(own) != group.server_id:
            raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                             f"{where}: this host's {group.size}-node set is {shown(own, 80)} (its class files), "
                             f"not the group's {shown(group.server_id, 80)}: not a member")
        if a.config.ultraserver_mode not in (None, group.size):
            raise ClaimError(Reason.BAD_CONFIG, f"{where}: ultraserverMode {a.config.ultraserver_mode} is not "
                                                f"allowed; allowed: {group.size} (the group's nodes) or unset")
        try:
            env = ultraserver_env(host, group.size, instance_type)
        except EnvError as e:
            raise ClaimError(Reason.BAD_CONFIG, f"{where}: {e}") from e
        device = CdiDevice(f"{ref.uid}-ultraserver-{a.request.replace('/', '.')}", env=env)
        out.append((device, PreparedDevice((a.request,), group.pool, a.device, (qualified_id(device.name),))))
    return out


def consumer_pods(claim: Mapping[str, Any], limit: int) -> tuple[tuple[str, ...], int]:
    """The pods in status.reservedFor (core group, resource `pods`; they are in the claim's namespace): the first
    `limit` names and how many more there are. Read leniently: it only names pods in metrics, so an entry of an
    unexpected shape is skipped rather than failing the prepare."""
    status = claim.get("status")
    reserved = status.get("reservedFor") if isinstance(status, Mapping) else None
    pods: list[str] = []
    for entry in reserved if isinstance(reserved, list) else ():
        if (isinstance(entry, Mapping) and entry.get("resource") == "pods" and entry.get("apiGroup", "") in ("", None)
                and isinstance(entry.get("name"), str) and 0 < len(entry["name"]) <= 253):
            pods.append(entry["name"])
    unique = list(dict.fromkeys(pods))
    return tuple(unique[:limit]), max(0, len(unique) - limit)
