"""`neuron-dra cluster up|down|build`: the local control plane with emulated Neuron nodes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.driver.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster import cli_build
from neuron_dra.localcluster.supervisor import DEFAULT_TTL_S

HELP = ("A real kube-apiserver, kube-controller-manager and kube-scheduler (built from the Go module proxy) on "
        "loopback, with emulated Neuron nodes each running the driver daemon and a kubelet stand-in.")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", metavar="up|down|build", required=True)
    up = sub.add_parser("up", help="start the cluster in DIR and return when it is ready")
    up.add_argument("--dir", type=Path, required=True, help="state directory (kubeconfig, logs, node trees)")
    up.add_argument("--node", action="append", default=None, metavar="TYPE[:COUNT]",
                    help="emulated nodes, repeatable (default: trn2.48xlarge:2, trn1.32xlarge, inf2.48xlarge)")
    up.add_argument("--ttl", type=float, default=DEFAULT_TTL_S, help="stop by itself after this many seconds")
    up.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME)
    down = sub.add_parser("down", help="stop the cluster in DIR")
    down.add_argument("--dir", type=Path, required=True)
    build = sub.add_parser("build", help=cli_build.HELP)
    cli_build.configure(build)


def run(args: argparse.Namespace) -> int:
    from neuron_dra.localcluster.cluster import ClusterError, down, up
    from neuron_dra.localcluster.topology import DEMO_NODES

    if args.cluster_command == "build":
        return cli_build.run(args)
    if args.cluster_command == "down":
        print("stopped" if down(args.dir) else f"no local cluster running in {args.dir}")
        return 0
    try:
        cluster = up(args.dir, args.node or list(DEMO_NODES), ttl=args.ttl, driver_name=args.driver_name,
                     log=lambda m: print(m, file=sys.stderr))
    except (ClusterError, ValueError) as e:
        print(f"neuron-dra cluster up: {e}", file=sys.stderr)
        return 1
    print(f"local cluster ready: export KUBECONFIG={cluster.kubeconfig}")
    for node in cluster.nodes:
        print(f"  node {node.name} ({node.instance_type})")
    return 0
