"""The outcome of `neuron-dra demo`: pod -> node -> devices -> core ranges, next to what the claim check predicted.

Built from a record of each running pod (run.DemoRun.record: the devices of each claim on the pod's node, and
the containers' environment as the node's fake runtime recorded it at CreateContainer) and the check reports of
the templates. Pure functions, so the table and the topology views can be tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.claim_templates import CheckReport
from neuron_dra.driver.model.neuron_env import core_ranges
from neuron_dra.driver.model.partitions import parse_core_device
from neuron_dra.localcluster.demo.topology_view import NodeView
from neuron_dra.localcluster.nodes.topology import NodeSpec

NEURON_DEVICE_PREFIX = "neuron-device-"
EFA_DEVICE_PREFIX = "efa-"
ULTRASERVER_ENV = "NEURON_RT_ULTRASERVER_"  # MODE, SERVER_ID, NODE_ID (docs/ultraserver.md §6)


class ReportError(ValueError):
    """A pod record the report cannot read (names the file and the field)."""


@dataclass(frozen=True)
class Prediction:
    """What the claim check predicted for a template on an empty node of one instance type."""

    claims_per_node: int
    requests: tuple[str, ...]  # request names of the first claim's devices
    neuron_devices: tuple[int, ...]  # device indexes of the first claim

    def describe(self) -> str:
        if not self.claims_per_node:
            return "does not fit"
        return (f"{self.claims_per_node}/node, {len(self.neuron_devices)} dev"
                + (f" {core_ranges(self.neuron_devices)}" if self.neuron_devices else ""))


@dataclass(frozen=True)
class PodOutcome:
    """Where one pod ran and what it got."""

    pod: str
    template: str
    node: str
    instance_type: str
    requests: tuple[str, ...]
    neuron_devices: tuple[int, ...]
    efa_devices: tuple[int, ...]
    visible_cores: str
    lnc: str  # NEURON_LOGICAL_NC_CONFIG, "" where the family has no LNC
    prediction: Prediction | None = None
    group: str = ""  # the UltraServer group pool of a shared job claim (`ultraserver-4/<id>`), "" without one
    group_nodes: tuple[str, ...] = ()  # the nodes the group's allocation selects
    ultraserver_env: Mapping[str, str] = field(default_factory=dict)  # NEURON_RT_ULTRASERVER_* of the container

    @property
    def ultraserver(self) -> str:
        """The table's cell: the group and this node's id in it, as the container's environment says."""
        if not self.group:
            return "-"
        node_id = self.ultraserver_env.get(f"{ULTRASERVER_ENV}NODE_ID", "?")
        return f"{self.group} node {node_id}"

    @property
    def matches_prediction(self) -> bool:
        """Same devices count and requests as the check's first claim, and an aligned block when that was one."""
        p = self.prediction
        if p is None or not p.claims_per_node:
            return False
        return (len(self.neuron_devices) == len(p.neuron_devices) and set(self.requests) == set(p.requests)
                and (aligned_block(self.neuron_devices) or not aligned_block(p.neuron_devices)))


def aligned_block(indexes: Sequence[int]) -> bool:
    """Contiguous and starting at a multiple of its length: a torus row or rows, a ring segment, a whole node."""
    ordered = sorted(indexes)
    return bool(ordered) and ordered == list(range(ordered[0], ordered[0] + len(ordered))) \
        and ordered[0] % len(ordered) == 0


def _index(device: str, prefix: str, where: str) -> int:
    try:
        return int(device.removeprefix(prefix))
    except ValueError:
        raise ReportError(f"{where}: device {device!r} is not named {prefix}N") from None


def _device_of(device: str) -> int:
    """The Neuron device index of a whole device or of one of its NeuronCores."""
    core = parse_core_device(device)
    return core[0] if core is not None else int(device.removeprefix(NEURON_DEVICE_PREFIX))


def outcome_from_record(record: Mapping[str, Any], template: str, instance_type: str,
                        where: str = "record") -> PodOutcome:
    """A PodOutcome from a pod record (see DemoRun.record)."""
    try:
        claims = record["claims"]
        env = record["containers"]["main"]["env"]
    except (KeyError, TypeError) as e:
        raise ReportError(f"{where}: missing field {e}") from None
    neuron: list[int] = []
    efa: list[int] = []
    requests: list[str] = []
    for claim in claims.values():
        for dev in claim.get("devices", ()):
            name = str(dev.get("device", ""))
            core = parse_core_device(name)
            if core is not None:  # a NeuronCore: its device, once (docs/neuron-cores.md)
                if core[0] not in neuron:
                    neuron.append(core[0])
                requests.extend(r for r in dev.get("requestNames", ()) if r not in requests)
            elif name.startswith(NEURON_DEVICE_PREFIX):
                neuron.append(_index(name, NEURON_DEVICE_PREFIX, where))
                requests.extend(r for r in dev.get("requestNames", ()) if r not in requests)
            elif name.startswith(EFA_DEVICE_PREFIX):
                efa.append(_index(name, EFA_DEVICE_PREFIX, where))
    groups = record.get("groups") or ()
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
        raise ReportError(f"{where}: groups {groups!r} is not a list of group allocations")
    group = groups[0] if groups else {}
    return PodOutcome(pod=str(record.get("pod")), template=template, node=str(record.get("node")),
                      instance_type=instance_type, requests=tuple(requests), neuron_devices=tuple(sorted(neuron)),
                      efa_devices=tuple(sorted(efa)), visible_cores=str(env.get("NEURON_RT_VISIBLE_CORES", "")),
                      lnc=str(env.get("NEURON_LOGICAL_NC_CONFIG", "")), group=str(group.get("pool", "")),
                      group_nodes=tuple(str(n) for n in group.get("nodes") or ()),
                      ultraserver_env={str(k): str(v) for k, v in env.items() if str(k).startswith(ULTRASERVER_ENV)})


def prediction(report: CheckReport, instance_type: str) -> Prediction:
    fit = report.fit(instance_type)
    neuron = sorted({_device_of(d.device) for d in fit.devices if d.device.startswith(NEURON_DEVICE_PREFIX)})
    requests = tuple(dict.fromkeys(d.request for d in fit.devices if d.device.startswith(NEURON_DEVICE_PREFIX)))
    return Prediction(fit.claims_per_node, requests, tuple(neuron))


HEADERS = ("POD", "TEMPLATE", "NODE", "REQUEST", "NEURON DEVICES", "EFA", "VISIBLE CORES", "LNC", "ULTRASERVER",
           "CHECK PREDICTED", "AS PREDICTED")


def format_table(outcomes: Sequence[PodOutcome]) -> str:
    rows = [HEADERS]
    for o in outcomes:
        rows.append((o.pod, o.template, o.node, ",".join(o.requests) or "-", core_ranges(o.neuron_devices) or "-",
                     core_ranges(o.efa_devices) or "-", o.visible_cores or "-", o.lnc or "-", o.ultraserver,
                     o.prediction.describe() if o.prediction else "-",
                     "yes" if o.matches_prediction else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows) + "\n"


def node_views(nodes: Sequence[NodeSpec], outcomes: Sequence[PodOutcome]) -> list[NodeView]:
    """Each node with its devices marked by the pod that holds them, its UltraServer and the group device its job
    pod shares."""
    views = []
    for node in nodes:
        owners: dict[int, str] = {}
        for o in outcomes:
            for i in o.neuron_devices if o.node == node.name else ():
                # pods sharing a device through its NeuronCores: both named
                owners[i] = f"{owners[i]}+{o.pod}" if i in owners else o.pod
        groups = sorted({o.group for o in outcomes if o.node == node.name and o.group})
        views.append(NodeView(node.name, node.instance_type, owners, ultraserver=node.ultraserver,
                              ultraserver_node=node.ultraserver_node, group=", ".join(groups)))
    return views


def node_usage(nodes: Sequence[NodeSpec], outcomes: Sequence[PodOutcome], device_counts: Mapping[str, int]) -> str:
    """One line per node: devices in use out of the node's devices, and by which pods."""
    lines = []
    for node in nodes:
        mine = [o for o in outcomes if o.node == node.name]
        used = len({i for o in mine for i in o.neuron_devices})  # a device shared by core pods counts once
        pods = ", ".join(f"{o.pod} ({len(o.neuron_devices)})" for o in mine) or "no pods"
        lines.append(f"  {node.name}: {used}/{device_counts[node.instance_type]} Neuron devices: {pods}")
    return "\n".join(lines) + "\n"


def job_summary(job: str, nodes: int, outcomes: Sequence[PodOutcome]) -> str:
    """What an UltraServer job got, checked: its `nodes` pods share one group device, run one per node on exactly
    the nodes the group selects, and each container has the UltraServer environment of its node (one server id,
    the node ids 0..nodes-1, mode `nodes`). A ReportError says what differs."""
    mine = [o for o in outcomes if o.group]
    where = f"UltraServer job {job}"
    if len(mine) != nodes or len(outcomes) != nodes:
        raise ReportError(f"{where}: {len(mine)} of its {len(outcomes)} pods hold a group device; wanted {nodes}")
    pools = {o.group for o in mine}
    placed = sorted(o.node for o in mine)
    selected = {o.group_nodes for o in mine}
    servers = {o.ultraserver_env.get(f"{ULTRASERVER_ENV}SERVER_ID", "") for o in mine}
    modes = {o.ultraserver_env.get(f"{ULTRASERVER_ENV}MODE", "") for o in mine}
    node_ids = sorted(o.ultraserver_env.get(f"{ULTRASERVER_ENV}NODE_ID", "") for o in mine)
    if len(pools) != 1:
        raise ReportError(f"{where}: its pods hold groups {sorted(pools)}; wanted one")
    if len(set(placed)) != nodes or selected != {tuple(placed)}:
        raise ReportError(f"{where}: pods on {placed}, the group selects {sorted(selected)}; wanted one pod on each "
                          "selected node")
    if len(servers) != 1 or "" in servers or modes != {str(nodes)} or node_ids != [str(i) for i in range(nodes)]:
        raise ReportError(f"{where}: the containers' UltraServer environment has server ids {sorted(servers)}, modes "
                          f"{sorted(modes)}, node ids {node_ids}; wanted one server id, mode {nodes}, node ids 0 to "
                          f"{nodes - 1}")
    (pool,) = pools
    per_pod = ", ".join(f"{o.pod} -> {o.node} (node {o.ultraserver_env[f'{ULTRASERVER_ENV}NODE_ID']})"
                        for o in sorted(mine, key=lambda o: o.pod))
    return (f"UltraServer job {job}: {nodes} pods share the claim of one group device ({pool}: "
            f"{', '.join(placed)}), one pod per node, every container in UltraServer mode {nodes} of server "
            f"{next(iter(servers))}: {per_pod}")
