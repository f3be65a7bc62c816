"""Emulation: write a fake host tree that discovery reads exactly like a real host of that type.

Emulated trees are the fixtures of the tests, the demo and the local cluster. Values no source
states (Neuron device BDFs and NUMA placement other than trn2's, serial numbers, the device-node
major) are plausible, deterministic inventions and are marked as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from neuron_dra.driver.model import discovery as d
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec, expected_neighbours
from neuron_dra.driver.model.health_source import ERROR_COUNTERS, HARDWARE_STATS, hardware_dir
from neuron_dra.driver.model.neuron_ls import NEURON_LS

# The emulated neuron-ls (docs/neuron-ls.md §4): Neuron 2.34+ answers `--output-format json` only; the tools
# before 2.34 answer `--json-output` only; "failing" exits 1 whatever it is asked.
NeuronLsKind = Literal["output-format", "json-output", "failing"]
NEURON_LS_KINDS: tuple[NeuronLsKind, ...] = ("output-format", "json-output", "failing")
NEURON_LS_DATA = "opt/aws/neuron/share"

# trn2 PCI addresses, NUMA nodes and CPU affinity per device, from AWS's neuron-ls user guide (its trn2n.48xlarge
# example; docs/neuron-ls.md §2). Used for every 16-device trn2 family host.
TRN2_PCI = ("cc", "b5", "b6", "cb", "6f", "58", "59", "6e", "9b", "84", "85", "9a", "f8", "e1", "e2", "f7")
TRN2_NUMA = (1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1)
TRN2_CPU_AFFINITY = ("0-47,96-143", "48-95,144-191")

DEFAULT_KERNEL_DRIVER_VERSION = "2.25.4.0"
EMULATED_MAJOR = 239  # a dynamic major like the real driver gets at boot (invented)


@dataclass(frozen=True)
class EmulationOptions:
    kernel_driver_version: str = DEFAULT_KERNEL_DRIVER_VERSION
    neuron_ls: bool = True  # install a neuron-ls that prints the host's JSON
    neuron_ls_kind: NeuronLsKind = "output-format"  # which flags it answers (NEURON_LS_KINDS)
    # Each /sys/class/neuron_device/neuronN has a `device` link to its PCI device. The kernel driver's public
    # source (2.24.7) creates none; with False the tree looks like that and only neuron-ls knows the addresses.
    sysfs_pci_link: bool = True
    host_id: str = "emulated"  # seeds serial numbers and UltraServer ids so hosts differ
    ultraserver_node: int = 0  # this host's position (0..3) in its UltraServer (UltraServer types only)
    ultraserver_mode: int | None = 4
    # Seeds the UltraServer's ids: hosts with the same seed are one UltraServer (share server_id_4, and server_id_2
    # per pair of positions); "": host_id, so each host is an UltraServer of its own.
    ultraserver_id: str = ""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _aws_trn2(spec: InstanceSpec) -> bool:
    return spec.family.name in ("trn2", "trn2u") and spec.device_count == len(TRN2_PCI)


def neuron_bdf(spec: InstanceSpec, index: int) -> str:
    """PCI address of a Neuron device (trn2: AWS's neuron-ls example; the rest invented)."""
    if _aws_trn2(spec):
        return f"0000:{TRN2_PCI[index]}:00.0"
    if spec.has_device_efa:  # on its EFA's bus, one PCI device number per Neuron device, never an EFA's address
        bus = spec.device_efa_bdfs[index].split(":")[1]
        candidates = (f"0000:{bus}:{index % 32:02x}.{(index // 32 + f) % 8}" for f in range(8))
        return next(c for c in candidates if c not in spec.device_efa_bdfs)
    return f"0000:{0x10 + index:02x}:1e.0"


def numa_node(spec: InstanceSpec, index: int) -> int:
    """NUMA node (trn2: AWS's neuron-ls example; elsewhere invented: buses >= 0x80 sit on socket 1)."""
    if _aws_trn2(spec):
        return TRN2_NUMA[index]
    if spec.device_count == 1:
        return 0
    if not spec.has_device_efa and spec.device_count >= 8:
        return 0 if index < spec.device_count // 2 else 1  # invented: half the devices per socket
    bus = int(neuron_bdf(spec, index).split(":")[1], 16)
    return 1 if bus >= 0x80 else 0


def _serial(opts: EmulationOptions, index: int) -> str:
    return hashlib.sha256(f"{opts.host_id}/{index}".encode()).hexdigest()[:16]


def neuron_ls_json(spec: InstanceSpec, opts: EmulationOptions) -> list[dict[str, object]]:
    """`neuron-ls --json-output` (before Neuron 2.34): a list of devices, as AWS's user guide shows it."""
    lnc = spec.family.default_lnc
    per_device = spec.logical_cores_per_device(lnc)
    affinity = TRN2_CPU_AFFINITY if _aws_trn2(spec) else ("0-95", "96-191")  # invented outside trn2
    return [
        {
            "neuron_device": i,
            "bdf": neuron_bdf(spec, i)[5:],  # neuron-ls prints the short form `cc:00.0`
            "cpu_affinity": affinity[numa_node(spec, i)],
            "numa_node": str(numa_node(spec, i)),
            "connected_to": list(expected_neighbours(spec, i)),
            "nc_count": per_device,
            "logical_neuroncore_config": lnc,
            "memory_size": spec.hbm_bytes_per_device,
            "neuroncore_ids": list(range(i * per_device, (i + 1) * per_device)),
            "neuron_processes": [],
        }
        for i in range(spec.device_count)
    ]


def instance_id(opts: EmulationOptions) -> str:
    return "i-" + hashlib.sha256(f"{opts.host_id}/instance".encode()).hexdigest()[:17]


def _ultraserver_ids(opts: EmulationOptions) -> tuple[str, str]:
    group4 = hashlib.sha256(f"{opts.ultraserver_id or opts.host_id}/us4".encode()).hexdigest()[:12]
    return group4, f"{group4}-{opts.ultraserver_node // 2}"


def neuron_ls_output_format(spec: InstanceSpec, opts: EmulationOptions) -> dict[str, object]:
    """`neuron-ls --output-format json` (Neuron 2.34+): top-level instance (and UltraServer) fields beside the
    devices. AWS has announced the format but published no schema we could find: these top-level names are our
    guess (docs/neuron-ls.md §1), which discovery does not depend on."""
    out: dict[str, object] = {
        "instance_type": spec.instance_type,
        "instance_id": instance_id(opts),
        "logical_neuroncore_config": spec.family.default_lnc,
    }
    if spec.ultraserver:
        group4, group2 = _ultraserver_ids(opts)
        out["ultraserver"] = {"server_id_4": group4, "server_id_2": group2, "node_id_4": opts.ultraserver_node,
                              "node_id_2": opts.ultraserver_node % 2, "ultraserver_mode": opts.ultraserver_mode}
    out["neuron_devices"] = neuron_ls_json(spec, opts)
    return out


def neuron_ls_script(kind: NeuronLsKind) -> str:
    """The emulated neuron-ls: prints the recorded JSON for the flags its kind answers, refuses the rest like a tool
    that does not know them. Paths are relative to the script so the tree can move."""
    answers = {
        "output-format": '  "--output-format json") exec cat "$share/neuron-ls-output-format.json" ;;\n',
        "json-output": '  "--json-output"|"-j") exec cat "$share/neuron-ls.json" ;;\n',
        "failing": "",
    }[kind]
    refusal = ('  *) echo "neuron-ls: error: unrecognized arguments: $*" >&2; exit 2 ;;\n' if kind != "failing" else
               '  *) echo "neuron-ls: failed to open /dev/neuron0: Permission denied" >&2; exit 1 ;;\n')
    return ('#!/bin/sh\n# Emulated neuron-ls (neuron_dra.driver.model.emulate, kind ' + kind + ')\n'
            'share="$(dirname "$0")/../share"\n'
            'case "$*" in\n' + answers + refusal + "esac\n")


def emulate(instance_type: str, root: Path | str, options: EmulationOptions | None = None,
            catalog: Catalog = BUILTIN) -> Path:
    """Write the host tree of `instance_type` (an entry of `catalog`) under `root` (created; must be empty or
    absent)."""
    spec = catalog.spec(instance_type)
    opts = options or EmulationOptions()
    base = Path(root)
    if base.exists() and any(base.iterdir()):
        raise FileExistsError(f"{base}: refusing to emulate into a non-empty directory")
    base.mkdir(parents=True, exist_ok=True)
    _write(base / d.PRODUCT_NAME, spec.instance_type + "\n")
    _write(base / d.KERNEL_DRIVER_VERSION, opts.kernel_driver_version + "\n")
    devices = base / d.NEURON_DEVICE_DIR
    klass = base / d.NEURON_CLASS_DIR
    klass.mkdir(parents=True, exist_ok=True)
    for i in range(spec.device_count):
        dev = devices / f"neuron{i}"
        # sysfs attributes carry no trailing newline for these two (as the real driver writes them)
        _write(dev / "core_count", str(spec.physical_cores_per_device))
        _write(dev / "connected_devices", ", ".join(map(str, expected_neighbours(spec, i))))
        _write(dev / "dev", f"{EMULATED_MAJOR}:{i}\n")
        arch = dev / "info" / "architecture"
        _write(arch / "arch_type", spec.family.arch_type + "\n")
        _write(arch / "instance_type", spec.family.arch_instance_type + "\n")
        _write(arch / "device_name", spec.family.device_name + "\n")
        _write(dev / "info" / "serial_number", _serial(opts, i) + "\n")
        for core in range(spec.physical_cores_per_device):
            (dev / f"neuron_core{core}").mkdir(parents=True, exist_ok=True)
        for counter in ERROR_COUNTERS:  # single files, as the kernel driver creates them (docs/neuron-health.md §1)
            _write(dev / HARDWARE_STATS / counter, "0\n")
        (klass / f"neuron{i}").symlink_to(Path("../../devices/virtual/neuron_device") / f"neuron{i}")
        # A regular file stands in for the character device; its numbers are in sysfs `dev`.
        _write(base / "dev" / f"neuron{i}", "")
    if spec.ultraserver:
        group4, group2 = _ultraserver_ids(opts)
        pos = opts.ultraserver_node
        _write(klass / "server_id_4", group4 + "\n")
        _write(klass / "server_id_2", group2 + "\n")
        _write(klass / "node_id_4", f"{pos}\n")
        _write(klass / "node_id_2", f"{pos % 2}\n")
        mode = "" if opts.ultraserver_mode is None else str(opts.ultraserver_mode)
        _write(klass / "ultraserver_mode", mode + "\n")
    efa_dir = base / d.EFA_DRIVER_DIR
    if spec.efa_count:
        efa_dir.mkdir(parents=True, exist_ok=True)
        bdfs = sorted(set(spec.device_efa_bdfs)) or ["0000:a0:1d.0"]  # trn2.3xlarge: one host-level EFA
        for bdf in bdfs:
            target = base / "sys" / "devices" / f"pci0000:{bdf.split(':')[1]}" / bdf
            target.mkdir(parents=True, exist_ok=True)
            _write(target / "vendor", "0x1d0f\n")
            _write(target / "device", "0xefa1\n")
            (efa_dir / bdf).symlink_to(os.path.relpath(target, efa_dir))
    if opts.sysfs_pci_link:
        for i in range(spec.device_count):
            _write_pci_device(base, devices / f"neuron{i}", neuron_bdf(spec, i), numa_node(spec, i),
                              spec.family.pci_device_id)
    if opts.neuron_ls:
        share = base / NEURON_LS_DATA
        _write(share / "neuron-ls.json", json.dumps(neuron_ls_json(spec, opts), indent=1) + "\n")
        _write(share / "neuron-ls-output-format.json", json.dumps(neuron_ls_output_format(spec, opts), indent=1) + "\n")
        install_neuron_ls(base, neuron_ls_script(opts.neuron_ls_kind))
    return base


def install_neuron_ls(root: Path | str, script: str) -> Path:
    """Write `script` as the host's neuron-ls (where discovery looks for it) and make it executable."""
    exe = Path(root) / NEURON_LS
    _write(exe, script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def _write_pci_device(base: Path, dev_dir: Path, bdf: str, numa: int, pci_device_id: int) -> None:
    """The Neuron device's PCI function under /sys/devices, /sys/bus/pci/devices/<bdf> and the class device's
    `device` link to it (docs/neuron-ls.md §3)."""
    target = base / "sys" / "devices" / f"pci0000:{bdf.split(':')[1]}" / bdf
    _write(target / "vendor", "0x1d0f\n")
    _write(target / "device", f"0x{pci_device_id:04x}\n")
    _write(target / "numa_node", f"{numa}\n")
    bus = base / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / bdf).symlink_to(os.path.relpath(target, bus))
    (dev_dir / "device").symlink_to(os.path.relpath(target, dev_dir))



class FaultError(ValueError):
    pass


def _device_counters(root: Path, device: int) -> Path:
    base = hardware_dir(Path(root), device)
    if not base.parent.parent.is_dir():
        present = sorted(p.name for p in (Path(root) / d.NEURON_DEVICE_DIR).glob("neuron*"))
        raise FaultError(f"--device {device}: no such Neuron device under {root} (present: "
                         f"{', '.join(present) or 'none'})")
    return base


def _replace(path: Path, text: str) -> None:
    # Atomic, so the driver's poller never reads a half-written counter; a counter directory gets its `total`.
    if path.is_dir():
        path = path / "total"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="ascii")
    os.replace(tmp, path)


def inject_fault(root: Path | str, device: int, counter: str = "mem_ecc_uncorrected", count: int = 1) -> int:
    """Add `count` events to one hardware error counter of an emulated device; returns the new value."""
    if counter not in ERROR_COUNTERS:
        raise FaultError(f"--counter {counter!r}: not a hardware error counter; allowed: {', '.join(ERROR_COUNTERS)}")
    if count < 1:
        raise FaultError(f"--count {count}: must be at least 1")
    path = _device_counters(Path(root), device) / counter
    try:
        current = int((path / "total" if path.is_dir() else path).read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        current = 0
    _replace(path, f"{current + count}\n")
    return current + count


def clear_faults(root: Path | str, device: int) -> None:
    """Reset every hardware error counter of an emulated device to 0 (a real host clears them on a driver
    reload; writing to a counter clears it too)."""
    base = _device_counters(Path(root), device)
    for counter in ERROR_COUNTERS:
        _replace(base / counter, "0\n")
