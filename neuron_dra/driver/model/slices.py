"""The ResourceSlice model: which devices, attributes and capacities the driver publishes for a host.

Drop-in compatible with AWS's Neuron DRA driver (same driver name, device names, attribute names,
types and topology group ids; docs/neuron-hardware.md §3-4), plus capacities, NUMA, PCI address,
family, topology kind and connected-group ids on every topology kind. This is the one model that the daemon
publishes and that the claim checks evaluate CEL against.

Nothing is published twice: the scheduler copies every attribute of a device into fresh maps on each CEL
evaluation, and more than 14 in one domain regrow Go's map once more (docs/scale.md §2). So no `numaNode`
beside the standard `resource.kubernetes.io/numaNode`, no `coreCount` beside the `cores` capacity, no
`topology1_id` beside `deviceId`, no `deviceName` (a function of `family`) and no `neighbors` (the catalog's
neighbours of `deviceId` for the `topologyKind`; the topology{N}_id groups are what claims constrain on);
docs/upgrades.md says what a claim that read them uses instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from neuron_dra.driver.model.devices import NeuronDevice, NeuronHost
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.driver.model.partitions import (
    MAX_COUNTER_SETS_PER_SLICE,
    CoreLayout,
    core_attributes,
    core_capacity,
    core_consumption,
    core_device_name,
    counter_set,
    whole_device_consumption,
)
from neuron_dra.driver.model.version import VERSION

AWS_DOMAIN = "resource.aws.com"
K8S_DOMAIN = "resource.kubernetes.io"
DEVICEGROUP_SIZES = (4, 8, 16)
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_TAINTED_SLICE = 64  # when any device of the slice has taints (docs/dra-api.md)
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_VALUE = 64
NEURON_DEVICE = "neuron_device"
NEURON_NODE = "neuron_node"
NODE_DEVICE_NAME = "neuron-node"

# EKS labels nodes with the EC2 instance topology; the driver copies them into attributes.
NETWORK_NODE_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3))
# Our node groups label Capacity Block nodes with their reservation id (components/nodegroup.py).
CAPACITY_BLOCK_LABEL = "neuron-dra/capacity-block-id"
# Without AWS's UltraServer operator, a node label assigns the node's devices to a workload (docs/trainium3.md §5).
WORKLOAD_LABEL = "neuron-dra/workload-id"
# The standard NUMA attribute of Kubernetes 1.37 (KEP-6072): the device's NUMA node.
STANDARD_NUMA_NODE = "resource.kubernetes.io/numaNode"

Attribute = dict[str, Any]  # {"int": 1} | {"bool": True} | {"string": "x"} | {"version": "1.2.3"}


@dataclass(frozen=True)
class NodeFacts:
    """What the node (not sysfs) tells about the host: its name and EC2 placement."""

    node_name: str
    network_node_layers: tuple[str, ...] = ()  # layer 1..3, from the node's labels
    capacity_block_id: str | None = None
    workload_id: str | None = None  # label neuron-dra/workload-id: AWS 1.2's workloadId without the operator

    @classmethod
    def from_labels(cls, node_name: str, labels: Mapping[str, str], capacity_block_id: str | None = None
                    ) -> NodeFacts:
        layers = tuple(labels[k] for k in NETWORK_NODE_LABELS if k in labels)
        block = capacity_block_id or labels.get(CAPACITY_BLOCK_LABEL)
        return cls(node_name, layers if len(layers) == 3 else (), block, labels.get(WORKLOAD_LABEL) or None)


@dataclass(frozen=True)
class PublishOptions:
    driver_name: str = DEFAULT_DRIVER_NAME
    dra_driver_version: str = VERSION
    cores: CoreLayout | None = None  # publish counters and NeuronCores (partitionable devices); None: devices only


@dataclass(frozen=True)
class PoolDevice:
    """One published device: name, attributes (qualified name -> typed value) and capacities."""

    name: str
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, str]  # name -> Quantity string
    index: int | None = None  # Neuron device index; None for the UltraServer pseudo-device
    taints: tuple[Mapping[str, str], ...] = ()  # DeviceTaint objects (taints.py)
    consumes_counters: tuple[Mapping[str, Any], ...] = ()  # DeviceCounterConsumption objects (partitions.py)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "attributes": {k: dict(v) for k, v in self.attributes.items()}}
        if self.capacity:
            out["capacity"] = {k: {"value": v} for k, v in self.capacity.items()}
        if self.consumes_counters:
            out["consumesCounters"] = [dict(c) for c in self.consumes_counters]
        if self.taints:
            out["taints"] = [dict(t) for t in self.taints]
        return out


@dataclass(frozen=True)
class Pool:
    """The devices one node publishes, as one pool named after the node."""

    driver: str
    node_name: str
    devices: tuple[PoolDevice, ...] = field(default_factory=tuple)
    counter_sets: tuple[Mapping[str, Any], ...] = ()  # CounterSet objects, published in slices of their own

    @property
    def name(self) -> str:
        return self.node_name


def devicegroup_id(efa_bdfs: Iterable[str]) -> str:
    """AWS's group hash: de-duplicated, string-sorted BDFs joined by ',', SHA-256, first 16 hex chars."""
    joined = ",".join(sorted(set(efa_bdfs)))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:16]


def device_name(index: int) -> str:
    return f"neuron-device-{index}"


def _int(v: int) -> Attribute:
    return {"int": v}


def _str(v: str) -> Attribute:
    if len(v) > MAX_STRING_VALUE:
        raise ValueError(f"attribute value {v!r} is longer than {MAX_STRING_VALUE} characters")
    return {"string": v}


def _format_quantity(n_bytes: int) -> str:
    for suffix, unit in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def _common_attributes(host: NeuronHost, facts: NodeFacts, options: PublishOptions, resource_type: str
                       ) -> dict[str, Attribute]:
    attrs: dict[str, Attribute] = {
        "instanceType": _str(host.instance_type),
        "neuronDriverVersion": _str(host.kernel_driver_version),
        "draDriverVersion": {"version": options.dra_driver_version},
        "resourceType": _str(resource_type),
        "family": _str(host.spec.family.name),
    }
    for i, layer in enumerate(facts.network_node_layers, start=1):
        attrs[f"networkNodeLayer{i}"] = _str(layer)
    if host.ultraserver is not None and facts.capacity_block_id:
        attrs["capacityBlockId"] = _str(facts.capacity_block_id)
    if host.ultraserver is not None:
        # AWS 1.2: ultraserverId is the capacity block id; without one, the host's UltraServer id from sysfs
        # (server_id_4), which is equal on the nodes of one UltraServer too (docs/trainium3.md §5).
        attrs["ultraserverId"] = _str(facts.capacity_block_id or host.ultraserver.server_id_4)
    if facts.workload_id:
        attrs["workloadId"] = _str(facts.workload_id)
    return attrs


def neuron_device_attributes(host: NeuronHost, dev: NeuronDevice, facts: NodeFacts, options: PublishOptions
                             ) -> dict[str, Attribute]:
    spec = host.spec
    attrs = _common_attributes(host, facts, options, NEURON_DEVICE)
    attrs["deviceId"] = _int(dev.index)
    attrs["topologyKind"] = _str(spec.topology.value)
    if spec.grid:
        # AWS's names: row (x), column (y), row id, id of the pair of rows.
        attrs["topology_x"] = _int(dev.index // 4)
        attrs["topology_y"] = _int(dev.index % 4)
    # topology{N}_id: connected, id-aligned groups of N. On the torus 4 and 8 are AWS's own ids;
    # the rest (16, ring segments) we add so every host answers topology claims. The group of one is the
    # device (deviceId; one device needs no constraint). All-to-all hosts publish none: any N devices of the
    # server are connected, so a connected request there needs no constraint (claim_templates Connected), and
    # grid ids would only mislead.
    if not spec.all_to_all:
        for n in spec.group_sizes():
            if n > 1:
                attrs[f"topology{n}_id"] = _int(dev.index // n)
    if dev.numa_node is not None:
        attrs[STANDARD_NUMA_NODE] = _int(dev.numa_node)
    if dev.pci_bdf is not None:
        attrs[f"{K8S_DOMAIN}/pciBusID"] = _str(dev.pci_bdf)
    if dev.efa_bdf is not None:
        attrs[f"{AWS_DOMAIN}/devicegroup1_id"] = _str(dev.efa_bdf)
        by_index = {d.index: d.efa_bdf for d in host.devices}
        for n in DEVICEGROUP_SIZES:
            group = dev.index // n
            members = [by_index[i] for i in range(group * n, group * n + n) if by_index.get(i)]
            attrs[f"{AWS_DOMAIN}/devicegroup{n}_id"] = _str(devicegroup_id(m for m in members if m))
    return attrs


def ultraserver_node_attributes(host: NeuronHost, facts: NodeFacts, options: PublishOptions
                                ) -> dict[str, Attribute]:
    us = host.ultraserver
    assert us is not None
    attrs = _common_attributes(host, facts, options, NEURON_NODE)
    attrs["ultraserverServerId2"] = _str(us.server_id_2)
    attrs["ultraserverServerId4"] = _str(us.server_id_4)
    attrs["ultraserverNodeId2"] = _int(us.node_id_2)
    attrs["ultraserverNodeId4"] = _int(us.node_id_4)
    if us.mode is not None:  # the size of the node's UltraServer set (1, 2 or 4): model/ultraserver.py groups by it
        attrs["ultraserverMode"] = _int(us.mode)
    attrs["deviceCount"] = _int(len(host.devices))
    return attrs


def build_pool(host: NeuronHost, facts: NodeFacts, options: PublishOptions | None = None) -> Pool:
    """Every device this node publishes (the UltraServer pseudo-device last)."""
    opts = options or PublishOptions()
    layout = opts.cores
    devices = []
    for dev in host.devices:
        capacity = {
            "cores": str(dev.physical_cores),
            "memory": _format_quantity(dev.memory_bytes),
        }
        consumes = (whole_device_consumption(dev.index, layout),) if layout else ()
        devices.append(PoolDevice(device_name(dev.index), neuron_device_attributes(host, dev, facts, opts),
                                  capacity, dev.index, consumes_counters=consumes))
    counter_sets: tuple[Mapping[str, Any], ...] = ()
    if layout is not None:
        # Beside the whole devices, one device per logical core (docs/neuron-cores.md §3); same index.
        whole = list(devices)
        for pd in whole:
            assert pd.index is not None
            for logical in range(layout.logical_per_device):
                devices.append(PoolDevice(core_device_name(pd.index, logical),
                                          core_attributes(pd.attributes, pd.index, logical, layout),
                                          core_capacity(layout), pd.index,
                                          consumes_counters=(core_consumption(pd.index, logical, layout),)))
        counter_sets = tuple(counter_set(d.index, layout) for d in host.devices)
    if host.ultraserver is not None:
        devices.append(PoolDevice(NODE_DEVICE_NAME, ultraserver_node_attributes(host, facts, opts), {}))
    for pd in devices:
        used = len(pd.attributes) + len(pd.capacity)
        if used > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise ValueError(f"device {pd.name} has {used} attributes + capacities; the API allows "
                             f"{MAX_ATTRIBUTES_AND_CAPACITIES}")
    return Pool(opts.driver_name, facts.node_name, tuple(devices), counter_sets)


def with_taints(pool: Pool, taints: Mapping[str, tuple[Mapping[str, str], ...]]) -> Pool:
    """The pool with these taints (device name -> taints) on its devices, and none on the others. A Neuron
    device's taints also go on the devices carved from it (its cores: same index)."""
    by_index = {d.index: taints[d.name] for d in pool.devices if d.index is not None and d.name in taints}

    def of(d: PoolDevice) -> tuple[Mapping[str, str], ...]:
        own = taints.get(d.name)
        if own is None and d.index is not None:
            own = by_index.get(d.index)
        return tuple(own or ())

    return replace(pool, devices=tuple(replace(d, taints=of(d)) for d in pool.devices))


def slice_device_chunks(pool: Pool) -> list[tuple[PoolDevice, ...]]:
    """Devices split into slices of at most 128 (64 when any has taints or consumes counters); an empty pool is
    still one slice."""
    devs = pool.devices
    if not devs:
        return [] if pool.counter_sets else [()]
    advanced = any(d.taints or d.consumes_counters for d in devs)
    size = MAX_DEVICES_PER_TAINTED_SLICE if advanced else MAX_DEVICES_PER_SLICE
    return [devs[i : i + size] for i in range(0, len(devs), size)]


def resource_slices(pool: Pool, generation: int = 0, node_uid: str | None = None) -> list[dict[str, Any]]:
    """The pool as `resource.k8s.io/v1` ResourceSlice objects (named by generateName, as the reference
    publisher does; owned by the Node when its UID is known)."""
    # Counter sets go in slices of their own (at most 8 sets each), before the device slices; every slice of the
    # pool carries the same generation and the total slice count.
    sets = pool.counter_sets
    counter_chunks = [sets[i : i + MAX_COUNTER_SETS_PER_SLICE] for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)]
    chunks = slice_device_chunks(pool)
    total = len(counter_chunks) + len(chunks)
    bodies: list[dict[str, Any]] = [{"sharedCounters": [dict(c) for c in cs]} for cs in counter_chunks]
    bodies += [{"devices": [d.to_api() for d in chunk]} for chunk in chunks]
    out = []
    for body in bodies:
        metadata: dict[str, Any] = {"generateName": f"{pool.node_name}-{pool.driver}-"}
        if node_uid is not None:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": pool.node_name, "uid": node_uid, "controller": True}
            ]
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": pool.driver,
                    "nodeName": pool.node_name,
                    "pool": {"name": pool.name, "generation": generation, "resourceSliceCount": total},
                    **body,
                },
            }
        )
    return out
