"""Benchmark: checking 100 claim templates against every catalog instance type (target: under 1 s).

Prints the one-off cost of building the node models (emulated hosts on disk), the check time of 100
distinct templates x 10 instance types cold (fresh CEL environment and simulators) and warm, how many real
CEL evaluations the memo needed against the selector x device pairs checked, and the allocator simulation's
time on the hardest official-sample cases, with the search cut against the plain Go-like search as baseline.

Run: python bench/bench_claim_checks.py [--with-plain]
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

from neuron_dra.claim_templates import (
    ALL,
    AnyTopology,
    AtLeast,
    Checker,
    ClaimTemplate,
    Connected,
    Efa,
    FirstAvailable,
    Neuron,
    RingSegment,
    TemplateError,
    UltraServerNode,
)
from neuron_dra.claim_templates.allocator import Mode, SimulationResult, Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.examples import OFFICIAL_SAMPLES
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from neuron_dra.driver.model.catalog import CATALOG


def hundred_templates() -> list[ClaimTemplate]:
    """100 distinct, valid templates covering every request kind."""
    out: list[ClaimTemplate] = []
    targets: list[dict[str, Any]] = [{}, {"instance_types": "trn2.48xlarge"}, {"families": "trn1"},
                                     {"families": ("trn2", "trn2u")}, {"instance_types": ("trn1n.32xlarge",)}]
    for (i, kw), count, connected in itertools.product(enumerate(targets), (1, 2, 4, 8, 16), (False, True)):
        topology: Connected | AnyTopology = Connected() if connected else AnyTopology()
        try:
            out.append(ClaimTemplate(f"n{count}-t{i}-{'c' if connected else 'a'}",
                                     Neuron(count, topology=topology, **kw)))
        except TemplateError:
            continue  # e.g. more devices than the targets have
    for version in ("2.25.4.0", "2.24.0.0"):
        out.append(ClaimTemplate(f"pinned-{version.replace('.', '-')}", Neuron(ALL, kernel_driver=version)))
    for n, parts in enumerate(("2", "2.25", "2.25.4", "2.26")):
        out.append(ClaimTemplate(f"atleast-{n}", Neuron(2, kernel_driver=AtLeast(parts))))
    for mem in ("16Gi", "32Gi", "64Gi", "96Gi"):
        out.append(ClaimTemplate(f"hbm-{mem.lower()}", Neuron(1, min_memory=mem, min_cores=2)))
    for size in (1, 2, 3, 4, 6, 12):
        out.append(ClaimTemplate(f"ring-{size}", Neuron(size, topology=RingSegment(), families="inf2")))
    for mode in (1, 2, 4):
        out.append(ClaimTemplate(f"us-{mode}", UltraServerNode(mode, lnc=1), Neuron(ALL, families="trn2u", lnc=1)))
    for n in (1, 2, 4, 8):
        out.append(ClaimTemplate(f"efa-{n}", Neuron(n, topology=Connected() if n > 2 else AnyTopology()), Efa(n)))
        out.append(ClaimTemplate(f"efa-free-{n}", Neuron(n, families="trn2"), Efa(n, aligned_to=None)))
    for a, b in ((8, 16), (4, 8), (16, 1)):
        out.append(ClaimTemplate(f"fa-{a}-{b}", FirstAvailable(
            Neuron(a, topology=Connected(), instance_types="trn2.48xlarge"), Neuron(b, families="trn1"))))
    for lnc in (1, 2):
        out.append(ClaimTemplate(f"lnc-{lnc}", Neuron(4, topology=Connected(), families="trn2", lnc=lnc)))
    for instance_type, spec in CATALOG.items():
        for c in sorted({1, spec.device_count}):
            out.append(ClaimTemplate(f"{instance_type.replace('.', '-')}-{c}", Neuron(c, instance_types=instance_type)))
    for family in ("trn1", "trn1n", "trn2", "trn2u", "inf2"):
        out.append(ClaimTemplate(f"all-{family}", Neuron(ALL, families=family, kernel_driver="2.25.4.0")))
    out.append(ClaimTemplate("raw", Neuron(2, selectors=(
        "device.attributes['resource.kubernetes.io'].numaNode == 0",
        "cel.bind(a, device.attributes['neuron.aws.com'], a.deviceId >= 2)"))))
    names = [t.name for t in out]
    assert len(set(names)) == len(names)
    if len(out) < 100:
        raise SystemExit(f"only {len(out)} valid templates")
    return out[:100]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run_simulation(node: NodeModel, claim: dict[str, Any], env: CelEnvironment, prune: bool, mode: Mode
                   ) -> SimulationResult:
    sim = Simulator(node.slices, node.device_classes, node.node_name, cel=env, prune=prune)
    return simulate(node.slices, node.device_classes, [claim], node_name=node.node_name, mode=mode, simulator=sim)


def main() -> None:
    templates = hundred_templates()
    types = list(CATALOG)
    catalog = NodeCatalog()
    build, _ = timed(lambda: (catalog.nodes(), catalog.published()))
    print(f"node models for {len(types)} instance types (emulated hosts, built once per process): {build:.3f} s")

    def run_checks(checker: Checker) -> list[Any]:
        return [checker.check(t, types) for t in templates]

    cold_checker = Checker()
    cold_checker._catalogs[DEFAULT_DRIVERS] = catalog  # share the built models; everything else starts empty
    cold, reports = timed(lambda: run_checks(cold_checker))
    warm, _ = timed(lambda: run_checks(cold_checker))
    fits = sum(1 for r in reports for f in r.fits if f.claims_per_node)
    print(f"{len(templates)} templates x {len(types)} instance types, cold: {cold:.3f} s "
          f"({'under' if cold < 1 else 'OVER'} the 1 s target; {1e3 * cold / len(templates):.2f} ms per template)")
    print(f"same, warm (compiled selectors and evaluations reused): {warm:.3f} s (cold/warm = {cold / warm:.1f}x)")
    print(f"  {fits} template x type pairs fit; {sum(len(r.errors) for r in reports)} errors")
    pairs = sum(len(r.fits) for r in reports) and sum(
        node.device_count * sum(len(req.get('exactly', {}).get('selectors', [])) + 1 for req in
                                t.to_manifest()["spec"]["spec"]["devices"]["requests"])
        for t in templates for node in catalog.nodes(types))
    print(f"  real CEL evaluations: {cold_checker.cel.evaluations} for ~{pairs} selector x device pairs "
          f"(memo saves {pairs / max(cold_checker.cel.evaluations, 1):.0f}x)")

    print("allocator simulation, count mode on one empty node (cut vs. the plain search as baseline):")
    env = CelEnvironment()
    rows = []
    for t in OFFICIAL_SAMPLES:
        claim = {"metadata": {"name": t.name}, "spec": t.to_manifest()["spec"]["spec"]}
        for node in catalog.nodes(types):
            times = []
            for prune in (True, False):
                run_simulation(node, claim, env, prune, "count")  # CEL memo warm: time the search itself
                times.append(timed(functools.partial(run_simulation, node, claim, env, prune, "count")))
            (cut, result), (plain, baseline) = times
            assert result == baseline
            rows.append((plain, cut, t.name, node.instance_type, result.count))
    for plain, cut, name, instance_type, count in sorted(rows, reverse=True)[:5]:
        print(f"  {name} on {instance_type} ({count} per node): {1e3 * cut:.1f} ms with the cut, "
              f"{1e3 * plain:.1f} ms plain ({plain / cut:.1f}x)")
    # The Go search revisits every ordering of the same devices: 8 connected devices + 8 aligned EFAs on a
    # trn1.32xlarge (4 EFAs per devicegroup of 8) fail only after all 8! orderings of each group.
    node = catalog.node("trn1.32xlarge")
    t = ClaimTemplate("efa-8", Neuron(8, topology=Connected()), Efa(8))
    claim = {"metadata": {"name": t.name}, "spec": t.to_manifest()["spec"]["spec"]}
    cut, result = timed(functools.partial(run_simulation, node, claim, env, True, "fit-one"))
    assert not result.satisfiable
    line = (f"  pathological: 8 connected + 8 aligned EFAs on trn1.32xlarge (unsatisfiable): {1e3 * cut:.1f} ms "
            "with the cut")
    if "--with-plain" in sys.argv:  # about 90 s on a 2-core machine
        plain, baseline = timed(functools.partial(run_simulation, node, claim, env, False, "fit-one"))
        assert baseline == result
        line += f", {plain:.1f} s plain as the Go search does it ({plain / cut:.0f}x)"
    else:
        line += " (the plain search takes minutes: run with --with-plain)"
    print(line)


if __name__ == "__main__":
    main()
