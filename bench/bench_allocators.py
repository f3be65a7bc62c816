"""Benchmark: the Python allocator simulation against kube-scheduler's allocator (Go) on the same cases.

The cases are the differential test's (tests/support/allocator_cases.py, same seed): claims x every catalog node x
already allocated devices, each run in "fit-one" and "count" mode. Figures:
- Go, the allocator's own time per run (`nanos`: fresh allocator + Allocate, as the scheduler's Filter) -
  the baseline every ratio is against;
- Go wall time: all runs through one allocsim process (process start, JSON in and out included), and
  single-run processes on a sample (what one call from Python costs);
- Python in-process: simulate() with a fresh Simulator per run, first with a cold CEL environment
  (compiling and evaluating as it goes), then warm; and with one Simulator per node as the claim checks
  use it; optionally (--plain) the search without its cut and memo, as Go searches (and its allocateOne
  calls a second: the case generator sizes Go's searches with it).
Per run: p50, p99 and max (a Python max can be a garbage-collector pause); per category: totals. Only the
differential test asserts anything; this prints figures.

Run: python bench/bench_allocators.py [--cases N] [--seed S] [--sample K] [--plain]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the case generator lives with the tests (tests.support)

from neuron_dra.claim_templates.allocator import Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.node_model import NodeCatalog
from tests.support import allocsim
from tests.support.allocator_cases import Case, CaseGenerator
from tests.support.allocator_compare import Answer, compare, go_answers, python_answers, runs


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:9.3f} ms"


def row(name: str, per_run: Sequence[float], total: float, baseline: Sequence[float], baseline_total: float) -> str:
    p50, p99 = quantile(per_run, 0.5), quantile(per_run, 0.99)
    b50, b99 = quantile(baseline, 0.5), quantile(baseline, 0.99)
    return (f"{name:<44} total {total:8.3f} s ({total / baseline_total:6.2f}x)  p50 {ms(p50)} ({p50 / b50:6.2f}x)"
            f"  p99 {ms(p99)} ({p99 / b99:6.2f}x)  max {ms(max(per_run))}")


def timed(fn: Callable[[], list[Answer]]) -> tuple[list[Answer], float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def plain_answers(cases: Sequence[Case], catalog: NodeCatalog, cel: CelEnvironment,
                  calls: list[int] | None = None) -> list[Answer]:
    """simulate() with the search cut and the failed-subtree memo off (prune=False): Go's search in Python
    (what the case generator runs to size Go's searches). `calls` gets the allocateOne calls of every run."""
    out = []
    for case, mode in runs(cases):
        node = catalog.node(case.instance_type)
        slices = case.node_slices(node)
        started = time.perf_counter()
        sim = Simulator(slices, node.device_classes, node.node_name, None, cel, prune=False)
        r = simulate(slices, node.device_classes, list(case.claims), node_name=node.node_name,
                     allocated=case.allocated, mode=mode, cel=cel, simulator=sim)
        out.append(Answer(r.satisfiable, r.count, r.error or "", time.perf_counter() - started))
        if calls is not None:
            calls.append(sum(r.searches))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=20250612)
    parser.add_argument("--sample", type=int, default=60, help="runs measured as one allocsim process each")
    parser.add_argument("--plain", action="store_true", help="also time the Python search without its cut")
    args = parser.parse_args()

    started = time.perf_counter()
    exe = allocsim.binary()
    print(f"allocsim binary: {exe} (ready in {time.perf_counter() - started:.2f} s)")
    catalog = NodeCatalog(partitionable=False)  # as the differential test: these generators shape whole-device pools
    started = time.perf_counter()
    catalog.nodes()
    print(f"node models (emulated hosts): {time.perf_counter() - started:.2f} s")
    started = time.perf_counter()
    generated = CaseGenerator(args.seed, catalog, CelEnvironment()).generate(args.cases)
    cases = generated.cases
    print(f"{len(cases)} cases x 2 modes = {2 * len(cases)} runs, generated in {time.perf_counter() - started:.2f} s "
          f"({len(generated.rejected)} left out: Go's search over the budget)")

    go = go_answers(cases, catalog, batches=1)
    go_nanos = [a.seconds for a in go.answers]
    go_total = sum(go_nanos)
    cel = CelEnvironment()
    cold, cold_wall = timed(lambda: python_answers(cases, catalog, cel, reuse_simulators=False))
    warm, warm_wall = timed(lambda: python_answers(cases, catalog, cel, reuse_simulators=False))
    shared, shared_wall = timed(lambda: python_answers(cases, catalog, cel, reuse_simulators=True))

    sample = [cases[i * len(cases) // args.sample] for i in range(min(args.sample, len(cases)))]
    single_walls = []
    for case in sample:
        started = time.perf_counter()
        go_answers([case], catalog, batches=1)
        single_walls.append((time.perf_counter() - started) / 2)  # one process, both modes of the case

    verdicts = compare(cases, warm, go.answers)
    disagree = sum(v.kind == "disagree" for v in verdicts)
    timeouts = sum(v.kind == "go-timeout" for v in verdicts)
    print(f"answers: {len(verdicts) - disagree - timeouts} agree, {disagree} disagree, {timeouts} Go timeouts\n")

    print("per run (baseline = Go allocator time from allocsim's nanos):")
    print(row("go: allocator (nanos)", go_nanos, go_total, go_nanos, go_total))
    wall_per_run = go.wall_seconds / len(go_nanos)
    print(f"{'go: wall, one process for all runs':<44} total {go.wall_seconds:8.3f} s "
          f"({go.wall_seconds / go_total:6.2f}x)  = {ms(wall_per_run)} per run, process start + JSON included")
    sample_nanos = [a.seconds for c in sample for a, (rc, _) in zip(go.answers, runs(cases), strict=True) if rc is c]
    print(row(f"go: wall, one process per case ({len(sample)} cases)", single_walls, sum(single_walls),
              sample_nanos, sum(sample_nanos)) + "   [ratios vs the same runs' nanos]")
    print(row("python: fresh Simulator per run, cold CEL", [a.seconds for a in cold], cold_wall, go_nanos, go_total))
    print(row("python: fresh Simulator per run, warm CEL", [a.seconds for a in warm], warm_wall, go_nanos, go_total))
    print(row("python: one Simulator per node, warm CEL", [a.seconds for a in shared], shared_wall, go_nanos,
              go_total))
    if args.plain:
        calls: list[int] = []
        plain, plain_wall = timed(lambda: plain_answers(cases, catalog, cel, calls))
        print(row("python: plain search (no cut, no memo)", [a.seconds for a in plain], plain_wall, go_nanos,
                  go_total))
        print(f"{'':<44} {sum(calls):,} allocateOne calls (Go's search), {sum(calls) / plain_wall:,.0f} a second")

    print("\nper category (totals; python = fresh Simulator per run, warm CEL):")
    print(f"{'category':<16}{'runs':>6}{'go':>14}{'python':>14}{'python/go':>11}{'go p99':>14}{'python p99':>14}")
    categories = sorted({c.category for c in cases})
    for category in categories:
        pairs = [(g.seconds, p.seconds) for (c, _), g, p in zip(runs(cases), go.answers, warm, strict=True)
                 if c.category == category]
        g_total, p_total = sum(g for g, _ in pairs), sum(p for _, p in pairs)
        print(f"{category:<16}{len(pairs):>6}{ms(g_total):>14}{ms(p_total):>14}{p_total / g_total:>10.2f}x"
              f"{ms(quantile([g for g, _ in pairs], 0.99)):>14}{ms(quantile([p for _, p in pairs], 0.99)):>14}")
    for name, answers in (("Go", go.answers), ("Python (fresh Simulator, warm CEL)", warm)):
        (case, mode), answer = max(zip(runs(cases), answers, strict=True), key=lambda x: x[1].seconds)
        print(f"slowest {name} run: {case.id} ({mode}) {ms(answer.seconds)}")
    ratio = statistics.median(p.seconds / g for p, g in zip(warm, go_nanos, strict=True))
    print(f"median over runs of python/go (fresh Simulator, warm CEL): {ratio:.2f}x")


if __name__ == "__main__":
    main()
