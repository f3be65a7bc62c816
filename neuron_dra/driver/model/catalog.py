"""The hardware catalog: what every supported Neuron instance type looks like.

This is the single description of the hardware that discovery validates hosts against, that
emulation writes fake hosts from, and that the claim checks and Pulumi components size from.
Source: docs/neuron-hardware.md §1 (hardware per instance type) and §4 (EFA wiring); Trainium3:
docs/trainium3.md.

A `Catalog` is a value: the built-in one is `BUILTIN`, a catalog file (driver/model/catalog_file.py,
docs/catalog-file.md) yields another one, and every consumer takes the catalog it should use as an
argument (default `BUILTIN`). Nothing is registered globally.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType

from neuron_dra.driver.errortext import did_you_mean

GIB = 1024**3


class TopologyKind(StrEnum):
    """How the Neuron devices of one host are linked."""

    SINGLE = "single"
    TORUS_4X4 = "torus4x4"
    RING = "ring"
    # Trainium3: every device of a server reaches every other through NeuronSwitch-v1; no grid, so no
    # row/column attributes (docs/trainium3.md §2).
    ALL_TO_ALL = "all-to-all"


# Kinds whose devices sit on a grid: AWS's topology_x/y and topology4/8_id mean something only there.
GRID_KINDS = frozenset({TopologyKind.TORUS_4X4})

HOW_TO_ADD = ("to add one, describe it in a catalog file (docs/catalog-file.md) and pass it with --catalog FILE "
              "(the driver daemon: --catalog or env NEURON_DRA_CATALOG)")


class UnknownInstanceTypeError(ValueError):
    """An instance type that is not in the catalog; names the known ones and how to add one."""

    def __init__(self, instance_type: str, known: Iterable[str] | None = None) -> None:
        self.instance_type = instance_type
        super().__init__(f"unknown Neuron instance type {instance_type!r}"
                         f"{unknown_type_text(instance_type, BUILTIN.types if known is None else known)}")


def unknown_type_text(instance_type: str, known: Iterable[str]) -> str:
    """What follows "unknown instance type 'x'" everywhere one is named (templates, `claims check`, node groups,
    the daemon): the closest known type, the known ones and how to add one."""
    names = sorted(known)
    hint = did_you_mean(instance_type, names)
    lead = f"{hint} Known" if hint else "; known"
    return f"{lead} instance types: {', '.join(names)}; {HOW_TO_ADD}"


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


def _trainium3(name: str) -> Family:
    # sysfs strings and PCI id from the kernel driver's v4 HAL (docs/trainium3.md §1, §3).
    return Family(name, "Trainium3", "NDv4", "Trn3", 0x7564, 8, 144 * GIB, True, 2, "NeuronCore-v4")


_BUILTIN_FAMILIES = (
    _trainium1("trn1"), _trainium1("trn1n"), _trainium2("trn2"), _trainium2("trn2u"), _inferentia2("inf2"),
    _trainium3("trn3"), _trainium3("trn3p"),
)
FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in _BUILTIN_FAMILIES})


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
class UltraServerShape:
    """How instances of a type group into UltraServers (docs/neuron-hardware.md §2, docs/trainium3.md §2)."""

    servers: int  # instances per UltraServer; the UltraServer modes 1, 2, 4 address groups of them
    generation: str = ""  # e.g. "Trn3 Gen1"; documentation only

    @property
    def modes(self) -> tuple[int, ...]:
        return tuple(m for m in (1, 2, 4) if m <= self.servers)


@dataclass(frozen=True)
class InstanceSpec:
    """One EC2 instance type with Neuron devices."""

    instance_type: str
    family: Family
    device_count: int
    topology: TopologyKind
    efa_count: int  # EFA interfaces (network cards with EFA) of the instance
    device_efa_bdfs: tuple[str, ...]  # per Neuron device; empty when devices have no EFA of their own
    ultraserver: UltraServerShape | None = None  # None: not an UltraServer type
    capacity_blocks: bool = False  # sold as EC2 Capacity Blocks for ML
    source: str = "built-in"  # where the entry comes from: built-in or a catalog file

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

    @property
    def all_to_all(self) -> bool:
        return self.topology is TopologyKind.ALL_TO_ALL

    @property
    def grid(self) -> bool:
        """Devices on a grid: AWS's topology_x/y and topology4/8_id apply."""
        return self.topology in GRID_KINDS

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
    All-to-all: every size up to the device count (any N devices of the server are connected).
    Single: 1.
    """
    if topology is TopologyKind.TORUS_4X4:
        return (1, 4, 8, 16)
    if topology is TopologyKind.ALL_TO_ALL:
        return tuple(range(1, device_count + 1))
    if topology is TopologyKind.RING:
        return tuple(n for n in range(1, device_count + 1) if device_count % n == 0)
    return (1,)


def _spec(instance_type: str, family: str, devices: int, topology: TopologyKind, efa: int,
          bdfs: tuple[str, ...] = (), ultraserver: UltraServerShape | None = None,
          capacity_blocks: bool = False) -> InstanceSpec:
    return InstanceSpec(instance_type, FAMILIES[family], devices, topology, efa, bdfs, ultraserver, capacity_blocks)


@dataclass(frozen=True)
class Catalog:
    """A set of instance types and the families they belong to; a value, passed where it is used."""

    specs: tuple[InstanceSpec, ...]
    families: tuple[Family, ...]
    sources: tuple[str, ...] = field(default=("built-in",))

    def __post_init__(self) -> None:
        names = [s.instance_type for s in self.specs]
        if len(set(names)) != len(names):
            twice = sorted(n for n in set(names) if names.count(n) > 1)
            raise ValueError(f"duplicate instance types in a catalog: {', '.join(twice)}")

    @cached_property
    def types(self) -> Mapping[str, InstanceSpec]:
        return MappingProxyType({s.instance_type: s for s in self.specs})

    @cached_property
    def family_map(self) -> Mapping[str, Family]:
        return MappingProxyType({f.name: f for f in self.families})

    def __repr__(self) -> str:
        # Short: the default of Args fields, shown by help() and pydoc (the whole catalog would be ~10 KB).
        return f"Catalog({len(self.specs)} instance types from {', '.join(self.sources)})"

    def __contains__(self, instance_type: object) -> bool:
        return instance_type in self.types

    def __iter__(self) -> Iterator[str]:
        return iter(self.types)

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.types)

    def unknown_type_text(self, instance_type: str) -> str:
        """The did-you-mean, the known types and how to add one, for an instance type not in this catalog."""
        return unknown_type_text(instance_type, self.types)

    def spec(self, instance_type: str) -> InstanceSpec:
        """The entry of an instance type; an unknown type names the known ones and how to add one."""
        try:
            return self.types[instance_type]
        except KeyError:
            raise UnknownInstanceTypeError(instance_type, self.types) from None

    def of_family(self, family: str) -> tuple[str, ...]:
        if family not in self.family_map:
            raise ValueError(f"unknown Neuron instance family {family!r}; known families: "
                             f"{', '.join(self.family_map)}")
        return tuple(t for t, s in self.types.items() if s.family.name == family)

    def extended(self, specs: Iterable[InstanceSpec], families: Iterable[Family], source: str) -> Catalog:
        """This catalog with `specs` and `families` added or replacing entries of the same name (in place)."""
        new_specs = {s.instance_type: s for s in self.specs}
        new_specs.update({s.instance_type: s for s in specs})
        new_families = {f.name: f for f in self.families}
        new_families.update({f.name: f for f in families})
        return Catalog(tuple(new_specs.values()), tuple(new_families.values()), (*self.sources, source))


TRN3_GEN1_ULTRASERVER = UltraServerShape(4, "Trn3 Gen1")

BUILTIN = Catalog(
    (
        _spec("trn1.2xlarge", "trn1", 1, TopologyKind.SINGLE, 0),
        _spec("trn1.32xlarge", "trn1", 16, TopologyKind.TORUS_4X4, 8, TRN1_EFA, capacity_blocks=True),
        _spec("trn1n.32xlarge", "trn1n", 16, TopologyKind.TORUS_4X4, 16, TRN1N_EFA),
        # trn2.3xlarge has one host-level EFA (inferred in the facts), not one per device.
        _spec("trn2.3xlarge", "trn2", 1, TopologyKind.SINGLE, 1),
        _spec("trn2.48xlarge", "trn2", 16, TopologyKind.TORUS_4X4, 16, TRN2_EFA, capacity_blocks=True),
        _spec("trn2u.48xlarge", "trn2u", 16, TopologyKind.TORUS_4X4, 16, TRN2_EFA,
              ultraserver=UltraServerShape(4, "Trn2"), capacity_blocks=True),
        _spec("inf2.xlarge", "inf2", 1, TopologyKind.SINGLE, 0),
        _spec("inf2.8xlarge", "inf2", 1, TopologyKind.SINGLE, 0),
        _spec("inf2.24xlarge", "inf2", 6, TopologyKind.RING, 0),
        _spec("inf2.48xlarge", "inf2", 12, TopologyKind.RING, 0),
        # Trainium3 (docs/trainium3.md). Trn3 EFA counts and wiring are not published: no per-device EFA map
        # (so no resource.aws.com/devicegroup ids) and one EFA interface (network card 0, which every
        # EFA-capable type accepts) until AWS documents more; a catalog file overrides both (§4 there).
        _spec("trn3.48xlarge", "trn3", 16, TopologyKind.ALL_TO_ALL, 1, capacity_blocks=True),
        # The kernel driver's only UltraServer platform name for Trn3: 4 servers x 16 devices (Gen1).
        _spec("trn3p.48xlarge", "trn3p", 16, TopologyKind.ALL_TO_ALL, 1, ultraserver=TRN3_GEN1_ULTRASERVER,
              capacity_blocks=True),
    ),
    _BUILTIN_FAMILIES,
)

# Read-only views of the built-in catalog, for callers that never take a catalog file.
CATALOG: Mapping[str, InstanceSpec] = BUILTIN.types


def get_instance_spec(instance_type: str, catalog: Catalog = BUILTIN) -> InstanceSpec:
    """The catalog entry for an instance type; an unknown type lists the known ones."""
    return catalog.spec(instance_type)


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


def all_to_all_neighbours(device: int, count: int) -> tuple[int, ...]:
    """Every other device of the server, ascending."""
    return tuple(i for i in range(count) if i != device)


def expected_neighbours(spec: InstanceSpec, device: int) -> tuple[int, ...]:
    if spec.topology is TopologyKind.TORUS_4X4:
        return torus_neighbours(device)
    if spec.topology is TopologyKind.RING:
        return ring_neighbours(device, spec.device_count)
    if spec.topology is TopologyKind.ALL_TO_ALL:
        return all_to_all_neighbours(device, spec.device_count)
    return ()


def accepted_neighbours(spec: InstanceSpec, device: int) -> tuple[tuple[int, ...], ...]:
    """The `connected_devices` lists discovery accepts for a device.

    All-to-all hosts: every other device (what the fabric is), or the trn2 torus list that the kernel
    driver still reports for Trainium3 on 16-device hosts ("TODO PDS update" in fw_io_topology_v3), or
    nothing (docs/trainium3.md §3). Other kinds: exactly the catalog's neighbours.
    """
    want = expected_neighbours(spec, device)
    if spec.topology is not TopologyKind.ALL_TO_ALL:
        return (want,)
    out = [want, ()]
    if spec.device_count == 16:
        out.append(torus_neighbours(device))
    return tuple(out)
