"""`neuron-dra chart`: write the driver's Helm chart, generated from the same objects as the stack.

The chart (Chart.yaml, values.yaml, values.schema.json, templates/) is driver/deploy/chart.py's: its templates
are deploy.manifests() with the options as Helm values (docs/helm.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from neuron_dra.driver.deploy.chart import ChartError, write_chart

HELP = ("Write the driver's Helm chart into DIR/neuron-dra-driver/ (docs/helm.md): its templates are the objects "
        "of `neuron-dra plan -o yaml` with the deploy options as values; `helm package` it for the OCI artefact.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, metavar="DIR", help="where to write the chart's directory")


def run(args: argparse.Namespace) -> int:
    try:
        root = write_chart(args.directory)
    except (ChartError, OSError) as e:
        print(f"neuron-dra chart: {e}")
        return 1
    print(root)
    return 0
