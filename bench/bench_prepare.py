"""Benchmark: NodePrepareResources latency over the DRA socket, and the daemon's memory over many cycles.

The client speaks kubelet's protocol on the daemon's real unix socket (tests/support/pluginclient.py).

Latency: the daemon runs on an emulated trn2.48xlarge with claims read from local JSON files instead of
GET from the API server (`python -m tests.support.claims_dir_daemon`; the target excludes the claim GET).
Baseline, measured in the same run, call for call alternating with the driver's calls: a bare gRPC round
trip on the same kind of socket, to a Python gRPC server process that echoes the bytes of a
NodePrepareResources request. Claim sizes alternate too. Figures: prepare p50/p99 for 1-, 4- and 16-device
claims (fresh: unprepared in between) and the p99 above the baseline's p99 (target: at most 3 ms); a repeated
prepare (answered from the checkpoint); unprepare; one durable atomic file write on the same filesystem (the
floor the checkpoint's fsync puts under a prepare); GetInfo on the registration socket and its slowest call
(target: at most 250 ms, a quarter of kubelet's 1 s; tests/driver/daemon/test_plugin.py asserts the answer only).

Memory: the daemon's RSS after start and every tenth of 10,000 prepare/unprepare cycles of a 16-device claim
(target: at most 64 MiB and flat), with the gRPC health port on and its liveness check (which calls the
daemon's own sockets) probed every second. With --apiserver, a second daemon, the real one
(`python -m neuron_dra.driver`), runs against a local control plane (localcluster/controlplane/plane.py): every
prepare GETs its claim over TLS, slices are published, and every tenth of the cycles the node's slices are
wiped as kubelet does at its start, so the daemon republishes them.

What the image runs: --daemon-python a virtualenv with only neuron_dra/driver/image-requirements.txt installed, and
--image-env (PYTHONOPTIMIZE=2, as neuron_dra/driver/Dockerfile sets). The default is this interpreter, whose
environment holds the development tools too (grpc and kubernetes import grpc_tools and kubernetes_validate
when they are installed).

Run: python bench/bench_prepare.py [--samples 1000] [--cycles 10000] [--dir /tmp] [--apiserver]
       [--daemon-python PATH --image-env]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pluginclient lives with the tests (tests.support)

from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2, grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME, LIVENESS_SERVICE
from tests.support import pluginclient
from tests.support.pluginclient import ClaimRef

DRIVER = DEFAULT_DRIVER_NAME
NODE = "bench-node"
MIB = 1024 * 1024
SIZES = {1: [5], 4: [4, 5, 6, 7], 16: list(range(16))}

ECHO_SERVER = textwrap.dedent("""
    import signal, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import grpc
    from neuron_dra.driver.kubeletplugin._signals import set_on_signals
    def echo(request, context):
        return request
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, request_deserializer=None, response_serializer=None)})
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix://" + sys.argv[1])
    server.start()
    done = threading.Event()
    set_on_signals(done, (signal.SIGTERM,))
    print("ready", flush=True)
    done.wait()
    server.stop(0)
""")


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def results(indexes: Sequence[int]) -> list[dict[str, Any]]:
    return [{"request": "neurons", "driver": DRIVER, "pool": NODE, "device": f"neuron-device-{i}"} for i in indexes]


def uid_of(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def filesystem(path: Path) -> str:
    """The type of the filesystem holding `path` (from /proc/mounts: the longest mount point prefix)."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype = line.split()[:3]
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


def durable_write_latency(base: Path, n: int) -> list[float]:
    """The floor the checkpoint's durability puts under a prepare: temp file, fsync, rename, fsync dir."""
    out = []
    target = base / "fsync-probe"
    for _ in range(n):
        start = time.perf_counter()
        tmp = base / ".fsync-probe.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, target)
        dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)
        out.append(time.perf_counter() - start)
    return out


class EchoServer:
    """The baseline: a Python gRPC server process echoing bytes on a unix socket, and a client channel to it."""

    def __init__(self, base: Path) -> None:
        sock = base / "echo.sock"
        self.proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(sock)], stdout=subprocess.PIPE)
        if self.proc.stdout is None or self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the echo server did not start")
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self._echo = self.channel.unary_unary("/bench.Echo/Echo", request_serializer=None,
                                              response_deserializer=None)
        self._payload = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
            namespace="bench", name="claim-16", uid=uid_of(16))]).SerializeToString()

    def call(self) -> float:
        start = time.perf_counter()
        self._echo(self._payload, timeout=10)
        return time.perf_counter() - start

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(10)


class Daemon:
    """A daemon process with kubelet's client on its sockets and a gRPC health client."""

    def __init__(self, base: Path, python: str, env: Mapping[str, str], entry: Sequence[str]) -> None:
        self.base = base
        self.health_port = free_port()
        self._log = (base / "daemon.log").open("wb")
        self.proc = subprocess.Popen(
            [python, "-m", *entry, "--node-name", NODE, "--emulate", "trn2.48xlarge",
             "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
             "--cdi-root", str(base / "cdi"), "--log-level", "warning",
             "--healthcheck-port", str(self.health_port), "--bind-address", "127.0.0.1"],
            stdout=self._log, stderr=subprocess.STDOUT, env=dict(env))
        self.reg_socket = reg_socket = base / "registry" / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 60
        while not reg_socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start:\n{(base / 'daemon.log').read_text()[-2000:]}")
            time.sleep(0.05)
        reg = pluginclient.register(reg_socket)
        self.client = pluginclient.DraClient(reg.endpoint, reg.version)
        self._health_channel = grpc.insecure_channel(f"127.0.0.1:{self.health_port}")
        self._health = grpc_health_v1_pb2_grpc.HealthStub(self._health_channel)

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def cycle(self, ref: ClaimRef) -> float:
        """Prepare (timed) and unprepare one claim."""
        start = time.perf_counter()
        result = self.client.prepare([ref], timeout=10)[ref.uid]
        elapsed = time.perf_counter() - start
        if result.error:
            raise RuntimeError(result.error)
        self.client.unprepare([ref], timeout=10)
        return elapsed

    def live(self) -> bool:
        request = grpc_health_v1_pb2.HealthCheckRequest(service=LIVENESS_SERVICE)
        return bool(self._health.Check(request, timeout=5).status == grpc_health_v1_pb2.HealthCheckResponse.SERVING)

    def stop(self) -> None:
        self.client.close()
        self._health_channel.close()
        self.proc.terminate()
        self.proc.wait(20)
        self._log.close()


def latency(base: Path, python: str, env: Mapping[str, str], samples: int) -> Daemon:
    claims_dir = base / "claims"
    claims_dir.mkdir()
    refs = {}
    for n, indexes in SIZES.items():
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"namespace": "bench", "name": f"claim-{n}", "uid": uid_of(n)},
                 "status": {"allocation": {"devices": {"results": results(indexes), "config": []}}}}
        (claims_dir / f"bench_claim-{n}.json").write_text(json.dumps(claim))
        refs[n] = ClaimRef("bench", f"claim-{n}", uid_of(n))
    echo = EchoServer(base)
    daemon = Daemon(base, python, env, ["tests.support.claims_dir_daemon", "--claims-dir", str(claims_dir)])
    try:
        # Baseline and driver calls alternate, so both see the same machine (load, CPU frequency, caches).
        bare: list[float] = []
        empty: list[float] = []
        get_info: list[float] = []
        registration = pluginclient.dial(daemon.reg_socket)
        try:
            for _ in range(samples):
                bare.append(echo.call())
                empty.extend(timed(lambda: daemon.client.prepare([], timeout=10), 1))
                get_info.extend(timed(lambda: pluginclient.get_info(registration, timeout=10), 1))
        finally:
            registration.close()
        prepare: dict[int, list[float]] = {n: [] for n in refs}
        for _ in range(100):  # warm up
            for ref in refs.values():
                echo.call()
                daemon.cycle(ref)
        for _ in range(samples):
            for n, ref in refs.items():
                bare.append(echo.call())
                prepare[n].append(daemon.cycle(ref))
        daemon.client.prepare([refs[16]], timeout=10)
        repeated = timed(lambda: daemon.client.prepare([refs[16]], timeout=10), samples)
        unprepare = []
        for _ in range(samples):
            daemon.client.prepare([refs[16]], timeout=10)
            start = time.perf_counter()
            daemon.client.unprepare([refs[16]], timeout=10)
            unprepare.append(time.perf_counter() - start)
        durable = durable_write_latency(base, samples)
    finally:
        echo.close()

    print(f"\nlatency over the unix socket, {samples} calls each (client-side wall time)")
    print(f"{'':38} {'p50':>10} {'p99':>10}")
    rows = [("baseline: bare gRPC echo round trip", bare), ("empty NodePrepareResources", empty),
            ("GetInfo (registration socket)", get_info)]
    rows += [(f"prepare, {n:2d} device(s), fresh", prepare[n]) for n in SIZES]
    rows += [("prepare, 16 devices, repeated", repeated), ("unprepare, 16 devices", unprepare),
             ("(one durable atomic file write)", durable)]
    for label, values in rows:
        print(f"{label:38} {ms(percentile(values, 50))} {ms(percentile(values, 99))}")
    bare_p99 = percentile(bare, 99)
    print(f"\np99 prepare minus the bare round trip's p99 ({ms(bare_p99).strip()}); target <= 3 ms:")
    for n in SIZES:
        over = percentile(prepare[n], 99) - bare_p99
        print(f"  {n:2d} device(s): {ms(over)}  {'ok' if over <= 0.003 else 'OVER TARGET'}")
    # kubelet gives GetInfo 1 s (docs/kubelet-dra-protocol.md); a quarter of it leaves room for a loaded node
    slowest = max(get_info)
    print(f"\nGetInfo slowest of {samples}: {ms(slowest).strip()} (kubelet allows 1 s); target <= 250 ms  "
          f"{'ok' if slowest <= 0.25 else 'OVER TARGET'}")
    return daemon


def memory(daemon: Daemon, ref: ClaimRef, cycles: int, label: str, wipe: Callable[[], None] | None = None) -> None:
    print(f"\ndaemon RSS, {label}: {cycles} prepare/unprepare cycles of a 16-device claim (target <= 64 MiB, flat)")
    print(f"  before: {daemon.rss() / MIB:.1f} MiB")
    probes = failed = 0
    points = []
    step = max(1, cycles // 10)
    start = last_probe = time.perf_counter()
    for i in range(1, cycles + 1):
        daemon.cycle(ref)
        if time.perf_counter() - last_probe >= 1.0:
            last_probe = time.perf_counter()
            probes += 1
            failed += 0 if daemon.live() else 1
        if i % step == 0:
            points.append((i, daemon.rss()))
            if wipe is not None:
                wipe()
    elapsed = time.perf_counter() - start
    print("  " + "  ".join(f"{i}: {r / MIB:.1f}" for i, r in points) + " (MiB)")
    peak = max(r for _, r in points)
    first = points[1] if len(points) > 1 else points[0]
    print(f"  peak {peak / MIB:.1f} MiB ({'ok' if peak <= 64 * MIB else 'OVER TARGET'}); growth from cycle {first[0]} "
          f"to {points[-1][0]}: {(points[-1][1] - first[1]) / MIB:+.2f} MiB; {cycles / elapsed:.0f} cycles/s; "
          f"{probes} liveness probes, {failed} failed")


def with_apiserver(base: Path, python: str, env: Mapping[str, str], cycles: int) -> None:
    from kubernetes import client

    from neuron_dra.localcluster.controlplane.plane import ControlPlane

    plane = ControlPlane.start(base / "controlplane", max_lifetime_s=3600)
    api = plane.api_client()
    try:
        core: Any = client.CoreV1Api(api)
        res: Any = client.ResourceV1Api(api)
        core.create_node({"metadata": {"name": NODE}})
        request = {"name": "neurons", "exactly": {"deviceClassName": DRIVER, "count": 16}}
        created = json.loads(res.create_namespaced_resource_claim("default", {
            "metadata": {"name": "claim-16"}, "spec": {"devices": {"requests": [request]}}},
            _preload_content=False).data)
        created["status"] = {"allocation": {"devices": {"results": results(SIZES[16])}}}
        res.replace_namespaced_resource_claim_status("claim-16", "default", created)
        ref = ClaimRef("default", "claim-16", created["metadata"]["uid"])
        run_dir = base / "with-api"
        run_dir.mkdir()
        daemon = Daemon(run_dir, python, env, ["neuron_dra.driver", "--kubeconfig", str(plane.kubeconfig)])
        try:
            time.sleep(2)  # first publish
            memory(daemon, ref, cycles, "the real daemon against a local kube-apiserver (claim GET per prepare, "
                   "slices wiped and republished every tenth)",
                   wipe=lambda: res.delete_collection_resource_slice(field_selector=f"spec.nodeName={NODE}"))
        finally:
            daemon.stop()
    finally:
        api.close()
        plane.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1000, help="prepares per claim size (default 1000)")
    parser.add_argument("--cycles", type=int, default=10_000, help="prepare/unprepare cycles for RSS (10000)")
    parser.add_argument("--dir", default="/tmp", help="where the checkpoint, CDI specs and sockets live (default "
                        "/tmp, a disk: the checkpoint's fsync is part of each prepare; /dev/shm shows the rest)")
    parser.add_argument("--apiserver", action="store_true", help="also measure RSS against a local kube-apiserver")
    parser.add_argument("--daemon-python", default=sys.executable, help="interpreter of the daemon")
    parser.add_argument("--image-env", action="store_true", help="run the daemon with PYTHONOPTIMIZE=2 as the image")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if args.image_env:
        env["PYTHONOPTIMIZE"] = "2"
    base = Path(tempfile.mkdtemp(prefix="ndbench", dir=args.dir))
    print(f"state directory: {base} ({filesystem(base)})")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; grpcio {grpc.__version__}; "
          f"daemon: {args.daemon_python}, PYTHONOPTIMIZE={env.get('PYTHONOPTIMIZE', '0')}")
    try:
        daemon = latency(base, args.daemon_python, env, args.samples)
        try:
            memory(daemon, ClaimRef("bench", "claim-16", uid_of(16)), args.cycles,
                   "claims from files (as in the latency runs)")
        finally:
            daemon.stop()
        if args.apiserver:
            with_apiserver(base, args.daemon_python, env, args.cycles)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end (other work on the machine skews the tails)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
