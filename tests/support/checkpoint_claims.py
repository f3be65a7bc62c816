"""Prepared-claim entries for checkpoint tests, built with either release's checkpoint classes (the current
module or the previous release's, tests/support/previous_checkpoint.py), so both write the same claims."""

from __future__ import annotations

import logging
import types
from typing import Any

from neuron_dra.driver.daemon.claims.cdi import CDI_KIND, CdiDevice, build_spec, spec_text


def claim(module: types.ModuleType, uid: str, index: int, state: str = "PrepareCompleted") -> Any:
    """A claim holding Neuron device `index` and its 8 cores, with a real CDI spec text."""
    name = f"{uid}-neuron-device-{index}"
    spec = spec_text(build_spec([CdiDevice(name, env=(f"NEURON_RT_VISIBLE_CORES={index * 8}-{index * 8 + 7}",))]))
    device = module.PreparedDevice(("neurons",), "node-1", f"neuron-device-{index}", (f"{CDI_KIND}={name}",))
    return module.PreparedClaim(uid, "team-a", f"claim-{index}", module.ClaimState(state), (device,), (index,),
                                spec, 1700000000.25 + index, tuple(range(index * 8, index * 8 + 8)))


def uid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


class ErrorCount(logging.Handler):
    """Counts the error records of the loggers it is added to (the checkpoint's damage reports)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
