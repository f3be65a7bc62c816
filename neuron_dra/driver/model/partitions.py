"""NeuronCore partitions: the counters and the core devices the driver publishes beside whole devices.

On clusters with partitionable devices (resource.k8s.io/v1 `sharedCounters` / `consumesCounters`, beta and on
in Kubernetes 1.36) each Neuron device gets a counter set of its own: one counter per physical core
(`core0` .. `coreN`, value 1) and its HBM (`memory`). The whole device consumes all of them; each published
core, one logical NeuronCore at the node's LNC, consumes the counters of its physical cores and its share of
the HBM. A core and its whole device can therefore never both be allocated, and two cores never overlap, by
construction of the counters (docs/neuron-cores.md §3).

Larger core groups are not devices of their own: a claim for n cores asks for n core devices with one
`matchAttribute` on `coreGroup{n}_id`, which names the aligned, contiguous group of n logical cores a core
belongs to. So every group is a single inclusive range of NEURON_RT_VISIBLE_CORES ids (the only forms the
runtime documents, docs/neuron-cores.md §1), aligned on its size inside one device (docs/neuron-cores.md §2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.driver.model.catalog import InstanceSpec
from neuron_dra.driver.model.config import LNC_ALLOWED, LNC_VALUES
from neuron_dra.driver.model.k8s_names import NEURON_CORE

LNC_FILE = "opt/aws/neuron/logical_nc_config"  # below the host root; what EKS's launch template writes
MEMORY_COUNTER = "memory"
MAX_COUNTER_SETS_PER_SLICE = 8  # resource.k8s.io/v1 ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet (also per consumption)

_LNC_LINE = re.compile(r"^\s*NEURON_LOGICAL_NC_CONFIG\s*=\s*(\S*)\s*$")
_CORE_DEVICE = re.compile(r"^neuron-device-(\d+)-core-(\d+)$")


class PartitionError(ValueError):
    """A node LNC setting this driver cannot use; names the source, the value and what is allowed."""


@dataclass(frozen=True)
class CoreLayout:
    """How the node's devices split into published cores: the node's LNC and the device size."""

    lnc: int  # physical cores per logical core (1 on families without LNC)
    physical_per_device: int
    memory_per_device: int  # bytes of HBM

    def __post_init__(self) -> None:
        if self.lnc < 1 or self.physical_per_device % self.lnc:
            raise PartitionError(f"LNC {self.lnc} does not divide the {self.physical_per_device} physical cores of "
                                 f"a device; allowed: {LNC_ALLOWED}")
        if self.physical_per_device + 1 > MAX_COUNTERS_PER_SET:
            raise PartitionError(f"{self.physical_per_device} cores per device need more than "
                                 f"{MAX_COUNTERS_PER_SET} counters")

    @classmethod
    def for_spec(cls, spec: InstanceSpec, lnc: int | None = None) -> CoreLayout:
        """The layout of an instance type at `lnc` (None: the family's default; 1 where LNC does not apply)."""
        if not spec.lnc_supported:
            lnc = 1
        elif lnc is None:
            lnc = spec.family.default_lnc
        return cls(lnc, spec.physical_cores_per_device, spec.hbm_bytes_per_device)

    @property
    def logical_per_device(self) -> int:
        return self.physical_per_device // self.lnc

    @property
    def memory_per_core(self) -> int:
        return self.memory_per_device // self.logical_per_device

    def group_sizes(self) -> tuple[int, ...]:
        """Sizes n > 1 of the aligned core groups a claim can ask for: powers of two up to a whole device."""
        sizes, n = [], 2
        while n <= self.logical_per_device:
            if self.logical_per_device % n == 0:
                sizes.append(n)
            n *= 2
        return tuple(sizes)

    def claim_sizes(self) -> tuple[int, ...]:
        return (1, *self.group_sizes())

    def physical_cores(self, logical: int) -> range:
        """Physical cores (within the device) of logical core `logical`: LNC=2 pairs 2k, 2k+1."""
        return range(logical * self.lnc, (logical + 1) * self.lnc)

    def global_core_id(self, device_index: int, logical: int) -> int:
        """The NEURON_RT_VISIBLE_CORES id: device d owns d*c .. d*c+c-1, c = logical cores per device."""
        return device_index * self.logical_per_device + logical


def read_node_lnc(host_root: Path | None, spec: InstanceSpec, override: int | None = None) -> int:
    """The node's LNC: the flag, else `/opt/aws/neuron/logical_nc_config` (NEURON_LOGICAL_NC_CONFIG=N, as the EKS
    launch template writes it, docs/neuron-cores.md §2), else the family's default. Families without LNC: 1."""
    if not spec.lnc_supported:
        if override not in (None, 1):
            raise PartitionError(f"--lnc {override}: {spec.instance_type} ({spec.family.device_name}) has no "
                                 "Logical NeuronCores; allowed: 1 or leave it out")
        return 1
    if override is not None:
        if override not in LNC_VALUES:
            raise PartitionError(f"--lnc {override!r} is not allowed; allowed: {LNC_ALLOWED}")
        return override
    if host_root is None:
        return spec.family.default_lnc
    path = host_root / LNC_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return spec.family.default_lnc
    except OSError as e:
        raise PartitionError(f"{path}: cannot read it: {e}") from e
    value = None
    for line in text.splitlines():
        m = _LNC_LINE.match(line)
        if m:
            value = m.group(1)  # the last assignment wins, as when the file is sourced
    if value is None:
        return spec.family.default_lnc
    if value not in {str(v) for v in LNC_VALUES}:
        raise PartitionError(f"{path}: NEURON_LOGICAL_NC_CONFIG={value!r} is not allowed; allowed: {LNC_ALLOWED}")
    return int(value)


def counter_set_name(index: int) -> str:
    return f"neuron-device-{index}"


def core_counter(physical: int) -> str:
    return f"core{physical}"


def core_device_name(index: int, logical: int) -> str:
    return f"neuron-device-{index}-core-{logical}"


def parse_core_device(name: str) -> tuple[int, int] | None:
    """(device index, logical core) of a core device name; None for any other name."""
    m = _CORE_DEVICE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def format_quantity(n_bytes: int) -> str:
    for suffix, unit in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def counter_set(index: int, layout: CoreLayout) -> dict[str, Any]:
    """The counter set of Neuron device `index`, as in ResourceSlice `spec.sharedCounters[]`."""
    counters: dict[str, Any] = {core_counter(p): {"value": "1"} for p in range(layout.physical_per_device)}
    counters[MEMORY_COUNTER] = {"value": format_quantity(layout.memory_per_device)}
    return {"name": counter_set_name(index), "counters": counters}


def whole_device_consumption(index: int, layout: CoreLayout) -> dict[str, Any]:
    """What a whole device consumes: every counter of its set."""
    return {"counterSet": counter_set_name(index), "counters": counter_set(index, layout)["counters"]}


def core_consumption(index: int, logical: int, layout: CoreLayout) -> dict[str, Any]:
    counters: dict[str, Any] = {core_counter(p): {"value": "1"} for p in layout.physical_cores(logical)}
    counters[MEMORY_COUNTER] = {"value": format_quantity(layout.memory_per_core)}
    return {"counterSet": counter_set_name(index), "counters": counters}


# Attributes of the whole device a core does not repeat: they describe the device's links, not the core,
# and a core has room for 32 attributes and capacities only.
_NOT_ON_CORES = ("topologyKind", "topology_x", "topology_y")


def core_attributes(device_attributes: Mapping[str, Mapping[str, Any]], index: int, logical: int,
                    layout: CoreLayout) -> dict[str, Any]:
    """A core's attributes: its device's (deviceId, instanceType, topology and EFA group ids, ...) so the same
    selectors and constraints apply, then what makes it a core."""
    attrs = {k: dict(v) for k, v in device_attributes.items() if k not in _NOT_ON_CORES}
    global_id = layout.global_core_id(index, logical)
    attrs["resourceType"] = {"string": NEURON_CORE}
    attrs["coreIndex"] = {"int": logical}  # logical core within the device
    attrs["neuronCoreId"] = {"int": global_id}  # the NEURON_RT_VISIBLE_CORES id at the node's LNC
    attrs["lnc"] = {"int": layout.lnc}
    for n in layout.group_sizes():
        attrs[f"coreGroup{n}_id"] = {"int": global_id // n}
    return attrs


def core_capacity(layout: CoreLayout) -> dict[str, str]:
    return {"cores": str(layout.lnc), "memory": format_quantity(layout.memory_per_core)}
