"""Discovery: read a Neuron host from its sysfs (and neuron-ls when present) under a host root.

Every value is checked against the hardware catalog. A host whose sysfs contradicts the catalog is an error naming
the file and the value; nothing is guessed over. neuron-ls only adds to sysfs: when it is missing, fails, hangs or
prints what we do not expect, discovery logs one warning and publishes the devices from sysfs (docs/neuron-ls.md).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path, PurePosixPath

from neuron_dra.driver.model import neuron_ls
from neuron_dra.driver.model.catalog import (
    BUILTIN,
    Catalog,
    InstanceSpec,
    UnknownInstanceTypeError,
    accepted_neighbours,
)
from neuron_dra.driver.model.devices import NeuronDevice, NeuronHost, NeuronLsReport, UltraServer
from neuron_dra.driver.model.neuron_ls import normalize_bdf

log = logging.getLogger(__name__)

NEURON_DEVICE_DIR = "sys/devices/virtual/neuron_device"
NEURON_CLASS_DIR = "sys/class/neuron_device"
PRODUCT_NAME = "sys/devices/virtual/dmi/id/product_name"
KERNEL_DRIVER_VERSION = "sys/module/neuron/version"
EFA_DRIVER_DIR = "sys/bus/pci/drivers/efa"
ULTRASERVER_FILES = ("server_id_2", "server_id_4", "node_id_2", "node_id_4", "ultraserver_mode")

_VERSION4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_DEVICE_DIR = re.compile(r"^neuron(\d+)$")


class DiscoveryError(RuntimeError):
    """The host does not look like a Neuron host of a known type; names the file and the value."""

    def __init__(self, path: Path | str, problem: str, value: str | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.value = value
        shown = "" if value is None else f" (read {value!r})"
        super().__init__(f"{self.path}: {problem}{shown}")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise DiscoveryError(path, "missing file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DiscoveryError(path, f"unreadable: {e}") from e


def _read_int(path: Path, minimum: int = 0) -> int:
    text = _read(path)
    try:
        value = int(text, 10)
    except ValueError as e:
        raise DiscoveryError(path, "expected a decimal integer", text) from e
    if value < minimum:
        raise DiscoveryError(path, f"expected an integer >= {minimum}", text)
    return value


def _parse_index_list(path: Path, text: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(p.strip(), 10) for p in text.split(","))
    except ValueError as e:
        raise DiscoveryError(path, "expected comma-separated device indexes like '12, 3, 4, 1'", text) from e


def read_instance_type(root: Path, catalog: Catalog = BUILTIN) -> InstanceSpec:
    path = root / PRODUCT_NAME
    name = _read(path)
    try:
        return catalog.spec(name)
    except UnknownInstanceTypeError as e:
        raise DiscoveryError(path, str(e), name) from e


def read_kernel_driver_version(root: Path) -> str:
    path = root / KERNEL_DRIVER_VERSION
    version = _read(path)
    if not _VERSION4.match(version):
        raise DiscoveryError(path, "expected a 4-part version like 2.25.4.0", version)
    return version


def _device_indexes(root: Path) -> list[int]:
    base = root / NEURON_DEVICE_DIR
    if not base.is_dir():
        raise DiscoveryError(base, "missing directory: no Neuron kernel driver loaded, or not a Neuron host")
    indexes = sorted(int(m.group(1)) for p in base.iterdir() if (m := _DEVICE_DIR.match(p.name)))
    return indexes


def _read_dev_numbers(path: Path) -> tuple[int, int]:
    text = _read(path)
    parts = text.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise DiscoveryError(path, "expected MAJOR:MINOR", text)
    return int(parts[0]), int(parts[1])


def read_efa_bdfs(root: Path) -> tuple[str, ...]:
    """EFA interfaces bound to the efa PCI driver (entries named by PCI address)."""
    base = root / EFA_DRIVER_DIR
    if not base.is_dir():
        return ()
    found = []
    for p in base.iterdir():
        try:
            found.append(normalize_bdf(p.name))
        except ValueError:
            continue  # bind, unbind, new_id, module ... are not devices
    return tuple(sorted(found))


def read_ultraserver(root: Path) -> UltraServer | None:
    base = root / NEURON_CLASS_DIR
    present = [name for name in ULTRASERVER_FILES if (base / name).exists()]
    if not present:
        return None
    if len(present) != len(ULTRASERVER_FILES):
        missing = sorted(set(ULTRASERVER_FILES) - set(present))
        raise DiscoveryError(base / missing[0], "missing UltraServer class file (others are present)")
    mode_text = _read(base / "ultraserver_mode")
    mode: int | None = None
    if mode_text:
        if mode_text not in ("1", "2", "4"):
            raise DiscoveryError(base / "ultraserver_mode", "expected 1, 2 or 4", mode_text)
        mode = int(mode_text)
    node_id_2 = _read_int(base / "node_id_2")
    node_id_4 = _read_int(base / "node_id_4")
    if node_id_2 > 1:
        raise DiscoveryError(base / "node_id_2", "expected 0 or 1", str(node_id_2))
    if node_id_4 > 3:
        raise DiscoveryError(base / "node_id_4", "expected 0..3", str(node_id_4))
    return UltraServer(
        server_id_2=_read(base / "server_id_2"),
        server_id_4=_read(base / "server_id_4"),
        node_id_2=node_id_2,
        node_id_4=node_id_4,
        mode=mode,
    )


def read_pci_link(root: Path, index: int) -> tuple[str | None, int | None]:
    """PCI address and NUMA node of device `index` through its sysfs `device` link (docs/neuron-ls.md §3).

    (None, None) when the class device has no such link: the kernel driver's public source creates its class
    devices without a parent, so only neuron-ls knows the address there. The NUMA node is None where the kernel
    reports -1.
    """
    link = root / NEURON_CLASS_DIR / f"neuron{index}" / "device"
    if not link.is_symlink():
        return None, None
    target = os.readlink(link)
    try:
        bdf = normalize_bdf(PurePosixPath(target).name)
    except ValueError:
        raise DiscoveryError(link, "expected a link to a PCI device like ../../../0000:cc:00.0", target) from None
    path = link / "numa_node"
    if not path.exists():
        return bdf, None
    text = _read(path)
    if text == "-1":
        return bdf, None
    if not text.isdigit():
        raise DiscoveryError(path, "expected a NUMA node number or -1", text)
    return bdf, int(text)


def _neuron_ls_disagreement(out: neuron_ls.LsOutput, spec: InstanceSpec, devices: list[NeuronDevice]) -> str | None:
    """What in neuron-ls's answer contradicts sysfs or the catalog, or None."""
    listed = sorted(out.devices)
    if listed != [d.index for d in devices]:
        return f"lists devices {listed}, sysfs has neuron0..neuron{len(devices) - 1}"
    shown_type = NeuronLsReport(out.flags, out.fields).field("instance_type")
    if shown_type is not None and shown_type != spec.instance_type:
        return f"says instance type {shown_type!r}, the host's product_name says {spec.instance_type!r}"
    for dev in devices:
        ls = out.devices[dev.index]
        if set(ls.connected_to) != set(dev.connected):
            return (f"device {dev.index} connected_to {list(ls.connected_to)} disagrees with sysfs "
                    f"connected_devices {', '.join(map(str, dev.connected))!r}")
        if ls.memory_bytes != spec.hbm_bytes_per_device:
            return (f"device {dev.index} memory_size {ls.memory_bytes}; {spec.instance_type} devices have "
                    f"{spec.hbm_bytes_per_device}")
        if dev.pci_bdf is not None and ls.bdf != dev.pci_bdf:
            return f"device {dev.index} bdf {ls.bdf!r} disagrees with its sysfs PCI link {dev.pci_bdf!r}"
        if dev.pci_bdf is not None and None not in (ls.numa_node, dev.numa_node) and ls.numa_node != dev.numa_node:
            return f"device {dev.index} numa_node {ls.numa_node} disagrees with sysfs {dev.numa_node}"
    return None


def _with_neuron_ls(root: Path, spec: InstanceSpec, devices: list[NeuronDevice], timeout: float
                    ) -> tuple[list[NeuronDevice], NeuronLsReport | None]:
    """The devices completed by neuron-ls (PCI address and NUMA node where sysfs has no PCI link), or as they are
    with one warning saying why neuron-ls was not used."""
    exe = neuron_ls.find(root)
    problem: str
    if exe is None:
        problem = f"neuron-ls: not installed (no {root / neuron_ls.NEURON_LS})"
    else:
        try:
            out = neuron_ls.run(exe, timeout)
        except neuron_ls.NeuronLsError as e:
            problem = str(e)
        else:
            disagreement = _neuron_ls_disagreement(out, spec, devices)
            if disagreement is None:
                completed = [d if d.pci_bdf is not None else
                             replace(d, pci_bdf=out.devices[d.index].bdf, numa_node=out.devices[d.index].numa_node)
                             for d in devices]
                return completed, NeuronLsReport(out.flags, out.fields)
            problem = f"{exe} {out.flags}: {disagreement}"
    missing = "" if all(d.pci_bdf is not None for d in devices) else (
        " (without PCI addresses and NUMA nodes where sysfs has no PCI link)")
    log.warning("%s; publishing the %d Neuron devices from sysfs%s", problem, len(devices), missing)
    return devices, None


def _check_arch(spec: InstanceSpec, dev_dir: Path) -> None:
    arch = dev_dir / "info" / "architecture"
    expected = {
        "device_name": spec.family.device_name,
        "arch_type": spec.family.arch_type,
        "instance_type": spec.family.arch_instance_type,
    }
    for name, want in expected.items():
        got = _read(arch / name)
        if got != want:
            raise DiscoveryError(arch / name, f"{spec.instance_type} hosts have {want!r}", got)


def discover(host_root: Path | str = "/", *, use_neuron_ls: bool = True, catalog: Catalog = BUILTIN,
             neuron_ls_timeout: float = neuron_ls.TIMEOUT_S) -> NeuronHost:
    """Read the Neuron host under `host_root` and check it against `catalog`: sysfs first, then neuron-ls."""
    root = Path(host_root)
    spec = read_instance_type(root, catalog)
    version = read_kernel_driver_version(root)
    indexes = _device_indexes(root)
    base = root / NEURON_DEVICE_DIR
    if indexes != list(range(spec.device_count)):
        raise DiscoveryError(
            base,
            f"{spec.instance_type} has {spec.device_count} Neuron devices neuron0..neuron{spec.device_count - 1}",
            ", ".join(f"neuron{i}" for i in indexes) or "none",
        )
    efa_bdfs = read_efa_bdfs(root)
    if spec.has_device_efa and set(efa_bdfs) != set(spec.device_efa_bdfs):
        raise DiscoveryError(
            root / EFA_DRIVER_DIR,
            f"{spec.instance_type} hosts have EFA interfaces {', '.join(sorted(set(spec.device_efa_bdfs)))}",
            ", ".join(efa_bdfs) or "none",
        )
    devices = []
    for index in indexes:
        dev_dir = base / f"neuron{index}"
        cores = _read_int(dev_dir / "core_count", minimum=1)
        if cores != spec.physical_cores_per_device:
            raise DiscoveryError(
                dev_dir / "core_count", f"{spec.instance_type} devices have {spec.physical_cores_per_device} cores",
                str(cores),
            )
        text = _read(dev_dir / "connected_devices")
        connected = _parse_index_list(dev_dir / "connected_devices", text)
        accepted = accepted_neighbours(spec, index)
        if not any(set(connected) == set(want) for want in accepted):
            lists = [", ".join(map(str, w)) or "none" for w in accepted]
            shown = lists[0] if len(lists) == 1 else " or ".join(repr(x) for x in lists)
            raise DiscoveryError(
                dev_dir / "connected_devices",
                f"device {index} of a {spec.topology.value} {spec.instance_type} links to {shown}",
                text,
            )
        _check_arch(spec, dev_dir)
        major, minor = _read_dev_numbers(dev_dir / "dev")
        if not (root / "dev" / f"neuron{index}").exists():
            raise DiscoveryError(root / "dev" / f"neuron{index}", "missing device node")
        pci_bdf, numa_node = read_pci_link(root, index)
        devices.append(
            NeuronDevice(
                index=index,
                physical_cores=cores,
                connected=connected,
                serial_number=_read(dev_dir / "info" / "serial_number"),
                major=major,
                minor=minor,
                memory_bytes=spec.hbm_bytes_per_device,
                efa_bdf=spec.device_efa_bdfs[index] if spec.has_device_efa else None,
                pci_bdf=pci_bdf,
                numa_node=numa_node,
            )
        )
    ultraserver = read_ultraserver(root)
    if ultraserver is not None and not spec.ultraserver:
        raise DiscoveryError(root / NEURON_CLASS_DIR, f"UltraServer class files on a {spec.instance_type} host")
    if ultraserver is None and spec.ultraserver:
        raise DiscoveryError(root / NEURON_CLASS_DIR / "server_id_4", f"missing on a {spec.instance_type} host")
    report = None
    if use_neuron_ls:
        devices, report = _with_neuron_ls(root, spec, devices, neuron_ls_timeout)
    return NeuronHost(spec, version, tuple(devices), efa_bdfs, ultraserver, report)
