"""How the default stack's mocked run time grows with the number of node groups (1, 10, 50).

Each run is the real stack program (`build_stack`) under `run_offline`'s Pulumi mocks with preview=False, so
every resource is registered and every Output resolved, as in `neuron-dra plan`. The 1-group run measured in
the same process is the baseline; the figures are the median of REPEAT runs after one warm-up run (imports,
claim-template node models). Usage: python bench/bench_stack.py [--repeat N] [--templates]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from neuron_dra.components.mocks import run_offline
from neuron_dra.components.stack import build_stack, settings_from_pulumi_config

SIZES = (1, 10, 50)


def config(groups: int, templates: bool) -> dict[str, str]:
    node_groups = [{"name": f"g{i}", "instanceType": "trn2.48xlarge", "desiredSize": 1} for i in range(groups)]
    return {
        "neuron-dra:nodeGroups": json.dumps(node_groups),
        "neuron-dra:driverImage": "example.com/neuron-dra-driver:bench",
        "neuron-dra:claimTemplatesModule": "neuron_dra.claim_templates.stack_examples" if templates else "",
    }


def one_run(groups: int, templates: bool) -> tuple[float, int]:
    start = time.perf_counter()
    run = run_offline(lambda: build_stack(settings_from_pulumi_config("neuron-dra"), stack="bench"),
                      config=config(groups, templates), stack="bench")
    return time.perf_counter() - start, len(run.resources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--templates", action="store_true", help="also deploy and check the stack examples")
    args = parser.parse_args()
    one_run(1, args.templates)  # warm-up
    rows = []
    for size in SIZES:
        times, count = [], 0
        for _ in range(args.repeat):
            seconds, count = one_run(size, args.templates)
            times.append(seconds)
        rows.append((size, statistics.median(times), count))
    base_groups, base_time, base_count = rows[0]
    print(f"mocked stack run (median of {args.repeat}; templates {'on' if args.templates else 'off'})")
    print(f"{'node groups':>11} {'resources':>9} {'seconds':>8} {'x 1-group':>9} {'ms/resource':>11}")
    for size, seconds, count in rows:
        print(f"{size:>11} {count:>9} {seconds:>8.3f} {seconds / base_time:>9.2f} {1000 * seconds / count:>11.2f}")
    last_groups, last_time, last_count = rows[-1]
    per_group = (last_time - base_time) / (last_groups - base_groups)
    print(f"marginal cost: {1000 * per_group:.1f} ms per node group "
          f"({(last_count - base_count) // (last_groups - base_groups)} resources each)")


if __name__ == "__main__":
    main()
