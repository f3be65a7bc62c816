"""Crash injection for the crash-safety tests: kill this process (SIGKILL, like `kill -9`) at a named
step of prepare or unprepare. Disarmed unless NEURON_DRA_CRASH_AT names steps (comma-separated)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping

ENV_VAR = "NEURON_DRA_CRASH_AT"
STEPS = (
    "prepare-after-cdi",  # CDI spec written, nothing recorded yet (one record per prepare: docs/durability.md)
    "prepare-after-completed",  # PrepareCompleted recorded, kubelet not answered yet
    "unprepare-after-cdi",  # CDI spec removed, checkpoint entry still there
    "unprepare-after-checkpoint",  # entry removed, kubelet not answered yet
)


class CrashPoints:
    def __init__(self, armed: Iterable[str] = ()) -> None:
        armed = frozenset(armed)
        unknown = sorted(armed - set(STEPS))
        if unknown:
            raise ValueError(f"{ENV_VAR}: unknown step(s) {', '.join(unknown)}; allowed: {', '.join(STEPS)}")
        self.armed = armed

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CrashPoints:
        return cls(s.strip() for s in env.get(ENV_VAR, "").split(",") if s.strip())

    def hit(self, step: str) -> None:
        if step in self.armed:
            os.kill(os.getpid(), signal.SIGKILL)
