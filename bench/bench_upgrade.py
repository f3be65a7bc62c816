"""Benchmark: hand-over between two instances of the driver on one node (a surge rollout), and prepare latency
while both run against one instance alone (docs/upgrades.md).

Daemons: `python -m tests.support.claims_dir_daemon` (the real daemon, claims read from local JSON files) on an
emulated trn2.48xlarge, each with names of its own (`--socket-names per-instance`, a new pod UID each), sharing
the plugin directory, its lock and its checkpoint, as two pods of the DaemonSet on one node.

A client plays kubelet: it prepares and unprepares one-device claims without pause. Each round: an idle phase
(one instance, calls to it), then a hand-over: the new instance starts; once its registration socket answers the
client calls both instances alternately (the worst case: after a kubelet restart either may get any call, so
every call takes the lock and refreshes what the other wrote) for the overlap time; then the old instance gets
SIGTERM and the client calls the new one. Figures, measured in the same run: prepare p50/p99 idle and during the
overlaps, as ratios to idle; start -> registration answered, start -> first prepare answered by the new instance,
SIGTERM -> the old instance gone; calls that failed (the hand-over's gap: none expected).

Run: python bench/bench_upgrade.py [--rounds 5] [--seconds 3] [--dir /tmp] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pluginclient lives with the tests (tests.support)

from neuron_dra.driver.kubeletplugin._sockets import SocketPaths
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from tests.support import pluginclient
from tests.support.pluginclient import ClaimRef, PluginCallError

DRIVER = DEFAULT_DRIVER_NAME
NODE = "bench-node"
CLAIMS = 8


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Instance:
    """One pod's daemon: its own socket names, the shared directories."""

    def __init__(self, base: Path) -> None:
        self.pod_uid = str(uuid.uuid4())
        self.paths = SocketPaths.for_driver(base / "plugins", base / "registry", DRIVER, self.pod_uid)
        self._log = (base / f"daemon-{self.pod_uid[:8]}.log").open("wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.claims_dir_daemon", "--claims-dir", str(base / "claims"),
             "--node-name", NODE, "--emulate", "trn2.48xlarge", "--plugins-dir", str(base / "plugins"),
             "--registry-dir", str(base / "registry"), "--cdi-root", str(base / "cdi"), "--log-level", "warning",
             "--socket-names", "per-instance", "--pod-uid", self.pod_uid],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.registered_after = self._wait_registered()
        self.client = pluginclient.DraClient(self.paths.dra)

    def _wait_registered(self) -> float:
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon {self.pod_uid} did not start (exit {self.proc.poll()})")
            if self.paths.registration.exists():
                try:
                    pluginclient.register(self.paths.registration)
                    return time.perf_counter() - self.started
                except Exception:  # not answering yet
                    pass
            time.sleep(0.005)

    def stop(self) -> float:
        """SIGTERM; seconds until the process is gone."""
        self.client.close()
        began = time.perf_counter()
        self.proc.terminate()
        self.proc.wait(60)
        self._log.close()
        return time.perf_counter() - began


class Kubelet:
    """Prepare (timed) and unprepare one-device claims in turn; failures counted, never raised."""

    def __init__(self) -> None:
        self.refs = [ClaimRef("bench", f"c{i}", f"00000000-0000-4000-8000-{i:012d}") for i in range(CLAIMS)]
        self.next = 0
        self.failed: list[str] = []

    def cycle(self, inst: Instance) -> float | None:
        ref = self.refs[self.next % CLAIMS]
        self.next += 1
        try:
            start = time.perf_counter()
            result = inst.client.prepare([ref], timeout=10)[ref.uid]
            took = time.perf_counter() - start
            if result.error:
                self.failed.append(result.error[:200])
                return None
            if inst.client.unprepare([ref], timeout=10)[ref.uid]:
                self.failed.append(f"unprepare of {ref.uid} failed")
            return took
        except PluginCallError as e:
            self.failed.append(f"{e.method}: {e.code.name}: {e.details[:200]}")
            return None


def write_claims(claims_dir: Path, refs: Sequence[ClaimRef]) -> None:
    claims_dir.mkdir(parents=True)
    for i, ref in enumerate(refs):
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "neurons", "driver": DRIVER, "pool": NODE, "device": f"neuron-device-{i}"}],
                     "config": []}}}}
        (claims_dir / f"{ref.namespace}_{ref.name}.json").write_text(json.dumps(claim))


def run(base: Path, rounds: int, seconds: float) -> dict[str, Any]:
    kubelet = Kubelet()
    write_claims(base / "claims", kubelet.refs)
    idle: list[float] = []
    overlap: list[float] = []
    registered, first_answer, old_gone = [], [], []
    current = Instance(base)
    for _ in range(20):  # warm up
        kubelet.cycle(current)
    try:
        for _ in range(rounds):
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                if (t := kubelet.cycle(current)) is not None:
                    idle.append(t)
            new = Instance(base)  # the surge pod; kubelet's calls go to the old one until it registers
            registered.append(new.registered_after)
            kubelet.cycle(new)  # waits until the new instance serves: the hand-over, not a prepare's latency
            first_answer.append(time.perf_counter() - new.started)
            until = time.monotonic() + seconds
            turn = 0
            while time.monotonic() < until:
                turn += 1
                if (t := kubelet.cycle(new if turn % 2 else current)) is not None:
                    overlap.append(t)
            old_gone.append(current.stop())
            current = new
    finally:
        current.stop()
    return {
        "rounds": rounds, "overlap_seconds": seconds, "calls_failed": len(kubelet.failed),
        "failures": kubelet.failed[:5],
        "idle": {"n": len(idle), "p50_ms": percentile(idle, 50) * 1e3, "p99_ms": percentile(idle, 99) * 1e3},
        "overlap": {"n": len(overlap), "p50_ms": percentile(overlap, 50) * 1e3,
                    "p99_ms": percentile(overlap, 99) * 1e3},
        "ratio_p50": percentile(overlap, 50) / percentile(idle, 50),
        "ratio_p99": percentile(overlap, 99) / percentile(idle, 99),
        "start_to_registered_s": statistics.median(registered),
        "start_to_first_prepare_s": statistics.median(first_answer),
        "sigterm_to_gone_s": statistics.median(old_gone),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0, help="idle and overlap time per round")
    p.add_argument("--dir", type=Path, default=None, help="where the daemons' directories go (default: a temp dir)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nd-upg-", dir=a.dir) as tmp:
        out = run(Path(tmp), a.rounds, a.seconds)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0 if not out["calls_failed"] else 1
    print(f"{out['rounds']} hand-overs, {out['overlap_seconds']:g} s idle and {out['overlap_seconds']:g} s overlap "
          f"each; calls failed: {out['calls_failed']}")
    for name in ("idle", "overlap"):
        f = out[name]
        print(f"  prepare {name:8s} n={f['n']:5d}  p50 {f['p50_ms']:7.3f} ms  p99 {f['p99_ms']:7.3f} ms")
    print(f"  overlap / idle: p50 {out['ratio_p50']:.2f}x, p99 {out['ratio_p99']:.2f}x")
    print(f"  new instance: start -> registration answered {out['start_to_registered_s']:.3f} s, "
          f"-> first prepare answered {out['start_to_first_prepare_s']:.3f} s (median)")
    print(f"  old instance: SIGTERM -> gone {out['sigterm_to_gone_s']:.3f} s (median)")
    for f in out["failures"]:
        print(f"  failed: {f}")
    return 0 if not out["calls_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
