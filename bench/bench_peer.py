"""Benchmark: the daemon next to kubernetes-sigs/dra-example-driver's kubelet plugin (Go), the reference.

Both drivers run against one local control plane (localcluster/controlplane/plane.py, the default Kubernetes minor
unless --kubernetes-version), for one Node, and are driven by one client speaking kubelet's protocols over
their unix sockets (registration, then DRA v1; the client below, so the figures do not depend on the local
cluster's kubelet stand-in). Calls are interleaved: every cycle prepares and unprepares a 1-device and an
8-device claim on each driver, in four orders in turn (fair_schedule), so both see the same machine. Each prepare GETs
its claim from the API server (both drivers do that; the example's client rate limit is raised from its
default 5 requests/s, which would throttle prepares to ~180 ms).

The example is built from the Go module proxy into the shared cache (`~/.cache/neuron-dra/dra-example-driver/
<version>/`), at the version whose Kubernetes libraries match the cluster's minor where one exists
(EXAMPLE_VERSIONS). Our daemon runs as the image runs (neuron_dra/driver/Dockerfile): a virtualenv with only
neuron_dra/driver/image-requirements.txt (cached beside the example), the driver copied out and precompiled with `-OO`,
PYTHONOPTIMIZE=2; --dev-python runs it with this interpreter and the repository instead.

Figures (both drivers, ratio ours / example; below 1 means ours is faster or smaller):
prepare p50/p99 at 1 and 8 devices, unprepare p50 (client-side wall time), CPU per prepare+unprepare (the
process's user+system time over the measured cycles, background work included), memory at start (RSS once the
first ResourceSlice is there and the process settled) and peak (VmHWM at the end), start -> registration
socket, start -> registration answered (GetInfo, kubelet's next step), start -> DRA service answered (an empty
NodePrepareResources), start -> first ResourceSlice (all from the exec of the process).
Below the table: the prepare p99 ratio in each quarter of the run, which shows how much of a tail ratio is noise.

Run under `nice -n -15` on a shared machine: the bench then gives that niceness to its session's autogroup and to
the control plane's (`share_priority`), without which nice has no effect against other sessions' work; the
header line says what applied and the load average. `--samples FILE` keeps every call's time for analysis.

Run: nice -n -15 python bench/bench_peer.py [--cycles 2000] [--kubernetes-version 1.36] [--dir /tmp]
     [--cdi-dir /dev/shm] [--json]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2, pluginregistration_pb2
from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster import build
from neuron_dra.localcluster.controlplane.plane import ControlPlane

REPO = Path(__file__).resolve().parent.parent
NODE = "bench-node"
NAMESPACE = "default"
MIB = 1024 * 1024
# Kubernetes minor -> the example release built on that minor's libraries (k8s.io/kubelet,
# dynamic-resource-allocation); 1.35 and 1.37 have none, so the nearest older one serves.
EXAMPLE_VERSIONS: Mapping[str, str] = {"1.34": "v0.2.1", "1.35": "v0.2.1", "1.36": "v0.4.0", "1.37": "v0.4.0"}
EXAMPLE_MODULE = "sigs.k8s.io/dra-example-driver"
EXAMPLE_PACKAGE = f"{EXAMPLE_MODULE}/cmd/dra-example-kubeletplugin"
EXAMPLE_BINARY = "dra-example-kubeletplugin"
GOPROXY = "https://proxy.golang.org"
SIZES = (1, 8)
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"


class BenchError(RuntimeError):
    pass


# --- building the peer and the image-like interpreter ---------------------------------------------------------

def example_version(minor: str) -> str:
    try:
        return EXAMPLE_VERSIONS[minor]
    except KeyError:
        raise BenchError(f"no dra-example-driver version for Kubernetes {minor}; known minors: "
                         f"{', '.join(EXAMPLE_VERSIONS)}") from None


def build_example(version: str, log: Callable[[str], None]) -> Path:
    """The example's kubelet plugin at `version`, built once into the shared cache."""
    target = build.cache_root() / "dra-example-driver" / version
    if (target / EXAMPLE_BINARY).is_file():
        return target / EXAMPLE_BINARY
    # The module's own go.mod and go.sum pin every dependency: build inside the downloaded module
    # (`go install pkg@version` also asks the proxy for the module's version list, which it may refuse).
    env = {**build.go_env(), "GOPROXY": GOPROXY, "GOFLAGS": "-mod=mod"}
    proc = subprocess.run([build.go_binary(), "mod", "download", "-json", f"{EXAMPLE_MODULE}@{version}"],
                          capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=False)
    if proc.returncode != 0:
        raise BenchError(f"go mod download {EXAMPLE_MODULE}@{version} failed:\n{proc.stdout}{proc.stderr}")
    module_dir = Path(json.loads(proc.stdout)["Dir"])
    paths = build.cached_go_build(module_dir, {EXAMPLE_BINARY: EXAMPLE_PACKAGE}, target, ldflags=["-s", "-w"],
                                  log=log)
    return paths[EXAMPLE_BINARY]


def image_python(log: Callable[[str], None]) -> Path:
    """A virtualenv with only the image's requirements, laid out as neuron_dra/driver/Dockerfile makes it (bytecode
    for -OO, no pip or setuptools: their .pth hook would cost every start), cached by their hash; a venv is not
    relocatable, so it is made in place and marked complete last."""
    reqs = REPO / "neuron_dra" / "driver" / "image-requirements.txt"
    key = hashlib.sha256(reqs.read_bytes() + sys.version.encode() + b"layout 3").hexdigest()[:16]
    venv = build.cache_root() / "bench-image-venv" / key
    python, complete = venv / "bin" / "python", venv / ".complete"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f".{key}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.is_file():
            log(f"creating {venv} with {reqs.name}")
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--only-binary=:all:", "-r", str(reqs)],
                           check=True)
            subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "--yes", "pip", "setuptools"], check=True)
            subprocess.run([str(python), "-m", "compileall", "-q", "-o", "2", str(venv)], check=True)
            complete.write_text(reqs.read_text())
    return python


def image_app(dest: Path) -> Path:
    """The driver laid out as the image has it (no testing.py), precompiled with -OO; returns the PYTHONPATH."""
    app = dest / "app"
    pkg = app / "neuron_dra"
    pkg.mkdir(parents=True)
    shutil.copy2(REPO / "neuron_dra" / "__init__.py", pkg / "__init__.py")
    shutil.copytree(REPO / "neuron_dra" / "driver", pkg / "driver", ignore=shutil.ignore_patterns(
        "__pycache__", "Dockerfile", "image-requirements.txt", "testing.py"))
    return app


def image_entrypoint(dest: Path) -> Path:
    """The image's entrypoint, `neuron-dra-driver`: the script the Dockerfile writes (read from it), run with the
    image's interpreter. Not `python -m neuron_dra.driver`, whose runpy start imports what the image's does not."""
    text = (REPO / "neuron_dra" / "driver" / "Dockerfile").read_text()
    found = re.search(r"printf '([^']*)' \\\n\s*> /opt/venv/bin/neuron-dra-driver", text)
    if found is None:
        raise BenchError("neuron_dra/driver/Dockerfile: no printf writing /opt/venv/bin/neuron-dra-driver")
    script = dest / "neuron-dra-driver"
    script.write_text(found.group(1).replace("\\n", "\n"))
    return script


# --- kubelet's side of the protocols ------------------------------------------------------------------------

@dataclass
class KubeletClient:
    """Registration (GetInfo, NotifyRegistrationStatus) and DRA v1 calls, with serialized requests."""

    endpoint: str
    channel: grpc.Channel = field(init=False)

    @classmethod
    def register(cls, registration_socket: Path) -> KubeletClient:
        channel = grpc.insecure_channel(f"unix://{registration_socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=10)
            get_info = channel.unary_unary("/pluginregistration.Registration/GetInfo",
                                           request_serializer=None, response_deserializer=None)
            info = pluginregistration_pb2.PluginInfo.FromString(
                get_info(pluginregistration_pb2.InfoRequest().SerializeToString(), timeout=1))
            if "v1.DRAPlugin" not in info.supported_versions:
                raise BenchError(f"{info.name} does not offer v1.DRAPlugin: {list(info.supported_versions)}")
            notify = channel.unary_unary("/pluginregistration.Registration/NotifyRegistrationStatus",
                                         request_serializer=None, response_deserializer=None)
            notify(pluginregistration_pb2.RegistrationStatus(plugin_registered=True).SerializeToString(), timeout=5)
        finally:
            channel.close()
        return cls(info.endpoint)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(f"unix://{self.endpoint}")
        self._prepare = self.channel.unary_unary(PREPARE, request_serializer=None, response_deserializer=None)
        self._unprepare = self.channel.unary_unary(UNPREPARE, request_serializer=None, response_deserializer=None)

    def prepare(self, request: bytes, uid: str) -> float:
        start = time.perf_counter()
        raw = self._prepare(request, timeout=45)
        elapsed = time.perf_counter() - start
        result = dra_v1_pb2.NodePrepareResourcesResponse.FromString(raw).claims[uid]
        if result.error or not result.devices:
            raise BenchError(f"prepare of {uid} at {self.endpoint} failed: {result.error or 'no devices'}")
        return elapsed

    def unprepare(self, request: bytes, uid: str) -> float:
        start = time.perf_counter()
        raw = self._unprepare(request, timeout=45)
        elapsed = time.perf_counter() - start
        error = dra_v1_pb2.NodeUnprepareResourcesResponse.FromString(raw).claims[uid].error
        if error:
            raise BenchError(f"unprepare of {uid} at {self.endpoint} failed: {error}")
        return elapsed

    def close(self) -> None:
        self.channel.close()


def answers(socket_path: Path, method: str, request: bytes, out: list[Any]) -> bool:
    """One call on a fresh channel (as kubelet dials), with kubelet's 1 s GetInfo timeout: answered or not."""
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        try:
            raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)(request, timeout=1)
        except grpc.RpcError:
            return False
    if method == GET_INFO:
        out.append(pluginregistration_pb2.PluginInfo.FromString(raw))
    return True


# --- the drivers --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DriverSpec:
    label: str
    driver_name: str
    device_names: tuple[str, ...]  # device names of its pool, in order (claims take the first n)
    command: Callable[[Path, Path, Path], list[str]]  # (run dir, kubeconfig, CDI spec dir) -> argv
    env: Mapping[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ours_spec(python: str, env: Mapping[str, str], host_root: Path, health: bool = False,
              entrypoint: Path | None = None) -> DriverSpec:
    """`entrypoint`: the image's script (image_entrypoint); None: `python -m neuron_dra.driver`."""
    start = [str(entrypoint)] if entrypoint is not None else ["-m", "neuron_dra.driver"]

    def command(run: Path, kubeconfig: Path, cdi: Path) -> list[str]:
        return [python, *start, "--node-name", NODE, "--host-root", str(host_root),
                *(["--healthcheck-port", str(free_port())] if health else []),
                "--plugins-dir", str(run / "plugins"), "--registry-dir", str(run / "registry"),
                "--cdi-root", str(cdi), "--kubeconfig", str(kubeconfig),
                # Both drivers without client-side throttling (the example gets the same flags): the cycles
                # run faster than client-go's default 5 QPS, which would otherwise be what is measured.
                "--kube-api-qps", "1000", "--kube-api-burst", "1000"]
    return DriverSpec("neuron-dra", DEFAULT_DRIVER_NAME, tuple(f"neuron-device-{i}" for i in range(16)), command, env)


def example_spec(binary: Path, health: bool = False) -> DriverSpec:
    def command(run: Path, kubeconfig: Path, cdi: Path) -> list[str]:
        return [str(binary), "--node-name", NODE, "--cdi-root", str(cdi), "--num-devices", "8",
                "--healthcheck-port", "0" if health else "-1",  # 0: a free port; -1: off (its default)
                "--kubelet-plugins-directory-path", str(run / "plugins"),
                "--kubelet-registrar-directory-path", str(run / "registry"),
                "--kubeconfig", str(kubeconfig), "--kube-api-qps", "1000", "--kube-api-burst", "1000"]
    return DriverSpec("example (Go)", "gpu.example.com", tuple(f"gpu-{i}" for i in range(8)), command,
                      dict(os.environ))


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no {key} for pid {pid}")


def cpu_seconds(pid: int) -> float:
    # utime and stime: fields 14 and 15 of /proc/PID/stat (after the parenthesised command).
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Running:
    """One driver process, started with its start-up figures measured, and a kubelet client on it."""

    def __init__(self, spec: DriverSpec, run: Path, kubeconfig: Path, slices: Callable[[str], bool],
                 cdi: Path) -> None:
        self.spec = spec
        for d in (run / "plugins", run / "registry", cdi):  # kubelet and the host make them; the example expects them
            d.mkdir(parents=True)
        registration = run / "registry" / f"{spec.driver_name}-reg.sock"
        self._log = (run / "driver.log").open("wb")
        start = time.perf_counter()
        self.proc = subprocess.Popen(spec.command(run, kubeconfig, cdi), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=dict(spec.env))
        self.to_socket = self._until(lambda: registration.exists(), start, 0.0005, run)
        # What kubelet needs next: GetInfo answered (kubelet allows 1 s), then the DRA endpoint answering.
        info: list[pluginregistration_pb2.PluginInfo] = []
        self.to_registered = self._until(lambda: answers(registration, GET_INFO, b"", info), start, 0.0005, run)
        dra = Path(info[0].endpoint)
        self.to_dra = self._until(lambda: answers(dra, PREPARE, b"", []), start, 0.0005, run)
        self.to_slice = self._until(lambda: slices(spec.driver_name), start, 0.002, run)
        time.sleep(1.0)  # settle: the first publish and its watch
        self.rss_start = proc_status(self.proc.pid, "VmRSS")
        self.client = KubeletClient.register(registration)

    def _until(self, done: Callable[[], bool], start: float, poll: float, run: Path) -> float:
        deadline = start + 60
        while not done():
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                raise BenchError(f"{self.spec.label} did not come up:\n{(run / 'driver.log').read_text()[-3000:]}")
            time.sleep(poll)
        return time.perf_counter() - start

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


# --- the cluster objects ------------------------------------------------------------------------------------

class Api:
    """The few admin calls the bench makes, as JSON through the kubernetes ApiClient."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
             query: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        resp = self._api.call_api(*self._api.param_serialize(
            method, path, query_params=list(query), body=dict(body) if body is not None else None,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"]))
        resp.read()
        if not 200 <= resp.status < 300:
            raise BenchError(f"{method} {path}: {resp.status} {resp.data[:500]!r}")
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def has_slice(self, driver: str) -> bool:
        found = self.call("GET", "/apis/resource.k8s.io/v1/resourceslices",
                          query=[("fieldSelector", f"spec.driver={driver},spec.nodeName={NODE}")])
        return bool(found.get("items"))

    def allocated_claim(self, name: str, driver: str, devices: Sequence[str]) -> str:
        """Create a claim allocated to `devices` of `driver` on the node; returns its UID."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        request = {"name": "devs", "exactly": {"deviceClassName": driver, "count": len(devices)}}
        created = self.call("POST", path, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}})
        created["status"] = {"allocation": {"devices": {"results": [
            {"request": "devs", "driver": driver, "pool": NODE, "device": d} for d in devices]}}}
        self.call("PUT", f"{path}/{name}/status", created)
        return str(created["metadata"]["uid"])


def request_bytes(message: type, name: str, uid: str) -> bytes:
    encoded: bytes = message(claims=[dra_v1_pb2.Claim(namespace=NAMESPACE, name=name, uid=uid)]).SerializeToString()
    return encoded


# --- the machine --------------------------------------------------------------------------------------------

def autogroup_nice(pid: int) -> int | None:
    """The niceness of `pid`'s autogroup ("/autogroup-25 nice 0" in /proc/PID/autogroup); None without one."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int, niceness: int) -> bool:
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))
    except OSError:  # no autogroup (kernel option off) or not allowed (raising priority needs root)
        return False
    return True


def share_priority(pids: Sequence[int]) -> str:
    """The bench's niceness for the autogroups of `pids` too; says what applies.

    With autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled; sched(7), "The autogroup feature") the
    CPU is shared between sessions first and `nice` orders only the processes of one session: `nice -n -15`
    alone gives the bench nothing against other work on the machine. The drivers run in the bench's session;
    the control plane's processes in sessions of their own (localcluster/processes/procs.py). The caller restores its
    own session's (`run`): the shell that started the bench keeps running in it."""
    niceness = os.nice(0)
    if niceness >= 0:
        return f"nice {niceness}"
    applied = sum(set_autogroup_nice(pid, niceness) for pid in pids)
    return f"nice {niceness}" + (f", autogroups of {applied} sessions too" if applied else "")


def load_average() -> float:
    return round(os.getloadavg()[0], 1)


# --- figures ------------------------------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str  # "ms", "MiB", "s"
    ours: float
    example: float

    @property
    def ratio(self) -> float:
        return self.ours / self.example if self.example else float("inf")


def measure(drivers: Sequence[Running], api: Api, cycles: int, warmup: int, log: Callable[[str], None],
            samples: list[dict[str, Any]] | None = None
            ) -> tuple[list[Figure], dict[int, list[float]], dict[str, dict[str, list[float]]]]:
    work = []  # (driver, size, prepare request, unprepare request, uid)
    for d in drivers:
        for n in SIZES:
            name = f"{d.spec.driver_name.split('.')[0]}-{n}"
            uid = api.allocated_claim(name, d.spec.driver_name, d.spec.device_names[:n])
            work.append((d, n, request_bytes(dra_v1_pb2.NodePrepareResourcesRequest, name, uid),
                         request_bytes(dra_v1_pb2.NodeUnprepareResourcesRequest, name, uid), uid))
    prep: dict[tuple[int, int], list[float]] = {(i, n): [] for i in range(len(drivers)) for n in SIZES}
    unprep: dict[int, list[float]] = {i: [] for i in range(len(drivers))}
    after: dict[tuple[int, int, bool], list[float]] = {}  # (driver, size, after the other driver's call): prepares
    cpu_before: dict[int, float] = {}
    previous = None
    schedule = fair_schedule(work)
    for cycle in range(-warmup, cycles):
        if cycle == 0:
            cpu_before = {i: cpu_seconds(d.proc.pid) for i, d in enumerate(drivers)}
            started = time.perf_counter()
        for d, n, prepare, unprepare, uid in schedule[cycle % len(schedule)]:
            i = drivers.index(d)
            other = previous is not None and previous != i
            p = d.client.prepare(prepare, uid)
            u = d.client.unprepare(unprepare, uid)
            previous = i
            if cycle >= 0:
                prep[(i, n)].append(p)
                unprep[i].append(u)
                after.setdefault((i, n, other), []).append(p)
                if samples is not None:
                    samples.append({"driver": d.spec.label, "devices": n, "cycle": cycle, "prepare_s": p,
                                    "unprepare_s": u, "after_other": other, "at_s": time.perf_counter() - started})
        if cycle > 0 and cycle % max(1, cycles // 10) == 0:
            log(f"  {cycle}/{cycles} cycles, {(time.perf_counter() - started) / cycle * 1000:.1f} ms per cycle")
    cpu = [(cpu_seconds(d.proc.pid) - cpu_before[i]) / (cycles * len(SIZES)) for i, d in enumerate(drivers)]
    ours, ex = 0, 1
    figures = []
    for n in SIZES:
        for p in (50, 99):
            figures.append(Figure(f"prepare p{p}, {n} device{'s' if n > 1 else ''}", "ms",
                                  percentile(prep[(ours, n)], p) * 1000, percentile(prep[(ex, n)], p) * 1000))
    figures.append(Figure("unprepare p50", "ms", percentile(unprep[ours], 50) * 1000,
                          percentile(unprep[ex], 50) * 1000))
    figures.append(Figure("unprepare p99", "ms", percentile(unprep[ours], 99) * 1000,
                          percentile(unprep[ex], 99) * 1000))
    figures.append(Figure("CPU per prepare+unprepare", "ms", cpu[ours] * 1000, cpu[ex] * 1000))
    # What a call pays when the other driver's process ran just before it (each driver's caches and threads cold,
    # as for every call on a real node, where calls come seconds apart): each kind gets the same share of those.
    split = {f"{n} device{'s' if n > 1 else ''}": {d.spec.label: [percentile(after.get((i, n, o), [0.0]), 50) * 1000
                                                                for o in (False, True)]
                                                  for i, d in enumerate(drivers)}
             for n in SIZES}
    return figures, {n: quarter_ratios(prep[(ours, n)], prep[(ex, n)], 99) for n in SIZES}, split


def fair_schedule(work: Sequence[Any]) -> list[list[Any]]:
    """The cycles' call orders, repeated: `work` is (ours 1, ours 8, example 1, example 8); the four orders (as
    is, drivers swapped, sizes swapped, both) give each of the four calls the same share of turns right after the
    other driver's calls, which cost more (a driver's threads and caches are cold then); docs/benchmarks.md,
    Method."""
    o1, o8, e1, e8 = work
    return [[o1, o8, e1, e8], [e1, e8, o1, o8], [o8, o1, e8, e1], [e8, e1, o8, o1]]


def quarter_ratios(ours: Sequence[float], example: Sequence[float], p: float) -> list[float]:
    """The percentile's ratio in each quarter of the run (calls in cycle order): how much of a tail ratio is the
    machine's noise, which moves it between quarters of one run."""
    out = []
    for q in range(4):
        a, b = (slice(q * len(x) // 4, (q + 1) * len(x) // 4) for x in (ours, example))
        out.append(round(percentile(ours[a], p) / percentile(example[b], p), 2))
    return out


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    minor = args.kubernetes_version
    version = example_version(minor)
    binary = build_example(version, log)
    env = dict(os.environ)
    python = sys.executable
    entrypoint = None
    base = Path(tempfile.mkdtemp(prefix="ndpeer", dir=args.dir))
    cdi_base: Path | None = None
    try:
        cdi_base = Path(tempfile.mkdtemp(prefix="ndpeer-cdi", dir=args.cdi_dir))
        if not args.dev_python:
            python = str(image_python(log))
            app = image_app(base)
            entrypoint = image_entrypoint(base)
            subprocess.run([python, "-m", "compileall", "-q", "-o", "2", str(app)], check=True)
            env = {**env, "PYTHONPATH": str(app), "PYTHONOPTIMIZE": "2", "PYTHONDONTWRITEBYTECODE": "1"}
        else:
            env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        plane = ControlPlane.start(base / "controlplane", max_lifetime_s=3600, kubernetes_version=minor, log=log)
        own_nice = autogroup_nice(os.getpid())
        priority = share_priority([os.getpid(), *(p.popen.pid for p in plane.processes)])
        load_before = load_average()
        client = plane.api_client()
        drivers: list[Running] = []
        try:
            api = Api(client)
            api.call("POST", "/api/v1/nodes", {"metadata": {"name": NODE}})
            # The same kubeconfig as JSON (client-go reads both): in a cluster neither driver parses one, so
            # neither should pay for a YAML parser here.
            kubeconfig = base / "kubeconfig.json"
            kubeconfig.write_text(json.dumps(yaml.safe_load(plane.kubeconfig.read_text())))
            kubeconfig.chmod(0o600)
            # The host tree exists before the daemon starts, as sysfs does on a node (`--emulate` would write it
            # at start-up; the example keeps its fake GPUs in memory).
            host_root = emulate("trn2.48xlarge", base / "host", EmulationOptions(host_id=NODE))
            specs = [ours_spec(python, env, host_root, args.health, entrypoint), example_spec(binary, args.health)]
            for spec in specs:  # one at a time: each start measured on an otherwise idle machine
                drivers.append(Running(spec, base / spec.driver_name, kubeconfig, api.has_slice,
                                       cdi_base / spec.driver_name))
                log(f"{spec.label} up: registration socket after {drivers[-1].to_socket:.3f} s, first "
                    f"ResourceSlice after {drivers[-1].to_slice:.3f} s")
            samples: list[dict[str, Any]] | None = [] if args.samples else None
            figures, quarters, split = measure(drivers, api, args.cycles, args.warmup, log, samples)
            load_after = load_average()
            if args.samples:
                Path(args.samples).write_text(json.dumps(samples))
            ours, ex = drivers
            figures += [
                Figure("memory at start", "MiB", ours.rss_start / MIB, ex.rss_start / MIB),
                Figure("memory peak", "MiB", proc_status(ours.proc.pid, "VmHWM") / MIB,
                       proc_status(ex.proc.pid, "VmHWM") / MIB),
                Figure("start -> registration socket", "s", ours.to_socket, ex.to_socket),
                Figure("start -> registration answered", "s", ours.to_registered, ex.to_registered),
                Figure("start -> DRA service answered", "s", ours.to_dra, ex.to_dra),
                Figure("start -> first ResourceSlice", "s", ours.to_slice, ex.to_slice),
            ]
        finally:
            for d in drivers:
                d.stop()
            client.close()
            plane.stop()
            if own_nice is not None:
                set_autogroup_nice(os.getpid(), own_nice)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
            if cdi_base is not None:
                shutil.rmtree(cdi_base, ignore_errors=True)
    return {"kubernetes": plane.binaries.kube_version, "example": version, "cycles": args.cycles,
            "daemon_python": "dev" if args.dev_python else "image", "state_filesystem": filesystem(Path(args.dir)),
            "cdi_filesystem": filesystem(Path(args.cdi_dir)),
            "priority": priority, "load_average": [load_before, load_after], "health_servers": args.health,
            "prepare_p99_ratio_by_quarter": {str(n): q for n, q in quarters.items()},
            "prepare_p50_ms_after_own_and_other": split,
            "figures": [{"name": f.name, "unit": f.unit, "neuron_dra": round(f.ours, 4),
                         "example": round(f.example, 4), "ratio": round(f.ratio, 3)} for f in figures]}


def default_cdi_dir() -> str:
    """/dev/shm when it is a tmpfs: a node keeps CDI specs in /var/run/cdi, on the tmpfs /run (the daemon writes
    them unsynced for that reason). On a disk file system every prepare's new spec file costs an inode allocation,
    which no node pays (docs/benchmarks.md, Method)."""
    return "/dev/shm" if filesystem(Path("/dev/shm")) == "tmpfs" else "/tmp"


def filesystem(path: Path) -> str:
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype = line.split()[:3]
        if (str(path.resolve()) + "/").startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


def table(result: Mapping[str, Any]) -> str:
    rows = [f"Kubernetes {result['kubernetes']}, dra-example-driver {result['example']}, {result['cycles']} cycles, "
            f"daemon as the {result['daemon_python']} runs it, state on {result['state_filesystem']}, CDI specs on "
            f"{result['cdi_filesystem']}",
            f"{'health servers on; ' if result['health_servers'] else ''}{result['priority']}; "
            f"load average {result['load_average'][0]} before the drivers started, "
            f"{result['load_average'][1]} after the last cycle",
            "", "| figure | neuron-dra | example (Go) | ratio |", "|---|---|---|---|"]
    for f in result["figures"]:
        digits = 3 if f["unit"] == "s" else 2 if f["unit"] == "ms" else 1
        rows.append(f"| {f['name']} | {f['neuron_dra']:.{digits}f} {f['unit']} | {f['example']:.{digits}f} "
                    f"{f['unit']} | {f['ratio']:.2f} |")
    by_quarter = "; ".join(f"{n} device{'s' if n != '1' else ''} {' '.join(f'{r:.2f}' for r in q)}"
                           for n, q in result["prepare_p99_ratio_by_quarter"].items())
    rows += ["", f"prepare p99 ratio in each quarter of the run: {by_quarter}"]
    split = "; ".join(f"{size}: " + ", ".join(f"{label} {own:.2f} / {other:.2f}" for label, (own, other) in v.items())
                      for size, v in result["prepare_p50_ms_after_own_and_other"].items())
    rows += [f"prepare p50 (ms) right after the same driver's call / after the other's: {split}"]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=2000, help="measured cycles (default 2000: each p99 is the "
                        "20th-longest of its figure's samples)")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured cycles first (default 50)")
    parser.add_argument("--kubernetes-version", default=build.DEFAULT_MINOR, choices=sorted(EXAMPLE_VERSIONS),
                        help=f"minor of the local control plane (default {build.DEFAULT_MINOR})")
    parser.add_argument("--dir", default="/tmp", help="where sockets and checkpoints live (default /tmp)")
    parser.add_argument("--cdi-dir", default=default_cdi_dir(),
                        help="where both drivers write their CDI specs: a tmpfs, as a node's /var/run/cdi is "
                             "(default /dev/shm when it is one, else --dir's default)")
    parser.add_argument("--dev-python", action="store_true",
                        help="run the daemon with this interpreter and the repository, not as the image")
    parser.add_argument("--keep", action="store_true", help="keep the run and CDI directories (driver logs, specs)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    parser.add_argument("--health", action="store_true",
                        help="both drivers with their gRPC health servers on, as the DaemonSets run them")
    parser.add_argument("--samples", metavar="FILE", help="also write every measured call's time (JSON) to FILE")
    args = parser.parse_args(argv)
    if args.cycles < 100:
        parser.error(f"--cycles {args.cycles}: at least 100 (p99 needs them)")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = run(args, log)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
