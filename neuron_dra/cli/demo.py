"""`neuron-dra demo`: run the local cluster with emulated Trainium nodes, the driver and example workloads.

The main job on one machine (localcluster/demo/run.py).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from kubernetes.client.exceptions import ApiException

from neuron_dra.cli._host import add_host_arguments, choose
from neuron_dra.localcluster.build import DEFAULT_MINOR, BuildError, supported_minors
from neuron_dra.localcluster.cluster import ClusterError
from neuron_dra.localcluster.demo.report import ReportError
from neuron_dra.localcluster.demo.run import DemoError, DemoOptions, run_demo

HELP = ("Bring up the local cluster (real kube-apiserver, kube-scheduler and kube-controller-manager; two "
        "trn2.48xlarge, one trn1.32xlarge and one inf2.48xlarge emulated node and a trn2u.48xlarge UltraServer of "
        "four, each running the driver), install the example claim templates, run example workloads (a 4-pod job on "
        "one UltraServer, connected groups, a whole node, LNC=1, aligned EFA, inf2 ring segments) and show where "
        "they ran: pod -> node -> devices -> cores, each node's topology in the terminal and as an SVG file. The "
        "cluster is torn down afterwards unless --keep. The first run builds the Kubernetes binaries from the Go "
        "module proxy (minutes; cached afterwards).")


class _Terminated(Exception):
    """SIGTERM: unwind like Ctrl-C, so the cluster is stopped."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise _Terminated()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None,
                        help="state directory (kubeconfig, logs, the SVG); default: a new temporary directory")
    parser.add_argument("--keep", action="store_true",
                        help="leave the cluster running; prints the KUBECONFIG export and the command to stop it")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds for the workloads to be scheduled and to run (default 180)")
    parser.add_argument("--kubernetes-version", default=DEFAULT_MINOR, metavar="MINOR",
                        help=f"Kubernetes minor of the local cluster: {', '.join(supported_minors())} "
                             f"(default {DEFAULT_MINOR}, the newest EKS serves)")
    add_host_arguments(parser)
    parser.add_argument("--prometheus", action="store_true",
                        help="also run Prometheus (built from the Go module proxy) scraping the drivers and show "
                             "which pod it says holds which device and cores (docs/metrics.md)")
    parser.add_argument("--ttl", type=float, default=None,
                        help="the cluster stops by itself after this many seconds (default 2 h with --keep, "
                             "else 30 min)")


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        print(f"neuron-dra demo: --timeout must be positive, got {args.timeout}", file=sys.stderr)
        return 2
    if args.ttl is not None and args.ttl < 60:
        print(f"neuron-dra demo: --ttl must be at least 60 seconds, got {args.ttl}", file=sys.stderr)
        return 2
    runtime = choose(args, "neuron-dra demo")
    if runtime is None:
        return 1
    options = DemoOptions(dir=args.dir, keep=args.keep, timeout=args.timeout, ttl=args.ttl,
                          kubernetes_version=args.kubernetes_version, runtime=runtime, prometheus=args.prometheus)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = run_demo(options)
    except (DemoError, ClusterError, BuildError, ReportError) as e:
        print(f"neuron-dra demo: failed: {e}", file=sys.stderr)
        return 1
    except ApiException as e:
        print(f"neuron-dra demo: failed: the API server answered {e.status} {e.reason}: {e.body}", file=sys.stderr)
        return 1
    except (_Terminated, KeyboardInterrupt):
        print("neuron-dra demo: interrupted; the local cluster was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    health = "" if result.health is None else (
        f"; a device fault was tainted in {result.health.taint_seconds:.1f} s and avoided, and cleared in "
        f"{result.health.cleared_seconds:.1f} s")
    print(f"demo complete: {len(result.outcomes)} pods ran where the claim check predicted{health}; picture: "
          f"{result.svg}")
    return 0
