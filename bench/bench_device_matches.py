"""Benchmark: what one CEL evaluation costs kube-scheduler on our Neuron device against AWS-shaped ones.

kube-scheduler's DRA allocator calls `cel.CompilationResult.DeviceMatches` (k8s.io/dynamic-resource-allocation)
once per selector and candidate device on every node it filters, and each call first copies all of the device's
attributes and capacities into fresh Go maps (docs/scale.md §2). This times that call, built from the Go module
proxy at the version kube-scheduler 1.36 is built with (bench/go/devicematches, cached like allocsim), on:

- `aws`: a trn2.48xlarge device as AWS's driver publishes it (bench/scale_cluster.py `aws_shaped`): the baseline;
- `ours`: the same device as our driver publishes it (driver/model/slices.py, --core-partitions off);
- `ours-no-capacity`, `ours-no-standard`, `ours-aws-domain`: ours without its capacities, without its
  `resource.kubernetes.io` attributes, with only AWS's attributes in `neuron.aws.com` (what each part costs);
- `efa`: an EFA driver device (the Neuron class selector is evaluated on the node's 16 EFAs too).

The expressions are the Neuron DeviceClass's selector and the request selectors of the `one-neuron-device` and
`neuron-1x4-connected` templates, as the claim_templates package renders them. Variants are timed in turn, round
after round; figures are medians over the rounds of CPU time, bytes and allocations per evaluation, with each
variant's ratio to `aws` from the same run.

Run: python bench/bench_device_matches.py [--rounds 7] [--iterations 20000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale_cluster, beside this file

from scale_cluster import AWS_ATTRIBUTES, node_slices

from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.examples import neuron_1x4_connected, one_neuron_device
from neuron_dra.driver.model.efa import EFA_DRIVER
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import K8S_DOMAIN
from neuron_dra.localcluster.build import BuildError, cache_root, cached_go_build, source_hash

MODULE = Path(__file__).resolve().parent / "go" / "devicematches"
BINARY = "devicematches"
NEURON_DRIVER = DEFAULT_DRIVERS.neuron_driver
BASELINE = "aws"


def harness() -> Path:
    """The Go harness, built on first use into the shared cache (keyed by its sources)."""
    target = cache_root() / BINARY / source_hash(MODULE)
    return cached_go_build(MODULE, {BINARY: "neuron-dra/bench/go/devicematches"}, target, ldflags=["-s", "-w"],
                           log=lambda m: print(m, file=sys.stderr))[BINARY]


def expressions() -> list[str]:
    """The Neuron class's selectors, then each template's request selectors (as the scheduler evaluates them)."""
    classes = {c["metadata"]["name"]: c for c in DEFAULT_DRIVERS.device_classes()}
    out = [s["cel"]["expression"] for s in classes[DEFAULT_DRIVERS.neuron_class]["spec"]["selectors"]]
    for template in (one_neuron_device, neuron_1x4_connected):
        for request in template.to_manifest()["spec"]["spec"]["devices"]["requests"]:
            out += [s["cel"]["expression"] for s in request["exactly"].get("selectors", ())]
    return out


def variants() -> list[dict[str, Any]]:
    """Device 0 of a trn2.48xlarge in each variant, as the harness reads them."""
    host = emulated_host("trn2.48xlarge")
    ours_slices = node_slices(host, "bench-node", "ours")  # the Neuron slice, then the EFA driver's
    ours = ours_slices[0]["spec"]["devices"][0]
    aws = node_slices(host, "bench-node", "aws")[0]["spec"]["devices"][0]

    def without(keep: Callable[[str], bool], capacity: bool = True) -> dict[str, Any]:
        return {**ours, "attributes": {k: v for k, v in ours["attributes"].items() if keep(k)},
                "capacity": ours.get("capacity", {}) if capacity else {}}

    own_domain_extra = {k for k in ours["attributes"] if "/" not in k and k not in AWS_ATTRIBUTES}
    devices = {
        "aws": (NEURON_DRIVER, aws),
        "ours": (NEURON_DRIVER, ours),
        "ours-no-capacity": (NEURON_DRIVER, without(lambda k: True, capacity=False)),
        "ours-no-standard": (NEURON_DRIVER, without(lambda k: not k.startswith(f"{K8S_DOMAIN}/"))),
        "ours-aws-domain": (NEURON_DRIVER, without(lambda k: k not in own_domain_extra)),
        "efa": (EFA_DRIVER, ours_slices[-1]["spec"]["devices"][0]),
    }
    return [{"name": name, "driver": driver, "attributes": d.get("attributes", {}), "capacity": d.get("capacity", {})}
            for name, (driver, d) in devices.items()]


def entries(device: dict[str, Any]) -> str:
    """`attributes / capacities / attribute domains` of a variant."""
    attrs = device["attributes"]
    domains = {k.split("/", 1)[0] if "/" in k else device["driver"] for k in attrs}
    return f"{len(attrs)} / {len(device['capacity'])} / {len(domains)}"


def run(rounds: int, iterations: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    devices, exprs = variants(), expressions()
    body = json.dumps({"expressions": exprs, "devices": devices, "rounds": rounds, "iterations": iterations})
    proc = subprocess.run([str(harness())], input=body, capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"devicematches exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return devices, json.loads(proc.stdout)["results"], exprs


def summary(devices: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for d in devices:
        mine = [r for r in results if r["name"] == d["name"]]
        rows.append({"name": d["name"], "entries": entries(d),
                     "cpu_us": statistics.median(r["cpuNanosPerEval"] for r in mine) / 1000,
                     "bytes": statistics.median(r["bytesPerEval"] for r in mine),
                     "allocs": statistics.median(r["allocsPerEval"] for r in mine),
                     "cpu_ratio_rounds": [r["cpuNanosPerEval"] / b["cpuNanosPerEval"] for r, b in
                                          zip(mine, [r for r in results if r["name"] == BASELINE], strict=True)]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7, help="rounds over all variants (1..100)")
    parser.add_argument("--iterations", type=int, default=20000,
                        help="evaluations of every expression per variant and round (1..10000000)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 100 or not 1 <= args.iterations <= 10_000_000:
        parser.error("--rounds must be 1..100 and --iterations 1..10000000")
    try:
        devices, results, exprs = run(args.rounds, args.iterations)
    except BuildError as e:
        raise SystemExit(f"building the harness failed: {e}") from None
    rows = summary(devices, results)
    base = next(r for r in rows if r["name"] == BASELINE)
    print(f"DeviceMatches per evaluation ({len(exprs)} expressions x {args.iterations} iterations x {args.rounds} "
          f"rounds, medians; entries = attributes / capacities / attribute domains)")
    print(f"  {'variant':18s} {'entries':>12s} {'CPU us':>8s} {'ratio':>6s} {'rounds':>11s} {'bytes':>7s} "
          f"{'allocs':>7s}")
    for r in rows:
        spread = f"{min(r['cpu_ratio_rounds']):.2f}-{max(r['cpu_ratio_rounds']):.2f}"
        print(f"  {r['name']:18s} {r['entries']:>12s} {r['cpu_us']:8.2f} {r['cpu_us'] / base['cpu_us']:6.2f} "
              f"{spread:>11s} {r['bytes']:7.0f} {r['allocs']:7.1f}")
    ours = next(r for r in rows if r["name"] == "ours")
    extra = ours["cpu_us"] - base["cpu_us"]
    if extra > 0:
        print(f"ours costs {extra:.2f} us more per evaluation than aws; of that, removing each part saves:")
        for r in rows:
            if r["name"].startswith("ours-"):
                print(f"  {r['name']:18s} {(ours['cpu_us'] - r['cpu_us']) / extra:6.0%} "
                      f"({ours['allocs'] - r['allocs']:.1f} allocations, {ours['bytes'] - r['bytes']:.0f} bytes)")
    if args.json:
        args.json.write_text(json.dumps({"expressions": exprs, "devices": devices, "results": results,
                                         "summary": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
