"""Helpers for the driver tests: ResourceClaim builders, a fake claim lookup (unit tests only), short
directories for unix sockets, and the daemon as a child process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_dra.driver.kubeletplugin._calls import Calls
from neuron_dra.driver.kubeletplugin._claimref import CallScope, ClaimFailed, ClaimLookup, ClaimLookupError, ClaimRef

if TYPE_CHECKING:
    from neuron_dra.driver.daemon.claims.state import DriverState

REPO = Path(__file__).resolve().parents[2]
DRIVER = "neuron.aws.com"
NODE = "node-a"
NEURON_CONFIG = {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}
ULTRASERVER_CONFIG = {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig"}


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def result(device: str, request: str = "neurons", *, driver: str = DRIVER, pool: str = NODE,
           admin: bool = False) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin:
        r["adminAccess"] = True
    return r


def opaque(parameters: Mapping[str, Any], requests: Sequence[str] = (), source: str = "FromClaim",
           driver: str = DRIVER) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": dict(parameters)}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def claim(name: str, claim_uid: str, results: Sequence[dict[str, Any]] | None, *, namespace: str = "default",
          configs: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A ResourceClaim as the API returns it; `results=None`: not allocated."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": claim_uid},
        "spec": {"devices": {"requests": []}}, "status": {},
    }
    if results is not None:
        obj["status"]["allocation"] = {"devices": {"results": list(results), "config": list(configs)}}
    return obj


def devices(*indexes: int, request: str = "neurons", pool: str = NODE) -> list[dict[str, Any]]:
    return [result(f"neuron-device-{i}", request, pool=pool) for i in indexes]


class FakeLookup:
    """The narrow claim-lookup interface, in memory (unit tests only). `gate(name)` makes the GET of that
    claim block until the returned event is set; `fail=True` simulates an unreachable API server."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail = False
        for c in claims:
            self.put(c)

    def put(self, c: dict[str, Any]) -> None:
        self.claims[(c["metadata"]["namespace"], c["metadata"]["name"])] = c

    def delete(self, name: str, namespace: str = "default") -> None:
        self.claims.pop((namespace, name), None)

    def gate(self, name: str) -> tuple[threading.Event, threading.Event]:
        """(entered, release): `entered` is set when the GET starts, the GET returns after `release` is set."""
        self.entered[name] = threading.Event()
        self.gates[name] = threading.Event()
        return self.entered[name], self.gates[name]

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.calls.append((namespace, name))
        if name in self.gates:
            self.entered[name].set()
            if not self.gates[name].wait(30):
                raise AssertionError(f"gate of {name} never released")
        if self.fail:
            raise ClaimLookupError("connection refused (fake)")
        return self.claims.get((namespace, name))


class Served:
    """A DriverState as kubelet's calls reach it through the helper (kubeletplugin's call path, _calls.py): refs
    in, the claim GET and its checks done by the helper with `lookup`, the driver's prepare and unprepare under the
    state's lock (the helper's CallLock). Anything else is the state's."""

    def __init__(self, state: DriverState, lookup: ClaimLookup) -> None:
        self.state = state
        self.calls = Calls(state, lookup, state.lock)

    def prepare(self, refs: Sequence[ClaimRef], call: CallScope | None = None
                ) -> dict[str, Any]:
        return self.calls.prepare(refs, call)

    def unprepare(self, refs: Sequence[ClaimRef], call: CallScope | None = None) -> dict[str, ClaimFailed | None]:
        return self.calls.unprepare(refs, call)

    def close(self) -> None:
        self.calls.close()
        self.state.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.state, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("state", "calls"):
            super().__setattr__(name, value)
        else:
            setattr(self.state, name, value)  # a test's change of the state's own attributes


@contextlib.contextmanager
def short_dir(prefix: str = "nd") -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes, pytest's tmp_path is long."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def snapshot(*dirs: Path) -> dict[str, bytes]:
    """Every regular file under `dirs` with its bytes (to show that a failed call changed nothing)."""
    out = {}
    for d in dirs:
        if d.exists():
            for p in sorted(d.rglob("*")):
                if p.is_file() and not p.is_socket():
                    out[str(p)] = p.read_bytes()
    return out


def wait_until(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class DaemonDirs:
    base: Path

    @property
    def claims(self) -> Path:
        return self.base / "claims"

    @property
    def plugins(self) -> Path:
        return self.base / "plugins"

    @property
    def registry(self) -> Path:
        return self.base / "registry"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"

    @property
    def dra_socket(self) -> Path:
        return self.plugins / DRIVER / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry / f"{DRIVER}-reg.sock"

    @property
    def checkpoint(self) -> Path:
        return self.plugins / DRIVER / "checkpoint.json"

    def put_claim(self, c: Mapping[str, Any]) -> None:
        self.claims.mkdir(parents=True, exist_ok=True)
        meta = c["metadata"]
        path = self.claims / f"{meta['namespace']}_{meta['name']}.json"
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(json.dumps(c))
        tmp.replace(path)

    def delete_claim(self, name: str, namespace: str = "default") -> None:
        (self.claims / f"{namespace}_{name}.json").unlink(missing_ok=True)


class DaemonProcess:
    """`python -m tests.support.claims_dir_daemon` (the real daemon, claims from files) as a child process."""

    def __init__(self, dirs: DaemonDirs, host_root: Path, *, extra_args: Sequence[str] = (),
                 crash_at: str | None = None, env: Mapping[str, str] | None = None) -> None:
        dirs.claims.mkdir(parents=True, exist_ok=True)
        self.dirs = dirs
        env = {**os.environ, **(env or {})}
        # The daemon module is test support (tests/support/claims_dir_daemon.py): the repository on the path.
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        env.pop("NEURON_DRA_CRASH_AT", None)
        if crash_at:
            env["NEURON_DRA_CRASH_AT"] = crash_at
        self.log_path = dirs.base / f"daemon-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.claims_dir_daemon", "--claims-dir", str(dirs.claims),
             "--node-name", NODE, "--plugins-dir", str(dirs.plugins), "--registry-dir", str(dirs.registry),
             "--cdi-root", str(dirs.cdi), "--host-root", str(host_root), *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 20.0) -> DaemonProcess:
        """Until this process serves (its own log says so: a socket file may be a stale one of a killed daemon)."""
        wait_until(lambda: any(r.get("msg") == "serving" for r in self.log_records()) or self.proc.poll() is not None,
                   timeout, "the daemon to serve")
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def terminate(self, timeout: float = 45.0) -> int:
        """SIGTERM and the exit code. The timeout is above the daemon's drain (main.DRAIN_SECONDS): a call
        still running may take that long before the daemon exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    def wait_exit(self, timeout: float = 20.0) -> int:
        code = self.proc.wait(timeout)
        self._log.close()
        return code


def free_port() -> int:
    """A free loopback TCP port (for a daemon's health or metrics server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
