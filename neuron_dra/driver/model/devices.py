"""The discovered host: Neuron devices as the driver sees them (values, no behaviour beyond arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_dra.driver.model.catalog import InstanceSpec


@dataclass(frozen=True)
class NeuronDevice:
    """One Neuron device (one `/dev/neuronN`)."""

    index: int
    physical_cores: int
    connected: tuple[int, ...]  # neighbour indexes in sysfs order
    serial_number: str
    major: int  # character device numbers of /dev/neuronN (major assigned at boot)
    minor: int
    memory_bytes: int  # HBM
    efa_bdf: str | None = None  # PCI address of the EFA wired to this device
    pci_bdf: str | None = None  # PCI address of the Neuron device itself (sysfs PCI link, else neuron-ls)
    numa_node: int | None = None  # of that PCI device (same sources)

    @property
    def dev_path(self) -> str:
        return f"/dev/neuron{self.index}"


@dataclass(frozen=True)
class UltraServer:
    """UltraServer membership of this host (class files under /sys/class/neuron_device)."""

    server_id_2: str
    server_id_4: str
    node_id_2: int
    node_id_4: int
    mode: int | None  # ultraserver_mode as configured on the host; None when the file is empty


@dataclass(frozen=True)
class NeuronLsReport:
    """What the host's neuron-ls said beyond sysfs, when discovery used it (docs/neuron-ls.md).

    `fields` are its top-level fields as printed (Neuron 2.34+ `--output-format json`: instance and UltraServer
    details; AWS has not published their names, so they are kept as given, nested objects flattened one level).
    """

    flags: str  # `--output-format json` (Neuron 2.34+) or `--json-output` (older tools)
    fields: tuple[tuple[str, str], ...] = ()

    def field(self, name: str) -> str | None:
        """A top-level field by name, or by its last part (`instance_type` finds `instance_info.instance_type`)."""
        for key, value in self.fields:
            if key == name or key.endswith("." + name):
                return value
        return None

    @property
    def ultraserver_fields(self) -> tuple[tuple[str, str], ...]:
        return tuple((k, v) for k, v in self.fields if "ultraserver" in k.lower())


@dataclass(frozen=True)
class NeuronHost:
    """A Neuron host: its catalog entry and what discovery read from it."""

    spec: InstanceSpec
    kernel_driver_version: str
    devices: tuple[NeuronDevice, ...]
    efa_bdfs: tuple[str, ...] = ()  # every EFA interface on the host, sorted
    ultraserver: UltraServer | None = None
    neuron_ls: NeuronLsReport | None = None  # None: neuron-ls missing, failed or disagreed with sysfs

    @property
    def instance_type(self) -> str:
        return self.spec.instance_type

    def device(self, index: int) -> NeuronDevice:
        for d in self.devices:
            if d.index == index:
                return d
        raise KeyError(f"no Neuron device {index} on this {self.instance_type} host")

    def global_core_ids(self, index: int, lnc: int | None = None) -> range:
        """Global NeuronCore ids of a device: device d owns d*c .. d*c+c-1, c = logical cores per device."""
        per_device = self.spec.logical_cores_per_device(lnc)
        return range(index * per_device, (index + 1) * per_device)
