"""Device taints for unhealthy devices (docs/dra-api.md; docs/neuron-health.md §3).

An Unhealthy device gets one taint `<driver name>/unhealthy` (value: the counter that tripped) in this node's
ResourceSlice, with the configured effect: NoSchedule (default: new claims avoid it, running pods stay),
NoExecute (the device taint eviction controller also evicts the pods using it), or None (informational). The taint
goes away when the device is healthy again. Unknown health does not taint: the counters could not be read, which
says nothing about the hardware. `timeAdded` is when the device became unhealthy, so that rewriting a slice for
another reason neither moves it nor restarts a NoExecute toleration's clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.health_source import MAX_MESSAGE, DeviceHealth, Health
from neuron_dra.driver.model.k8s_names import DEFAULT_TAINT_EFFECT as DEFAULT_TAINT_EFFECT  # re-exported
from neuron_dra.driver.model.k8s_names import TAINT_EFFECTS as TAINT_EFFECTS
from neuron_dra.driver.model.partitions import core_device_name
from neuron_dra.driver.model.slices import NODE_DEVICE_NAME, device_name

UNHEALTHY_TAINT_NAME = "unhealthy"
MAX_LABEL_VALUE = 63
_RANK = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.UNHEALTHY: 2}  # worst last


@dataclass(frozen=True)
class NamedHealth:
    """The health of one published device (by its ResourceSlice name)."""

    name: str
    health: Health
    message: str
    since: float
    reason: str = ""  # the first counter that made it unhealthy (a taint value), or ""


def published_health(host: NeuronHost, current: Mapping[int, DeviceHealth], cores_per_device: int = 0
                     ) -> dict[str, NamedHealth]:
    """Health per published device name. A device's core devices (`cores_per_device` of them, when cores are
    published) share its health; the UltraServer pseudo-device stands for all 16 devices, so it is as healthy as
    the worst of them."""
    out: dict[str, NamedHealth] = {}
    for dev in host.devices:
        h = current.get(dev.index)
        if h is None:
            continue
        reason = next((k for k, v in sorted(h.counters.items()) if v > 0), "")
        names = [device_name(dev.index), *(core_device_name(dev.index, c) for c in range(cores_per_device))]
        for name in names:
            out[name] = NamedHealth(name, h.health, h.message, h.since, reason)
    if host.ultraserver is not None and current:
        worst = max(current.values(), key=lambda h: (_RANK[h.health], -h.since))
        bad = sorted(i for i, h in current.items() if h.health is not Health.HEALTHY)
        message = "" if not bad else f"devices {', '.join(map(str, bad))} of this node are not healthy"
        out[NODE_DEVICE_NAME] = NamedHealth(NODE_DEVICE_NAME, worst.health, message[:MAX_MESSAGE], worst.since,
                                            "member-device-unhealthy" if bad else "")
    return out

def unhealthy_taint_key(driver_name: str) -> str:
    return f"{driver_name}/{UNHEALTHY_TAINT_NAME}"


def check_effect(effect: str) -> str:
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {effect!r}: allowed are {', '.join(TAINT_EFFECTS)}")
    return effect


def _rfc3339(unix: float) -> str:
    # Seconds precision with Z: what the API server stores (metav1.Time), so the slice compares equal read back.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(unix)))


def unhealthy_taints(health: Mapping[str, NamedHealth], driver_name: str, effect: str = DEFAULT_TAINT_EFFECT
                     ) -> dict[str, tuple[Mapping[str, str], ...]]:
    """Device name -> its taints, for the Unhealthy devices only."""
    check_effect(effect)
    out: dict[str, tuple[Mapping[str, str], ...]] = {}
    for name, h in health.items():
        if h.health is not Health.UNHEALTHY:
            continue
        value = (h.reason or "hardware-error")[:MAX_LABEL_VALUE]
        out[name] = ({"key": unhealthy_taint_key(driver_name), "value": value, "effect": effect,
                      "timeAdded": _rfc3339(h.since)},)
    return out
