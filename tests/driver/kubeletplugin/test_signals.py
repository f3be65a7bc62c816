"""kubeletplugin/_signals.py: SIGTERM sets the stop event even when it lands while the main thread holds
the event's lock
(the daemon hung on stop until SIGKILL when a handler called Event.set() there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process

# A child that takes the event's own lock in the main thread, raises SIGTERM (the handler runs right there, inside
# the lock), releases it, then waits for the event. With a handler calling event.set() directly it never ends.
CHILD = textwrap.dedent("""
    import signal, sys, threading
    from neuron_dra.driver.kubeletplugin._signals import set_on_signals

    stop = threading.Event()
    set_on_signals(stop)
    with stop._cond:  # the lock Event.set() takes (CPython's threading.Event)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # a second one is ignored
    sys.exit(0 if stop.wait(5) else 3)
""")


def _run(code: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_a_signal_inside_the_event_lock_still_stops() -> None:
    done = _run(CHILD)
    assert done.returncode == 0, done.stderr


def test_the_naive_handler_deadlocks_there_which_is_why_the_helper_exists() -> None:
    naive = CHILD.replace("set_on_signals(stop)", "signal.signal(signal.SIGTERM, lambda *_: stop.set())")
    try:
        done = _run(naive, timeout=3)
    except subprocess.TimeoutExpired:
        return  # hung on its own lock, as expected
    raise AssertionError(f"the naive handler did not deadlock (exit {done.returncode}): the test no longer shows "
                         f"the hazard\n{done.stderr}")


def test_sigterm_and_sigint_are_both_handled() -> None:
    code = CHILD.replace("signal.raise_signal(signal.SIGTERM)\n", "signal.raise_signal(signal.SIGINT)\n", 1)
    assert "SIGINT" in code and _run(code).returncode == 0
