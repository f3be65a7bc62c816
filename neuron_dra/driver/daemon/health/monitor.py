"""`HealthMonitor`: the thread that polls device health (driver/model/health_source.py reads it).

It polls every `interval` seconds (sysfs notifications are off by default on Neuron hosts, and a read of a few
small files per device is cheap) and calls its listeners with the devices whose health changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from neuron_dra.driver.model.health_source import DeviceHealth, Health, read_device_health

log = logging.getLogger("neuron_dra.driver.daemon.health.monitor")

Listener = Callable[[Mapping[int, DeviceHealth]], None]


class HealthMonitor:
    """Polls the counters of `indexes`; `current()` is the latest health of every device, and listeners get
    every change (device index -> new health) from the polling thread."""

    def __init__(self, host_root: Path, indexes: Iterable[int], interval: float = 1.0) -> None:
        if interval <= 0:
            raise ValueError(f"health poll interval {interval!r}: must be > 0 seconds")
        self.host_root = host_root
        self.indexes = tuple(sorted(indexes))
        self.interval = interval
        self._lock = threading.Lock()
        self._state: dict[int, DeviceHealth] = {}
        self._listeners: list[Listener] = []
        self._changed = threading.Condition(self._lock)
        self._version = 0
        self._thread: threading.Thread | None = None
        self.poll()  # the first state exists before anyone asks

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def current(self) -> dict[int, DeviceHealth]:
        with self._lock:
            return dict(self._state)

    @property
    def version(self) -> int:
        """Bumped on every change (for waiters; see wait_for_change)."""
        with self._lock:
            return self._version

    def wait_for_change(self, version: int, timeout: float) -> int:
        """Block until the version differs from `version` or the timeout passes; returns the version."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout)
            return self._version

    def poll(self) -> dict[int, DeviceHealth]:
        """Read every device once; returns (and tells listeners) the devices whose health changed."""
        now = time.time()
        fresh = {i: read_device_health(self.host_root, i, now) for i in self.indexes}
        with self._lock:
            changed = {i: h for i, h in fresh.items() if not h.same_state(self._state.get(i))}
            for i, h in changed.items():
                self._state[i] = h
            if changed:
                self._version += 1
                self._changed.notify_all()
            listeners = list(self._listeners)
        for i, h in changed.items():
            level = logging.WARNING if h.health is not Health.HEALTHY else logging.INFO
            log.log(level, "device health changed", extra={"device": i, "health": h.health.value,
                                                           "reason": h.message})
        if changed:
            for listener in listeners:
                try:
                    listener(changed)
                except Exception:
                    log.exception("health listener failed")
        return changed

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # never let a surprise in sysfs end health reporting
                log.exception("polling device health failed")

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="health-monitor", daemon=True)
        self._thread.start()
        return self._thread
