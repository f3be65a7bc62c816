"""Which pod holds which Neuron devices and cores on this node, as Prometheus series (docs/metrics.md).

A collector, not gauges kept in step: every scrape reads the prepared claims as they are, so the series follow
prepare, unprepare and a restart with no hook to forget. Labels come from the checkpoint: the claim, the pods it
was reserved for (at most checkpoint.MAX_CONSUMERS, as consumers.py last re-read them), kubelet's request and
device names, and NeuronCore ids (NEURON_RT_VISIBLE_CORES numbering at the node's LNC, as neuron-monitor's).

Admin access (KEP-5018; neuron-monitor's claim, deploy/exporter.py) is no holding: a device prepared for a claim
with admin access gives no info series and counts as neither allocated device nor core. The checkpoint keeps no
flag for it; it is the device a claim has prepared but does not hold (its cores are not among the claim's held
cores: claims/state.py holds none for an `adminAccess` result, and the scheduler allocates such devices beside
their holders).

Cardinality: one info series per (claim, device, pod) and per (claim, NeuronCore, pod); devices and cores are held
exclusively, so a node carries at most its cores x MAX_CONSUMERS core series. MAX_SERIES caps both families
together; what a cap leaves out is counted, never silently lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from neuron_dra.driver.daemon.claims.checkpoint import ClaimState, PreparedClaim
from neuron_dra.driver.model.neuron_env import core_ranges
from neuron_dra.driver.model.partitions import CoreLayout, parse_core_device
from neuron_dra.driver.model.slices import NODE_DEVICE_NAME, device_name

MAX_SERIES = 4096  # info series (device and core together) per scrape of one node
NO_POD = ""  # the pod label of a claim prepared with no pod in reservedFor (or recorded before pods were)

Claims = Callable[[], Mapping[str, PreparedClaim]]
Taints = Callable[[], Mapping[str, tuple[Mapping[str, str], ...]]]
# uid -> (pods, how many more) re-read from the API server (consumers.py); the checkpoint's where absent
Consumers = Callable[[], Mapping[str, tuple[tuple[str, ...], int]]]


@dataclass(frozen=True)
class NodeDevices:
    """The node's Neuron devices (indexes) and its core layout: what the capacity and core series count."""

    indexes: tuple[int, ...]
    layout: CoreLayout

    def logical_cores(self, device: str, lnc: int | None = None) -> tuple[int, ...]:
        """The NeuronCore ids (NEURON_RT_VISIBLE_CORES numbering) a published device stands for, at the claim's
        LNC for whole devices (`lnc`, None: the node's; a core device is always at the node's)."""
        per = self.layout.physical_per_device // lnc if lnc else self.layout.logical_per_device
        core = parse_core_device(device)
        if core is not None:
            return (self.layout.global_core_id(*core),)
        if device == NODE_DEVICE_NAME:
            return tuple(i * per + c for i in self.indexes for c in range(per))
        for i in self.indexes:
            if device == device_name(i):
                return tuple(range(i * per, (i + 1) * per))
        return ()

    def physical_cores(self, device: str) -> set[int]:
        """The physical NeuronCores (global ids, as PreparedClaim.neuron_cores) a published device of this node
        stands for; none for any other name (an UltraServer group device)."""
        per = self.layout.physical_per_device
        core = parse_core_device(device)
        if core is not None:
            return {core[0] * per + p for p in self.layout.physical_cores(core[1])}
        indexes = self.indexes if device == NODE_DEVICE_NAME else [i for i in self.indexes if device == device_name(i)]
        return {i * per + p for i in indexes for p in range(per)}

    def held_physical(self, claim: PreparedClaim) -> set[int]:
        """The physical cores a claim holds (older entries: every core of its devices)."""
        if claim.neuron_cores is not None:
            return set(claim.neuron_cores)
        per = self.layout.physical_per_device
        return {i * per + p for i in claim.neuron_indexes for p in range(per)}

    def admin_access(self, claim: PreparedClaim, device: str) -> bool:
        """Was `device` prepared for `claim` with admin access: a device of this node the claim does not hold."""
        cores = self.physical_cores(device)
        return bool(cores) and not cores & self.held_physical(claim)

    def held_logical(self, claim: PreparedClaim) -> set[int]:
        """The logical cores a claim holds exclusively (from its physical cores; older entries: whole devices)."""
        if claim.neuron_cores is not None:
            return {p // self.layout.lnc for p in claim.neuron_cores}
        per = self.layout.logical_per_device
        return {i * per + c for i in claim.neuron_indexes for c in range(per)}


class AttributionCollector(Collector):
    def __init__(self, claims: Claims, node: str, devices: NodeDevices, taints: Taints | None = None,
                 max_series: int = MAX_SERIES, consumers: Consumers | None = None) -> None:
        self._claims = claims
        self._consumers = consumers
        self._node = node
        self._devices = devices
        self._taints = taints
        self._max_series = max_series

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []  # unchecked: the families are built per scrape

    def collect(self) -> Iterator[GaugeMetricFamily]:
        claims = self._claims()
        node = self._node
        device_info = GaugeMetricFamily(
            "neuron_dra_claim_device_info", "A device prepared for a claim, per pod the claim is reserved for; "
            "neuroncores: the NEURON_RT_VISIBLE_CORES ids it stands for",
            labels=["namespace", "pod", "claim", "request", "device", "neuroncores", "node"])
        core_info = GaugeMetricFamily(
            "neuron_dra_claim_neuroncore_info", "A NeuronCore prepared for a claim, per pod the claim is reserved "
            "for (joins neuron-monitor's neuroncore label)",
            labels=["namespace", "pod", "claim", "device", "neuroncore", "node"])
        series = 0
        dropped = 0
        omitted = 0
        completed = [c for c in claims.values() if c.state is ClaimState.PREPARE_COMPLETED]
        refreshed = self._consumers() if self._consumers is not None else {}
        for claim in sorted(completed, key=lambda c: (c.namespace, c.name, c.uid)):
            names, more = refreshed.get(claim.uid, (claim.consumers, claim.consumers_omitted))
            pods = names or (NO_POD,)
            omitted += more
            lnc = request_lnc(claim)
            for d in claim.devices:
                if self._devices.admin_access(claim, d.device_name):
                    continue  # neuron-monitor's view of the node: no holder (module docstring)
                cores = self._devices.logical_cores(d.device_name,
                                                    lnc.get(d.request_names[0]) if d.request_names else None)
                request = ",".join(d.request_names)
                for pod in pods:
                    if series + 1 + len(cores) > self._max_series:
                        dropped += 1 + len(cores)
                        continue
                    series += 1 + len(cores)
                    device_info.add_metric([claim.namespace, pod, claim.name, request, d.device_name,
                                            core_ranges(cores), node], 1)
                    for core in cores:
                        core_info.add_metric([claim.namespace, pod, claim.name, d.device_name, str(core), node], 1)
        yield device_info
        yield core_info
        yield from self._capacity(claims.values(), completed)
        yield from self._taint_series()
        yield _gauge("neuron_dra_attribution_pods_omitted", "Pods of prepared claims that the info series leave "
                     "out (beyond the pods recorded per claim)", node, omitted)
        yield _gauge("neuron_dra_attribution_series_dropped", "Info series left out of this scrape by the "
                     "per-node series cap", node, dropped)

    def _capacity(self, every: Iterable[PreparedClaim], completed: list[PreparedClaim]
                  ) -> Iterator[GaugeMetricFamily]:
        every = list(every)
        devices = self._devices
        held_devices = {i for c in every for i in c.neuron_indexes} & set(devices.indexes)
        held_cores: set[int] = set()
        for c in every:
            held_cores |= devices.held_logical(c)
        total_cores = len(devices.indexes) * devices.layout.logical_per_device
        held_cores_n = min(len(held_cores), total_cores)
        yield _states("neuron_dra_node_devices", "Neuron devices of this node: allocated (any core prepared for a "
                      "claim) or free", self._node, allocated=len(held_devices),
                      free=len(devices.indexes) - len(held_devices))
        yield _states("neuron_dra_node_neuroncores", "NeuronCores of this node at its LNC: allocated (prepared for a "
                      "claim) or free", self._node, allocated=held_cores_n, free=total_cores - held_cores_n)
        yield _states("neuron_dra_claims", "Claims in this node's checkpoint: prepared, or pending (a prepare "
                      "started and not completed)", self._node, prepared=len(completed),
                      pending=len(every) - len(completed))

    def _taint_series(self) -> Iterator[GaugeMetricFamily]:
        taints = self._taints() if self._taints is not None else {}
        tainted = GaugeMetricFamily("neuron_dra_device_tainted", "1 when the device carries a taint in this "
                                    "node's ResourceSlices, else 0", labels=["node", "device"])
        info = GaugeMetricFamily("neuron_dra_device_taint_info", "A taint on a device in this node's "
                                 "ResourceSlices", labels=["node", "device", "key", "effect"])
        for i in self._devices.indexes:
            name = device_name(i)
            on = taints.get(name, ())
            tainted.add_metric([self._node, name], 1 if on else 0)
            for t in on:
                info.add_metric([self._node, name, str(t.get("key", "")), str(t.get("effect", ""))], 1)
        yield tainted
        yield info


def request_lnc(claim: PreparedClaim) -> dict[str, int]:
    """request -> the LNC its container runs at (NEURON_LOGICAL_NC_CONFIG in the claim's CDI spec; a claim may
    set its own, docs/neuron-cores.md §2). Requests without it (families without LNC) are absent."""
    try:
        spec = json.loads(claim.cdi_spec)
    except ValueError:
        return {}
    out: dict[str, int] = {}
    prefix = f"{claim.uid}-request-"
    for device in spec.get("devices", []) if isinstance(spec, dict) else []:
        name = device.get("name", "") if isinstance(device, dict) else ""
        if not isinstance(name, str) or not name.startswith(prefix):
            continue
        for env in device.get("containerEdits", {}).get("env", []):
            key, _, value = str(env).partition("=")
            if key == "NEURON_LOGICAL_NC_CONFIG" and value in ("1", "2"):
                out[name[len(prefix):]] = int(value)
    return out


def _gauge(name: str, documentation: str, node: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, documentation, labels=["node"])
    g.add_metric([node], value)
    return g


def _states(name: str, documentation: str, node: str, **values: float) -> GaugeMetricFamily:
    """One family with a series per state (label `state`), in the order given."""
    g = GaugeMetricFamily(name, documentation, labels=["node", "state"])
    for state, value in values.items():
        g.add_metric([node, state], value)
    return g
