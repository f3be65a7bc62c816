"""Where the prepare and unprepare path spends its CPU, in-process: the DRA service's handlers as the gRPC server
calls them (request bytes parsed, the helper's call path with its claim lookup and its lock, the driver's
DriverState on an emulated trn2 host, the response serialized), with claims from memory (no API server) and the
instances' flock held as the daemon holds it. No sockets: the gRPC transport is bench_peer.py's. Not a benchmark
of record (bench_peer.py is, against the Go driver).

    python bench/profile_prepare.py [rounds] [devices]   # CPU per call (time.process_time), wall p50, a cProfile
    PROFILE=0 python bench/profile_prepare.py ...        # without the cProfile
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin._calls import Calls
from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2
from neuron_dra.driver.kubeletplugin._grpcserver import CallContext, parse
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, InstanceLock
from neuron_dra.driver.kubeletplugin._logs import configure as configure_logs
from neuron_dra.driver.kubeletplugin._plugin import dra_services
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from tests.support.driver import DRIVER, NODE, FakeLookup, claim, devices, uid

CHUNK = 50  # rounds per measurement
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"


def handler(methods: dict[str, Any], path: str) -> Callable[[bytes], bytes]:
    """The server's steps for one unary call: parse, behaviour (with a CallContext of kubelet's 45 s), serialize,
    end (the call's end callbacks)."""
    method = methods[path]

    def call(data: bytes) -> bytes:
        context = CallContext(time.monotonic() + 45)
        answer: bytes = method.behaviour(parse(method.request_type, data), context).SerializeToString()
        context.end()
        return answer

    return call


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    per_claim = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    # The daemon's JSON lines, at its default level (LOGLEVEL=warning: without the per-claim lines).
    configure_logs(os.environ.get("LOGLEVEL", "info"), open(os.devnull, "w"))  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="nd-prof-") as d:
        base = Path(d)
        root = emulate("trn2.48xlarge", base / "host")
        lookup = FakeLookup()
        plugin = base / "plugins" / DRIVER
        state = DriverState(host=discover(root), host_root=root, driver_name=DRIVER, pool_name=NODE,
                            cdi=CdiStore(base / "cdi", DRIVER), checkpoint=Checkpoint(plugin / "checkpoint.json"),
                            lookup=lookup, lock=CallLock(InstanceLock(plugin)))
        state.load()
        state.reconcile_local()
        methods = dra_services(Calls(state, lookup, state.lock))
        prepare, unprepare = handler(methods, PREPARE), handler(methods, UNPREPARE)
        requests = []
        for n in range(rounds):
            lookup.put(claim(f"c{n}", uid(n), devices(*range(per_claim))))
            claims = [dra_v1_pb2.Claim(namespace="default", name=f"c{n}", uid=uid(n))]
            requests.append((dra_v1_pb2.NodePrepareResourcesRequest(claims=claims).SerializeToString(),
                             dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims).SerializeToString()))
        lookup.calls = _Discard()  # the fake's call log would grow with every round

        wall: dict[str, list[float]] = {}

        def run(profile: cProfile.Profile | None = None) -> dict[str, list[float]]:
            """CPU seconds per call of each kind, per chunk of CHUNK rounds."""
            cpu: dict[str, list[float]] = {"prepare": [], "unprepare": []}
            wall.update({"prepare": [], "unprepare": []})
            for start in range(0, len(requests), CHUNK):
                spent = {"prepare": 0.0, "unprepare": 0.0}
                for p, u in requests[start:start + CHUNK]:
                    for name, fn, data in (("prepare", prepare, p), ("unprepare", unprepare, u)):
                        t, w = time.process_time(), time.perf_counter()
                        if profile:
                            profile.enable()
                        answer = fn(data)
                        if profile:
                            profile.disable()
                        wall[name].append(time.perf_counter() - w)
                        spent[name] += time.process_time() - t
                        assert b"error" not in answer or name == "unprepare", answer
                for name, v in spent.items():
                    cpu[name].append(v / len(requests[start:start + CHUNK]))
            return cpu

        run()  # warm-up: imports, caches, the journal's first generation
        cpu = run()
        # The least of the chunks: the machine's other work only adds (this one is shared).
        print(f"{per_claim} device(s), {rounds} rounds: " + ", ".join(
            f"{k} {min(v) * 1e3:.3f} ms CPU/call (median of {len(v)} chunks {statistics.median(v) * 1e3:.3f})"
            for k, v in cpu.items()) + "; wall p50 " + ", ".join(
            f"{k} {statistics.median(v) * 1e3:.3f} ms" for k, v in wall.items()))
        if os.environ.get("PROFILE", "1") == "0":
            state.close()
            return
        profile = cProfile.Profile()
        run(profile)
        state.close()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(30)


class _Discard(list[tuple[str, str]]):
    def append(self, item: tuple[str, str]) -> None:
        pass


if __name__ == "__main__":
    main()
