"""`neuron-dra dashboard`: print the Grafana dashboard of the driver's metrics (JSON or its ConfigMap).

The dashboard is driver/deploy/dashboard.py's; the ConfigMap is the one the stack installs for the Grafana sidecar.
"""

from __future__ import annotations

import argparse
import json
import sys

from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions, dashboard_config_map
from neuron_dra.driver.deploy.dashboard import dashboard_text

HELP = ("Print the Grafana dashboard of the driver's attribution metrics (docs/metrics.md) as JSON, or with "
        "--config-map as the ConfigMap a Grafana sidecar loads.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-map", action="store_true", help="print the ConfigMap (JSON) instead")
    parser.add_argument("--namespace", default="", metavar="NS",
                        help="the ConfigMap's namespace (default: the driver's)")
    parser.add_argument("--label", default=DriverDeployOptions().grafana_dashboard_label, metavar="KEY=VALUE",
                        help="the label the Grafana sidecar selects (default: %(default)s, kube-prometheus-stack's)")


def run(args: argparse.Namespace) -> int:
    try:
        import grafana_foundation_sdk  # noqa: F401  (the dashboard's builder)
    except ImportError:
        print("neuron-dra dashboard: the Grafana Foundation SDK is not installed; pip install "
              "'neuron-dra[dashboard]' (or grafana-foundation-sdk)", file=sys.stderr)
        return 2
    if not args.config_map:
        sys.stdout.write(dashboard_text())
        return 0
    try:
        options = DriverDeployOptions(grafana_dashboard=True, grafana_dashboard_namespace=args.namespace,
                                      grafana_dashboard_label=args.label)
    except DeployOptionError as e:
        print(f"neuron-dra dashboard: {e}", file=sys.stderr)
        return 2
    print(json.dumps(dashboard_config_map(options), indent=2))
    return 0
