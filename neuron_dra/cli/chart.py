"""`neuron-dra chart`: write the driver's Helm chart, generated from the same objects as the stack.

The chart (Chart.yaml, values.yaml, values.schema.json, templates/) is driver/deploy/chart.py's: its templates
are deploy.manifests() with the options as Helm values (docs/helm.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.driver.deploy import DeployOptionError
from neuron_dra.driver.deploy.chart import DEFAULT_GENERATION, ChartError, write_chart

HELP = ("Write the driver's Helm chart into DIR/neuron-dra-driver/ (docs/helm.md): its templates are the objects "
        "of `neuron-dra plan -o yaml` with the deploy options as values; `helm package` it for the OCI artefact.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, metavar="DIR", help="where to write the chart's directory")
    parser.add_argument("--kubernetes-version", default=DEFAULT_GENERATION["kubernetes_version"], metavar="MINOR",
                        help="the Kubernetes minor the chart is for, and up (default: %(default)s, the default "
                             "stack's): what it serves decides objects and flags (docs/helm.md)")
    parser.add_argument("--core-partitions", default=DEFAULT_GENERATION["core_partitions"],
                        help="the daemon's NeuronCore publishing: auto, on or off (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        root = write_chart(args.directory, {"kubernetes_version": args.kubernetes_version,
                                            "core_partitions": args.core_partitions})
    except (ChartError, DeployOptionError, OSError) as e:
        print(f"neuron-dra chart: {e}", file=sys.stderr)
        return 1
    print(root)
    return 0
