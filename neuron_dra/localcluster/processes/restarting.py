"""A node process restarted with backoff when it exits, as systemd restarts kubelet and kubelet a container."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from neuron_dra.localcluster.processes import procs

log = logging.getLogger("neuron_dra.localcluster.supervisor")


class Restarting:
    """One node process, started by `launch(lifetime_s)` (via procs.spawn) and restarted with backoff when it
    exits, until `stop()` or the cluster's deadline."""

    def __init__(self, name: str, launch: Callable[[float], subprocess.Popen[bytes]], pid_file: Path,
                 deadline: float) -> None:
        self.name = name
        self.launch = launch
        self.pid_file = pid_file
        self.deadline = deadline  # time.time() at which the cluster's lifetime ends
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30)
        if self.proc is None:
            raise procs.ProcessError(f"{self.name} did not start")

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            lifetime = self.deadline - time.time()
            if lifetime < 1:
                return
            began = time.monotonic()
            try:
                self.proc = self.launch(lifetime)
            except Exception:
                log.exception("starting %s failed", self.name)
                self._started.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            self._started.set()
            code = self.proc.wait()
            if self._stop.is_set():
                return
            self.restarts += 1
            log.warning("%s exited with %s; restarting", self.name, code)
            backoff = 0.5 if time.monotonic() - began > 30 else min(backoff * 2, 10.0)
            self._stop.wait(backoff)

    def stop(self, grace_s: float = 10.0) -> None:
        self._stop.set()
        ref = procs.read_pid_file(self.pid_file)
        if ref is not None:
            procs.stop(ref, grace_s, popen=self.proc)
        self._thread.join(timeout=grace_s + 10)
        self.pid_file.unlink(missing_ok=True)
