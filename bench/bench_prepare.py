"""Benchmark: NodePrepareResources latency over the DRA socket, and the daemon's memory over many cycles.

The daemon runs as its own process on an emulated trn2.48xlarge (`python -m neuron_dra.driver.testing`:
the real daemon, with claims read from local JSON files instead of GET from the API server, which the
target excludes). The client speaks the real protocol on the real unix socket, like kubelet.

Baseline, measured in the same run, call for call alternating with the driver's calls: a bare gRPC round
trip on the same kind of socket, to a Python gRPC server process that echoes the bytes of a
NodePrepareResources request. Figures:
- prepare p50/p99 for 1-, 4- and 16-device claims (each prepare is fresh: unprepared in between), the
  p99 above the baseline's p99 (target: at most 3 ms);
- a repeated prepare (answered from the checkpoint) and unprepare;
- the daemon's RSS after start, and every 1,000 of 10,000 prepare/unprepare cycles of a 16-device claim
  (target: at most 64 MiB and flat), with the gRPC health port on and its liveness check (which calls the
  daemon's own sockets) probed every second, as in the DaemonSet.

The daemon runs with the interpreter and environment of this script. To measure what the image runs
(only the daemon's dependencies installed, PYTHONOPTIMIZE=2 as driver/Dockerfile sets), run the script
with such a Python: a virtualenv with `pip install -r driver/image-requirements.txt`, PYTHONPATH=<repo>,
PYTHONOPTIMIZE=2.

Run: python bench/bench_prepare.py [--cycles 10000] [--samples 1000]
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
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from neuron_dra.driver._generated import dra_v1_pb2, grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from neuron_dra.localcluster import pluginclient
from neuron_dra.localcluster.kubelet_standin import ClaimRef

DRIVER = "neuron.aws.com"
NODE = "bench-node"
MIB = 1024 * 1024

ECHO_SERVER = textwrap.dedent("""
    import signal, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import grpc
    def echo(request, context):
        return request
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, request_deserializer=None, response_serializer=None)})
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix://" + sys.argv[1])
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
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


def claim(name: str, uid: str, indexes: Sequence[int]) -> dict[str, object]:
    results = [{"request": "neurons", "driver": DRIVER, "pool": NODE, "device": f"neuron-device-{i}"}
               for i in indexes]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "bench", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results, "config": []}}}}


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear (exit code {proc.poll()})")
        time.sleep(0.05)


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
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
            namespace="bench", name="claim-16", uid="00000000-0000-4000-8000-000000000016")]).SerializeToString()

    def call(self) -> float:
        start = time.perf_counter()
        self._echo(self._payload, timeout=10)
        return time.perf_counter() - start

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(10)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1000, help="prepares per claim size (default 1000)")
    parser.add_argument("--cycles", type=int, default=10_000, help="prepare/unprepare cycles for RSS (10000)")
    parser.add_argument("--dir", default="/tmp", help="where the checkpoint, CDI specs and sockets live (default "
                        "/tmp, a disk: the checkpoint's fsync is part of each prepare; /dev/shm shows the rest)")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ndbench", dir=args.dir))
    print(f"state directory: {base} ({filesystem(base)})")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"python {sys.version.split()[0]} ({sys.executable}), grpcio {grpc.__version__}, "
          f"PYTHONOPTIMIZE={os.environ.get('PYTHONOPTIMIZE', '0')}")
    try:
        return run(base, args.samples, args.cycles)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(base: Path, samples: int, cycles: int) -> int:
    claims_dir = base / "claims"
    claims_dir.mkdir()
    sizes = {1: [5], 4: [4, 5, 6, 7], 16: list(range(16))}
    refs = {}
    for n, indexes in sizes.items():
        uid = f"00000000-0000-4000-8000-{n:012d}"
        (claims_dir / f"bench_claim-{n}.json").write_text(json.dumps(claim(f"claim-{n}", uid, indexes)))
        refs[n] = ClaimRef("bench", f"claim-{n}", uid)

    echo = EchoServer(base)
    log = (base / "daemon.log").open("wb")
    health_port = free_port()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "neuron_dra.driver.testing", "--claims-dir", str(claims_dir), "--node-name", NODE,
         "--emulate", "trn2.48xlarge", "--plugins-dir", str(base / "plugins"), "--registry-dir",
         str(base / "registry"), "--cdi-root", str(base / "cdi"), "--log-level", "warning",
         "--healthcheck-port", str(health_port), "--bind-address", "127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(base / "registry" / f"{DRIVER}-reg.sock", daemon)
        reg = pluginclient.register(base / "registry" / f"{DRIVER}-reg.sock")
        client = pluginclient.DraClient(reg.endpoint, reg.version)
        rss_start = rss_bytes(daemon.pid)

        def cycle(ref: ClaimRef) -> float:
            start = time.perf_counter()
            result = client.prepare([ref], timeout=10)[ref.uid]
            elapsed = time.perf_counter() - start
            if result.error:
                raise RuntimeError(result.error)
            client.unprepare([ref], timeout=10)
            return elapsed

        # Baseline and driver calls alternate, so both see the same machine (load, CPU frequency, caches).
        bare: list[float] = []
        empty: list[float] = []
        for _ in range(samples):
            bare.append(echo.call())
            empty.extend(timed(lambda: client.prepare([], timeout=10), 1))
        # Claim sizes alternate too: each round prepares (and unprepares) a 1-, a 4- and a 16-device claim.
        prepare: dict[int, list[float]] = {n: [] for n in refs}
        for _ in range(100):  # warm up
            for ref in refs.values():
                echo.call()
                cycle(ref)
        for _ in range(samples):
            for n, ref in refs.items():
                bare.append(echo.call())
                prepare[n].append(cycle(ref))
        client.prepare([refs[16]], timeout=10)
        repeated = timed(lambda: client.prepare([refs[16]], timeout=10), samples)
        unprep = []
        for _ in range(samples):
            client.prepare([refs[16]], timeout=10)
            start = time.perf_counter()
            client.unprepare([refs[16]], timeout=10)
            unprep.append(time.perf_counter() - start)
        durable = durable_write_latency(base, samples)

        print(f"\nlatency over the unix socket, {samples} calls each (client-side wall time)")
        print(f"{'':38} {'p50':>10} {'p99':>10}")
        rows = [("baseline: bare gRPC echo round trip", bare), ("empty NodePrepareResources", empty)]
        rows += [(f"prepare, {n:2d} device(s), fresh", prepare[n]) for n in sizes]
        rows += [("prepare, 16 devices, repeated", repeated), ("unprepare, 16 devices", unprep),
                 ("(one durable atomic file write)", durable)]
        for label, values in rows:
            print(f"{label:38} {ms(percentile(values, 50))} {ms(percentile(values, 99))}")
        bare_p99 = percentile(bare, 99)
        print(f"\np99 prepare minus the bare round trip's p99 ({ms(bare_p99).strip()}); target <= 3 ms:")
        for n in sizes:
            over = percentile(prepare[n], 99) - bare_p99
            print(f"  {n:2d} device(s): {ms(over)}  {'ok' if over <= 0.003 else 'OVER TARGET'}")

        print(f"\ndaemon RSS over {cycles} prepare/unprepare cycles of the 16-device claim (target <= 64 MiB, flat)")
        print(f"  after start: {rss_start / MIB:6.1f} MiB; after the latency runs: {rss_bytes(daemon.pid) / MIB:6.1f}"
              " MiB")
        health_channel = grpc.insecure_channel(f"127.0.0.1:{health_port}")
        health = grpc_health_v1_pb2_grpc.HealthStub(health_channel)
        liveness = grpc_health_v1_pb2.HealthCheckRequest(service="liveness")
        probes = failed_probes = 0
        points = []
        step = max(1, cycles // 10)
        start = last_probe = time.perf_counter()
        for i in range(1, cycles + 1):
            cycle(refs[16])
            if time.perf_counter() - last_probe >= 1.0:
                last_probe = time.perf_counter()
                probes += 1
                if health.Check(liveness, timeout=5).status != grpc_health_v1_pb2.HealthCheckResponse.SERVING:
                    failed_probes += 1
            if i % step == 0:
                points.append((i, rss_bytes(daemon.pid)))
        elapsed = time.perf_counter() - start
        health_channel.close()
        print("  " + "  ".join(f"{i}: {r / MIB:.1f}" for i, r in points) + " (MiB)")
        peak = max(r for _, r in points)
        growth = points[-1][1] - points[1][1] if len(points) > 1 else 0
        print(f"  peak {peak / MIB:.1f} MiB ({'ok' if peak <= 64 * MIB else 'OVER TARGET'}); "
              f"growth from cycle {points[1][0] if len(points) > 1 else 0} to {points[-1][0]}: "
              f"{growth / MIB:+.2f} MiB; {cycles / elapsed:.0f} cycles/s; {probes} liveness probes, "
              f"{failed_probes} failed")
        client.close()
    finally:
        daemon.terminate()
        daemon.wait(20)
        log.close()
        echo.close()
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end (other work on the machine skews the tails)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
