"""Emulation: write a fake host tree that discovery reads exactly like a real host of that type.

Emulated trees are the fixtures of the tests, the demo and the local cluster. Values no source
states (Neuron device BDFs other than trn2's device 0, NUMA placement, serial numbers, the
device-node major) are plausible, deterministic inventions and are marked as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.driver.model import discovery as d
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec, expected_neighbours
from neuron_dra.driver.model.health_source import ERROR_COUNTERS, HARDWARE_STATS, hardware_dir

DEFAULT_KERNEL_DRIVER_VERSION = "2.25.4.0"
EMULATED_MAJOR = 239  # a dynamic major like the real driver gets at boot (invented)


@dataclass(frozen=True)
class EmulationOptions:
    kernel_driver_version: str = DEFAULT_KERNEL_DRIVER_VERSION
    neuron_ls: bool = True  # install a neuron-ls that prints the host's JSON
    host_id: str = "emulated"  # seeds serial numbers and UltraServer ids so hosts differ
    ultraserver_node: int = 0  # this host's position (0..3) in its UltraServer (UltraServer types only)
    ultraserver_mode: int | None = 4


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def neuron_bdf(spec: InstanceSpec, index: int) -> str:
    """PCI address of a Neuron device (trn2 device 0 is `cc:00.0` per neuron-ls; the rest invented)."""
    if spec.family.name in ("trn2", "trn2u") and spec.has_device_efa:
        efa_bus = int(spec.device_efa_bdfs[index].split(":")[1], 16)
        return f"0000:{efa_bus + 3:02x}:00.0"
    if spec.has_device_efa:
        _, bus, devfn = spec.device_efa_bdfs[index].split(":")
        slot = int(devfn.split(".")[0], 16)
        return f"0000:{bus}:{(slot + 0x10 + index % 2):02x}.0"
    return f"0000:{0x10 + index:02x}:1e.0"


def numa_node(spec: InstanceSpec, index: int) -> int:
    """NUMA node: buses >= 0x80 sit on socket 1 (matches trn2 device 0 at cc:00.0 on node 1)."""
    if spec.device_count == 1:
        return 0
    if not spec.has_device_efa and spec.device_count >= 8:
        return 0 if index < spec.device_count // 2 else 1  # invented: half the devices per socket
    bus = int(neuron_bdf(spec, index).split(":")[1], 16)
    return 1 if bus >= 0x80 else 0


def _serial(opts: EmulationOptions, index: int) -> str:
    return hashlib.sha256(f"{opts.host_id}/{index}".encode()).hexdigest()[:16]


def neuron_ls_json(spec: InstanceSpec, opts: EmulationOptions) -> list[dict[str, object]]:
    lnc = spec.family.default_lnc
    per_device = spec.logical_cores_per_device(lnc)
    return [
        {
            "neuron_device": i,
            "bdf": neuron_bdf(spec, i)[5:],  # neuron-ls prints the short form `cc:00.0`
            "cpu_affinity": "0-95" if numa_node(spec, i) == 0 else "96-191",
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
        group4 = hashlib.sha256(f"{opts.host_id}/us4".encode()).hexdigest()[:12]
        pos = opts.ultraserver_node
        _write(klass / "server_id_4", group4 + "\n")
        _write(klass / "server_id_2", f"{group4}-{pos // 2}\n")
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
    if opts.neuron_ls:
        data = base / "opt" / "aws" / "neuron" / "share" / "neuron-ls.json"
        _write(data, json.dumps(neuron_ls_json(spec, opts), indent=1) + "\n")
        exe = base / d.NEURON_LS
        # Prints the recorded JSON, like the real tool on this host; the path is relative so the tree can move.
        _write(exe, '#!/bin/sh\nexec cat "$(dirname "$0")/../share/neuron-ls.json"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return base



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
