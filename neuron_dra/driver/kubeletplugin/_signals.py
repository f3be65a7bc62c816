"""Stopping on SIGTERM/SIGINT without deadlocking the main thread.

Python runs a signal handler in the main thread between two bytecodes, possibly while that thread holds a lock.
A handler that calls `threading.Event.set()` takes the event's (non-reentrant) lock: when the main thread is
inside `Event.wait()` holding it, or inside a first handler's `set()` when a second signal comes (kubelet, the
container runtime and coreutils `timeout` may each send SIGTERM), the main thread waits on itself forever. Seen
here: a driver hung on stop until SIGKILL. So the handler only records the first signal and sets the event from a
short-lived thread. (Python docs, `signal`: "handlers are executed in the main Python thread ... between the
bytecode instructions"; `threading.Condition` wraps a plain Lock by default.)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signals(event: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """From the main thread: the first of `signals` sets `event` (from another thread); later ones do nothing."""
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        threading.Thread(target=event.set, name=f"signal-{signum}", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)
