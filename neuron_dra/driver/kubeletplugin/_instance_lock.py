"""The lock two instances of the driver on one node share during a rolling update (`maxSurge: 1`): kubelet may
call either, so prepare and unprepare are serialised across them by an exclusive flock on a file in the driver's
plugin directory, as the Go helper's `RollingUpdate` does with `serialize.lock`
(k8s.io/dynamic-resource-allocation/kubeletplugin, draplugin.go). The kernel drops the lock when its holder dies,
so a killed instance never leaves it taken."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "serialize.lock"
_POLL_S = (0.001, 0.002, 0.005, 0.01, 0.02)  # short first: the other instance holds it for one call's commit


class LockTimeout(TimeoutError):
    def __init__(self, path: Path | None, waited: float) -> None:
        """`path`: the instances' lock file (another process held it); None: the call lock of this process (another
        call of this instance held it)."""
        where, holder = ((str(path), "another instance of the driver") if path is not None
                         else ("the call lock", "another call of this instance"))
        super().__init__(f"{where}: {holder} held the lock for {waited:.1f} s")
        self.path = path


class InstanceLock:
    """An exclusive lock across processes; `hold(deadline)` waits for it until `deadline` (time.monotonic()).

    Within one process the daemon's own lock orders the threads; this one orders the processes, so it is taken
    with the daemon's lock held and never nested."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.contextmanager
    def hold(self, deadline: float | None = None) -> Iterator[None]:
        start = time.monotonic()
        for attempt in range(1 << 30):
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise LockTimeout(self.path, now - start) from None
                pause = _POLL_S[min(attempt, len(_POLL_S) - 1)]
                time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class CallLock:
    """What the helper holds around each NodePrepareResources and NodeUnprepareResources call, as the Go helper's
    `serialize` option does: a thread lock (the calls of this process), then the instances' flock when the driver
    has one (`attach`, the rolling update's other instance). The driver holds it too for its own work on what the
    calls change (loading, background checks, stopping). `hold` raises LockTimeout once `deadline` passes."""

    def __init__(self, instances: InstanceLock | None = None) -> None:
        self._thread = threading.Lock()
        self.instances = instances

    def attach(self, instances: InstanceLock) -> None:
        self.instances = instances

    @contextlib.contextmanager
    def hold(self, deadline: float | None = None) -> Iterator[None]:
        if deadline is None:
            self._thread.acquire()
        else:  # a call waiting behind another call of this process gives up at its deadline too
            start = time.monotonic()
            if not self._thread.acquire(timeout=max(0.0, deadline - start)):
                raise LockTimeout(None, time.monotonic() - start)
        try:
            if self.instances is None:
                yield
                return
            with self.instances.hold(deadline):
                yield
        finally:
            self._thread.release()
