"""Device health from the host: the Neuron kernel driver's hardware error counters in sysfs, polled.

(Not to be confused with `health.py`, the gRPC liveness probe of the daemon itself.)

Per device, `stats/hardware/{mem_ecc_uncorrected,sram_ecc_uncorrected,mem_ecc_repairable_uncorrected}` count
uncorrectable ECC events in HBM and SRAM since the driver loaded (docs/neuron-health.md §1). Any non-zero count
makes the device Unhealthy: AWS's troubleshooting guide has the runtime fail on each of them and asks for a
driver reload, a reboot or an instance replacement. The counters are single files in the kernel driver's source;
older documentation shows counter directories with `total`/`present`, so both shapes are read. A device whose
counters cannot be read at all is Unknown (the kubelet shows Unknown; no taint: we do not know it is broken).

The polling thread that calls `read_device_health` is `HealthMonitor` (driver/daemon/health/monitor.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from neuron_dra.driver.model.discovery import NEURON_DEVICE_DIR

HARDWARE_STATS = "stats/hardware"
# name -> what it means (in the message kubelet shows in the pod's status)
ERROR_COUNTERS: Mapping[str, str] = {
    "mem_ecc_uncorrected": "uncorrectable HBM ECC errors",
    "sram_ecc_uncorrected": "uncorrectable SRAM ECC errors",
    "mem_ecc_repairable_uncorrected": "repairable uncorrectable HBM ECC errors (reload the driver or reboot)",
}
# The kernel driver prints 0 for its "register unreadable" sentinel 0xdeadbeef; a raw one means a broken read.
UNREADABLE_SENTINEL = 0xDEADBEEF
MAX_MESSAGE = 1024  # kubelet truncates longer messages (docs/kubelet-dra-protocol.md §3)


class Health(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceHealth:
    index: int
    health: Health
    counters: Mapping[str, int]  # counter -> value, only those read
    message: str
    since: float  # unix time this health was first observed

    def same_state(self, other: DeviceHealth | None) -> bool:
        return other is not None and other.health is self.health and other.message == self.message


def hardware_dir(host_root: Path, index: int) -> Path:
    return host_root / NEURON_DEVICE_DIR / f"neuron{index}" / HARDWARE_STATS


def _read_counter(path: Path) -> int | None:
    """A counter file, or the `total` of a counter directory; None when absent or unreadable."""
    try:
        data = _read_small(str(path))
    except IsADirectoryError:
        try:
            data = _read_small(str(path / "total"))
        except OSError:
            return None
    except OSError:
        return None
    try:
        value = int(data.strip(), 10)
    except ValueError:
        return None
    return None if value < 0 or value == UNREADABLE_SENTINEL else value


def _read_small(path: str) -> bytes:
    # Raw os calls: the daemon reads 48 of these every second on a 16-device host; no text-IO wrapper per file.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def read_device_health(host_root: Path, index: int, now: float | None = None) -> DeviceHealth:
    """One device's health from its counters (no memory of earlier reads)."""
    when = time.time() if now is None else now
    base = hardware_dir(host_root, index)
    counters: dict[str, int] = {}
    for name in ERROR_COUNTERS:
        value = _read_counter(base / name)
        if value is not None:
            counters[name] = value
    if not counters:
        return DeviceHealth(index, Health.UNKNOWN, {}, f"no readable hardware error counters under {base}", when)
    bad = {k: v for k, v in counters.items() if v > 0}
    if not bad:
        return DeviceHealth(index, Health.HEALTHY, counters, "", when)
    message = "; ".join(f"{v} {ERROR_COUNTERS[k]} ({k})" for k, v in sorted(bad.items()))
    return DeviceHealth(index, Health.UNHEALTHY, counters, message[:MAX_MESSAGE], when)
