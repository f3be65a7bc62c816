"""Benchmark: what device health costs the daemon and how fast a fault reaches kubelet.

- Poll cost: one HealthMonitor.poll() over the 16 devices of an emulated trn2.48xlarge (three counter files per
  device), against reading the same 48 files with a bare loop (baseline), and CPU share at the default 1 s interval.
- Detection latency: a fault injected into the host tree -> the next NodeWatchResources response that reports the
  device UNHEALTHY, over the real gRPC stream (in process), at poll intervals 1 s (default) and 0.1 s.

Run: python bench/bench_health.py [--rounds N]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.daemon.health.stream import HealthStreamService
from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin._generated import dra_health_v1alpha1_pb2 as pb
from neuron_dra.driver.kubeletplugin._generated import dra_health_v1alpha1_pb2_grpc as pb_grpc
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import clear_faults, emulate, inject_fault
from neuron_dra.driver.model.health_source import ERROR_COUNTERS, hardware_dir


def _per_call(fn: object, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / n


def poll_cost(host: Path, n: int = 2000) -> None:
    monitor = HealthMonitor(host, range(16))
    files = [hardware_dir(host, i) / c for i in range(16) for c in ERROR_COUNTERS]

    def bare() -> None:
        for f in files:
            f.read_text()

    base = _per_call(bare, n)
    poll = _per_call(monitor.poll, n)
    print(f"poll of 16 devices: {poll * 1e6:8.1f} us  (Path.read_text of the same {len(files)} files: "
          f"{base * 1e6:.1f} us, ratio {poll / base:.2f}); at 1 poll/s: {poll * 100:.3f} % of one core")


def latency(host: Path, interval: float, rounds: int) -> list[float]:
    monitor = HealthMonitor(host, range(16), interval=interval)
    stop = threading.Event()
    service = HealthStreamService(monitor, discover(host), "bench", stop)
    server = grpcserver.Server("bench-health", grpcserver.Limits(max_concurrent=4))
    server.add_methods(service.methods())
    with tempfile.TemporaryDirectory(prefix="bh", dir="/tmp") as d:
        sock = f"{d}/h.sock"
        server.add_unix(Path(sock))
        server.start()
        monitor.start(stop)
        channel = grpc.insecure_channel(f"unix://{sock}")
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
        seen: list[tuple[float, int]] = []  # (time, health of neuron-device-3)

        def read() -> None:
            try:
                for resp in call:
                    h = next(x.health for x in resp.devices if x.device.device_name == "neuron-device-3")
                    seen.append((time.perf_counter(), h))
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        out = []
        try:
            for _ in range(rounds):
                time.sleep(interval * 0.37)  # land the fault at varying points of the poll cycle
                mark = len(seen)
                t0 = time.perf_counter()
                inject_fault(host, 3)
                while not any(h == pb.UNHEALTHY for _, h in seen[mark:]):
                    time.sleep(0.001)
                out.append(next(t for t, h in seen[mark:] if h == pb.UNHEALTHY) - t0)
                mark = len(seen)
                clear_faults(host, 3)
                while not any(h == pb.HEALTHY for _, h in seen[mark:]):
                    time.sleep(0.001)
        finally:
            call.cancel()
            channel.close()
            stop.set()
            server.stop(0.5)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    logging.getLogger("neuron_dra").setLevel(logging.ERROR)  # every fault logs a health change
    with tempfile.TemporaryDirectory() as d:
        host = emulate("trn2.48xlarge", Path(d) / "host")
        poll_cost(host)
        results = {interval: latency(host, interval, args.rounds) for interval in (1.0, 0.1)}
    base = statistics.median(results[0.1])
    for interval, values in results.items():
        med = statistics.median(values)
        print(f"fault -> UNHEALTHY on the health stream, poll every {interval:>3} s: median {med * 1000:7.1f} ms, "
              f"max {max(values) * 1000:7.1f} ms over {len(values)} faults (ratio to 0.1 s: {med / base:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
