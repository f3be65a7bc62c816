"""Discovery: read a Neuron host from its sysfs (and neuron-ls when present) under a host root.

Every value is checked against the hardware catalog. A host that contradicts the catalog is an
error naming the file and the value; nothing is guessed over.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.driver.model.catalog import (
    BUILTIN,
    Catalog,
    InstanceSpec,
    UnknownInstanceTypeError,
    accepted_neighbours,
)
from neuron_dra.driver.model.devices import NeuronDevice, NeuronHost, UltraServer

NEURON_DEVICE_DIR = "sys/devices/virtual/neuron_device"
NEURON_CLASS_DIR = "sys/class/neuron_device"
PRODUCT_NAME = "sys/devices/virtual/dmi/id/product_name"
KERNEL_DRIVER_VERSION = "sys/module/neuron/version"
EFA_DRIVER_DIR = "sys/bus/pci/drivers/efa"
NEURON_LS = "opt/aws/neuron/bin/neuron-ls"
ETXTBSY_ATTEMPTS = 6  # 0.04 + 0.08 + ... + 0.64 s of waiting at most
ULTRASERVER_FILES = ("server_id_2", "server_id_4", "node_id_2", "node_id_4", "ultraserver_mode")

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SHORT_BDF = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
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


@dataclass(frozen=True)
class NeuronLsDevice:
    """What `neuron-ls --json-output` adds for one device."""

    index: int
    bdf: str
    numa_node: int | None
    memory_bytes: int
    connected_to: tuple[int, ...]
    nc_count: int


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


def normalize_bdf(text: str) -> str:
    """`cc:00.0` or `0000:cc:00.0` -> `0000:cc:00.0` (lower case); ValueError otherwise."""
    t = text.strip().lower()
    if _SHORT_BDF.match(t):
        t = "0000:" + t
    if not _BDF.match(t):
        raise ValueError(f"not a PCI address: {text!r}")
    return t


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


def parse_neuron_ls(text: str, source: str = "neuron-ls --json-output") -> dict[int, NeuronLsDevice]:
    """Parse `neuron-ls --json-output` (a list of devices, or an object holding one)."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiscoveryError(source, f"not JSON: {e}", text[:80]) from e
    if isinstance(data, Mapping):
        data = data.get("neuron_devices", data.get("devices"))
    if not isinstance(data, Sequence) or isinstance(data, str):
        raise DiscoveryError(source, "expected a JSON list of devices", text[:80])
    out: dict[int, NeuronLsDevice] = {}
    for i, entry in enumerate(data):
        where = f"{source}[{i}]"
        if not isinstance(entry, Mapping):
            raise DiscoveryError(where, "expected an object per device", repr(entry)[:80])
        try:
            index = int(entry["neuron_device"])
            bdf = normalize_bdf(str(entry["bdf"]))
            numa_raw = entry.get("numa_node")
            numa = None if numa_raw in (None, "", "-1", -1) else int(numa_raw)
            memory = int(entry["memory_size"])
            connected = tuple(int(x) for x in entry.get("connected_to") or ())
            nc_count = int(entry["nc_count"])
        except KeyError as e:
            raise DiscoveryError(where, f"missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise DiscoveryError(where, f"bad value: {e}", repr(entry)[:120]) from e
        out[index] = NeuronLsDevice(index, bdf, numa, memory, connected, nc_count)
    return out


def _run_executable(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """subprocess.run, retried a few times on ETXTBSY: a process forked elsewhere while the file was open for
    writing holds that descriptor until its own exec (an emulated host written and run by one process, or a
    package update); it passes within moments."""
    attempt = 0
    while True:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except OSError as e:
            attempt += 1
            if e.errno != errno.ETXTBSY or attempt >= ETXTBSY_ATTEMPTS:
                raise
            time.sleep(0.02 * 2 ** attempt)


def run_neuron_ls(root: Path, timeout: float = 20.0) -> dict[int, NeuronLsDevice] | None:
    """Run neuron-ls from the host root (or PATH when the root is /); None when not installed."""
    candidate = root / NEURON_LS
    exe: str | None = str(candidate) if candidate.exists() else None
    if exe is None and root == Path("/"):
        exe = shutil.which("neuron-ls")
    if exe is None:
        return None
    if not os.access(exe, os.X_OK):
        raise DiscoveryError(exe, "neuron-ls is present but not executable")
    try:
        proc = _run_executable([exe, "--json-output"], timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DiscoveryError(exe, f"could not run neuron-ls: {e}") from e
    if proc.returncode != 0:
        raise DiscoveryError(exe, f"neuron-ls exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return parse_neuron_ls(proc.stdout, f"{exe} --json-output")


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


def discover(host_root: Path | str = "/", *, use_neuron_ls: bool = True, catalog: Catalog = BUILTIN) -> NeuronHost:
    """Read the Neuron host under `host_root` and check it against `catalog`."""
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
    neuron_ls = run_neuron_ls(root) if use_neuron_ls else None
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
        ls = neuron_ls.get(index) if neuron_ls is not None else None
        if neuron_ls is not None and ls is None:
            raise DiscoveryError("neuron-ls --json-output", f"lists no device {index}")
        if ls is not None and set(ls.connected_to) != set(connected):
            raise DiscoveryError(
                "neuron-ls --json-output", f"device {index} connected_to disagrees with sysfs {text!r}",
                str(list(ls.connected_to)),
            )
        devices.append(
            NeuronDevice(
                index=index,
                physical_cores=cores,
                connected=connected,
                serial_number=_read(dev_dir / "info" / "serial_number"),
                major=major,
                minor=minor,
                memory_bytes=ls.memory_bytes if ls else spec.hbm_bytes_per_device,
                efa_bdf=spec.device_efa_bdfs[index] if spec.has_device_efa else None,
                pci_bdf=ls.bdf if ls else None,
                numa_node=ls.numa_node if ls else None,
            )
        )
    ultraserver = read_ultraserver(root)
    if ultraserver is not None and not spec.ultraserver:
        raise DiscoveryError(root / NEURON_CLASS_DIR, f"UltraServer class files on a {spec.instance_type} host")
    if ultraserver is None and spec.ultraserver:
        raise DiscoveryError(root / NEURON_CLASS_DIR / "server_id_4", f"missing on a {spec.instance_type} host")
    return NeuronHost(spec, version, tuple(devices), efa_bdfs, ultraserver)
