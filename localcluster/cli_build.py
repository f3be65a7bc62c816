"""`neuron-dra cluster build`: build (or find cached) etcd and the Kubernetes control plane binaries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.localcluster.build import BuildError, cache_root, ensure_binaries

HELP = (
    "Build etcd, kube-apiserver, kube-controller-manager and kube-scheduler from the Go module proxy "
    "at the versions pinned in localcluster/go/*/go.mod, cached outside the work tree "
    "($NEURON_DRA_CACHE or ~/.cache/neuron-dra). A no-op when cached; a cold build takes minutes."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {cache_root()})")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the binary paths")


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        if not args.quiet:
            print(f"neuron-dra cluster build: {message}", file=sys.stderr, flush=True)

    try:
        binaries = ensure_binaries(cache=args.cache, log=log)
    except BuildError as e:
        print(f"neuron-dra cluster build: {e}", file=sys.stderr)
        return 1
    log(f"Kubernetes {binaries.kube_version}, etcd {binaries.etcd_version}")
    for path in (binaries.etcd, binaries.kube_apiserver, binaries.kube_controller_manager, binaries.kube_scheduler):
        print(path)
    return 0
