"""The hardware catalog: what every supported Neuron instance type looks like.

This is the single description of the hardware that discovery validates hosts against, that
emulation writes fake hosts from, and that the claim checks and Pulumi components size from.
Source: docs/neuron-hardware.md §1 (hardware per instance type) and §4 (EFA wiring).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

GIB = 1024**3


class TopologyKind(StrEnum):
    """How the Neuron devices of one host are linked."""

    SINGLE = "single"
    TORUS_4X4 = "torus4x4"
    RING = "ring"


class UnknownInstanceTypeError(ValueError):
    """An instance type that is not in the catalog."""

    def __init__(self, instance_type: str) -> None:
        self.instance_type = instance_type
        known = ", ".join(sorted(CATALOG))
        super().__init__(f"unknown Neuron instance type {instance_type!r}; known instance types: {known}")


@dataclass(frozen=True)
class Family:
    """What all instance types of one Neuron family share."""

    name: str  # trn1, trn1n, trn2, trn2u, inf2
    device_name: str  # sysfs info/architecture/device_name
    arch_type: str  # sysfs info/architecture/arch_type
    arch_instance_type: str  # sysfs info/architecture/instance_type
    pci_device_id: int
    physical_cores_per_device: int
    hbm_bytes_per_device: int
    lnc_supported: bool  # Logical NeuronCores apply to Trainium2 and later only
    default_lnc: int
    core_generation: str


def _trainium1(name: str) -> Family:
    return Family(name, "Trainium1", "NDv2", "Trn1", 0x7164, 2, 32 * GIB, False, 1, "NeuronCore-v2")


def _trainium2(name: str) -> Family:
    return Family(name, "Trainium2", "NDv3", "Trn2", 0x7364, 8, 96 * GIB, True, 2, "NeuronCore-v3")


def _inferentia2(name: str) -> Family:
    return Family(name, "Inferentia2", "NDv2", "Inf2", 0x7264, 2, 32 * GIB, False, 1, "NeuronCore-v2")


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "trn1": _trainium1("trn1"),
        "trn1n": _trainium1("trn1n"),
        "trn2": _trainium2("trn2"),
        "trn2u": _trainium2("trn2u"),
        "inf2": _inferentia2("inf2"),
    }
)


def _bdfs(buses: str, fmt: str) -> tuple[str, ...]:
    return tuple(fmt.format(b) for b in buses.split())


# Neuron device index -> PCI address (BDF) of the EFA interface it is wired to (docs/neuron-hardware.md §4).
TRN1_EFA = _bdfs(
    "10:1a 10:1a a0:1a a0:1a 20:19 20:19 90:19 90:19 20:1a 20:1a 90:1a 90:1a 10:19 10:19 a0:19 a0:19",
    "0000:{}.0",
)
TRN1N_EFA = _bdfs(
    "10:17 10:1a a0:17 a0:1a 20:19 20:18 90:19 90:18 20:17 20:1a 90:17 90:1a 10:19 10:18 a0:19 a0:18",
    "0000:{}.0",
)
TRN2_EFA = _bdfs("c9 b4 b3 ca 6c 57 56 6d 98 83 82 99 f5 e0 df f6", "0000:{}:00.0")


@dataclass(frozen=True)
class InstanceSpec:
    """One EC2 instance type with Neuron devices."""

    instance_type: str
    family: Family
    device_count: int
    topology: TopologyKind
    efa_count: int  # EFA interfaces (network cards with EFA) of the instance
    device_efa_bdfs: tuple[str, ...]  # per Neuron device; empty when devices have no EFA of their own
    ultraserver: bool = False
    capacity_blocks: bool = False  # sold as EC2 Capacity Blocks for ML

    @property
    def physical_cores_per_device(self) -> int:
        return self.family.physical_cores_per_device

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.family.hbm_bytes_per_device

    @property
    def lnc_supported(self) -> bool:
        return self.family.lnc_supported

    @property
    def has_device_efa(self) -> bool:
        return bool(self.device_efa_bdfs)

    def group_sizes(self) -> tuple[int, ...]:
        """Sizes of the connected device groups this host offers (aligned on device ids)."""
        return connected_group_sizes(self.topology, self.device_count)

    def logical_cores_per_device(self, lnc: int | None = None) -> int:
        lnc = self.family.default_lnc if lnc is None else lnc
        return self.family.physical_cores_per_device // lnc


def connected_group_sizes(topology: TopologyKind, device_count: int) -> tuple[int, ...]:
    """The connected, id-aligned group sizes of a host.

    Torus: 1, one row of 4, two adjacent rows of 8, the whole 16 (what AWS's driver supports).
    Ring: every divisor of the ring length, since d // n groups are contiguous ring segments.
    Single: 1.
    """
    if topology is TopologyKind.TORUS_4X4:
        return (1, 4, 8, 16)
    if topology is TopologyKind.RING:
        return tuple(n for n in range(1, device_count + 1) if device_count % n == 0)
    return (1,)


def _spec(instance_type: str, family: str, devices: int, topology: TopologyKind, efa: int,
          bdfs: tuple[str, ...] = (), **kw: bool) -> InstanceSpec:
    return InstanceSpec(instance_type, FAMILIES[family], devices, topology, efa, bdfs, **kw)


CATALOG: Mapping[str, InstanceSpec] = MappingProxyType(
    {
        s.instance_type: s
        for s in (
            _spec("trn1.2xlarge", "trn1", 1, TopologyKind.SINGLE, 0),
            _spec("trn1.32xlarge", "trn1", 16, TopologyKind.TORUS_4X4, 8, TRN1_EFA, capacity_blocks=True),
            _spec("trn1n.32xlarge", "trn1n", 16, TopologyKind.TORUS_4X4, 16, TRN1N_EFA),
            # trn2.3xlarge has one host-level EFA (inferred in the facts), not one per device.
            _spec("trn2.3xlarge", "trn2", 1, TopologyKind.SINGLE, 1),
            _spec("trn2.48xlarge", "trn2", 16, TopologyKind.TORUS_4X4, 16, TRN2_EFA, capacity_blocks=True),
            _spec("trn2u.48xlarge", "trn2u", 16, TopologyKind.TORUS_4X4, 16, TRN2_EFA, ultraserver=True,
                  capacity_blocks=True),
            _spec("inf2.xlarge", "inf2", 1, TopologyKind.SINGLE, 0),
            _spec("inf2.8xlarge", "inf2", 1, TopologyKind.SINGLE, 0),
            _spec("inf2.24xlarge", "inf2", 6, TopologyKind.RING, 0),
            _spec("inf2.48xlarge", "inf2", 12, TopologyKind.RING, 0),
        )
    }
)


def get_instance_spec(instance_type: str) -> InstanceSpec:
    """The catalog entry for an instance type; an unknown type lists the known ones."""
    try:
        return CATALOG[instance_type]
    except KeyError:
        raise UnknownInstanceTypeError(instance_type) from None


def instance_types_of_family(family: str) -> tuple[str, ...]:
    if family not in FAMILIES:
        raise ValueError(f"unknown Neuron instance family {family!r}; known families: {', '.join(FAMILIES)}")
    return tuple(t for t, s in CATALOG.items() if s.family.name == family)


def torus_neighbours(device: int) -> tuple[int, ...]:
    """Neighbours of a device in the 4x4 torus, in the order sysfs `connected_devices` lists them.

    Order (up, left, down, right): device 0 reads `12, 3, 4, 1`, device 5 reads `1, 4, 9, 6`.
    """
    row, col = divmod(device, 4)
    return ((device - 4) % 16, row * 4 + (col - 1) % 4, (device + 4) % 16, row * 4 + (col + 1) % 4)


def ring_neighbours(device: int, length: int) -> tuple[int, ...]:
    """Neighbours on a ring with wrap (inf2): previous then next."""
    if length == 1:
        return ()
    if length == 2:
        return (1 - device,)
    return ((device - 1) % length, (device + 1) % length)


def expected_neighbours(spec: InstanceSpec, device: int) -> tuple[int, ...]:
    if spec.topology is TopologyKind.TORUS_4X4:
        return torus_neighbours(device)
    if spec.topology is TopologyKind.RING:
        return ring_neighbours(device, spec.device_count)
    return ()
