"""Where the prepare and unprepare path spends its time, in-process (cProfile): DriverState on an emulated trn2 host
with claims from memory (no API server, no gRPC), the instances' lock held as the daemon holds it. Not a benchmark
of record (bench_peer.py is, against the Go driver); run `python bench/profile_prepare.py [rounds] [devices]`."""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin import ClaimRef
from neuron_dra.driver.kubeletplugin.toolkit import InstanceLock
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from tests.support.driver import DRIVER, NODE, FakeLookup, claim, devices, uid


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    per_claim = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with tempfile.TemporaryDirectory(prefix="nd-prof-") as d:
        base = Path(d)
        root = emulate("trn2.48xlarge", base / "host")
        lookup = FakeLookup()
        plugin = base / "plugins" / DRIVER
        state = DriverState(host=discover(root), host_root=root, driver_name=DRIVER, pool_name=NODE,
                            cdi=CdiStore(base / "cdi", DRIVER), checkpoint=Checkpoint(plugin / "checkpoint.json"),
                            lookup=lookup, instance_lock=InstanceLock(plugin))
        state.load()
        state.reconcile_local()
        refs = []
        for n in range(rounds):
            lookup.put(claim(f"c{n}", uid(n), devices(*range(per_claim))))
            refs.append(ClaimRef("default", f"c{n}", uid(n)))
        profile = cProfile.Profile()
        took = {"prepare": 0.0, "unprepare": 0.0}
        for ref in refs:
            t = time.perf_counter()
            profile.enable()
            answer = state.prepare([ref])
            profile.disable()
            took["prepare"] += time.perf_counter() - t
            assert not isinstance(answer[ref.uid], Exception), answer
            t = time.perf_counter()
            profile.enable()
            state.unprepare([ref])
            profile.disable()
            took["unprepare"] += time.perf_counter() - t
        state.close()
        print({k: f"{v / rounds * 1e6:.0f} us/call (profiled)" for k, v in took.items()})
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(12)
        stats.sort_stats("cumulative").print_stats(r"neuron_dra", 20)


if __name__ == "__main__":
    main()
