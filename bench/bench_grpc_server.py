"""Benchmark: grpcio's sync server (grpc.server on a ThreadPoolExecutor) against its asyncio server as the daemon
runs it for the registration socket and the health port (driver/kubeletplugin/_grpcserver.py `Server`) and the sync
server as the daemon runs it for the DRA socket (`ThreadedServer`), with the same raw-bytes handler, over a unix
socket.

- Round trip of a unary call whose handler blocks (as a prepare does: it runs in a pool thread) and of one
  answered in the event loop (as the liveness check's empty prepare), from a client in another process:
  p50 / p99 over N calls, the servers interleaved in rounds.
- Calls whose bodies never come (tests/support/h2attack.py no-bodies, 4 per connection, 2 connections) on a
  server with 4 workers: how many of 10 probes (a fresh connection, 5 s timeout) answer.

Run: python bench/bench_grpc_server.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2

REPO = Path(__file__).resolve().parent.parent
PATH = "/grpc.health.v1.Health/Check"
WORKERS = 4


def work(request: Any, context: Any) -> Any:
    return grpc_health_v1_pb2.HealthCheckResponse(status=grpc_health_v1_pb2.HealthCheckResponse.SERVING)


def sync_server(sock: Path) -> Any:
    def handler(raw: bytes, context: grpc.ServicerContext) -> bytes:
        request = grpcserver.parse(grpc_health_v1_pb2.HealthCheckRequest, raw)
        data: bytes = work(request, context).SerializeToString()
        return data

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(WORKERS), maximum_concurrent_rpcs=WORKERS)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(handler)})])
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    return server


def threaded_server(sock: Path) -> grpcserver.ThreadedServer:
    server = grpcserver.ThreadedServer("bench", grpcserver.Limits(max_concurrent=WORKERS))
    server.add_methods({PATH: grpcserver.Method(grpc_health_v1_pb2.HealthCheckRequest, work, False)})
    server.add_unix(sock)
    server.start()
    return server


def start(name: str, sock: Path) -> Any:
    if name.startswith("sync"):
        return sync_server(sock)
    if name.startswith("threaded"):
        return threaded_server(sock)
    return aio_server(sock, inline="loop" in name)


def aio_server(sock: Path, inline: bool) -> grpcserver.Server:
    server = grpcserver.Server("bench", grpcserver.Limits(max_concurrent=WORKERS))
    server.add_methods({PATH: grpcserver.Method(grpc_health_v1_pb2.HealthCheckRequest, work, False,
                                                (lambda _: True) if inline else None)})
    server.add_unix(sock)
    server.start()
    return server


def client(target: str, calls: int) -> None:
    """(child process) `calls` round trips on one channel; prints the latencies in seconds as JSON."""
    request = grpc_health_v1_pb2.HealthCheckRequest().SerializeToString()
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(PATH)
        for _ in range(50):
            call(request, timeout=5)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call(request, timeout=5)
            times.append(time.perf_counter() - start)
    print(json.dumps(times))


def round_trips(target: str, calls: int) -> list[float]:
    out = subprocess.run([sys.executable, __file__, "--client", target, "--calls", str(calls)], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout
    times: list[float] = json.loads(out)
    return times


def probe(target: str) -> bool:
    request = grpc_health_v1_pb2.HealthCheckRequest().SerializeToString()
    try:
        with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            channel.unary_unary(PATH)(request, timeout=5)
        return True
    except grpc.RpcError:
        return False


def under_no_bodies(target: str, sock: Path) -> int:
    attackers = [subprocess.Popen([sys.executable, "-m", "tests.support.h2attack", "no-bodies", str(sock), "12"],
                                  cwd=REPO, stdout=subprocess.DEVNULL) for _ in range(2)]
    time.sleep(1.0)
    answered = sum(probe(target) for _ in range(10))
    for a in attackers:
        a.wait(30)
    return answered


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.client:
        client(a.client, a.calls)
        return 0
    results: dict[str, list[float]] = {"sync (pool)": [], "threaded (DRA)": [], "aio (pool)": [],
                                       "aio (event loop)": []}
    with tempfile.TemporaryDirectory(prefix="bgs", dir="/tmp") as d:
        for r in range(a.rounds):
            for i, name in enumerate(results):
                sock = Path(d) / f"{r}-{i}.sock"
                server: Any = start(name, sock)
                try:
                    results[name] += round_trips(f"unix:{sock}", a.calls // a.rounds)
                finally:
                    server.stop(0)
        print(f"round trip over a unix socket, {a.calls} calls each, client in another process:")
        for name, times in results.items():
            times.sort()
            print(f"  {name:18s} p50 {statistics.median(times) * 1e6:7.0f} us   "
                  f"p99 {times[int(len(times) * 0.99)] * 1e6:7.0f} us")
        for i, name in enumerate(("sync (pool)", "threaded (DRA)", "aio (pool)")):
            sock = Path(d) / f"attack-{i}.sock"
            server = start(name, sock)
            try:
                answered = under_no_bodies(f"unix:{sock}", sock)
            finally:
                server.stop(0)
            print(f"  {name:18s} 2 x 4 calls without bodies, {WORKERS} workers: {answered} of 10 probes answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
