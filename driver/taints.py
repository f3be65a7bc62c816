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
from typing import TYPE_CHECKING

from neuron_dra.driver.health_source import Health
from neuron_dra.driver.k8s_names import DEFAULT_TAINT_EFFECT as DEFAULT_TAINT_EFFECT  # re-exported
from neuron_dra.driver.k8s_names import TAINT_EFFECTS as TAINT_EFFECTS

if TYPE_CHECKING:  # claim templates import this module: keep gRPC out of their imports
    from neuron_dra.driver.health_stream import NamedHealth

UNHEALTHY_TAINT_NAME = "unhealthy"
MAX_LABEL_VALUE = 63


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
