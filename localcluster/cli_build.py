"""`neuron-dra cluster build`: build (or find cached) etcd, the Kubernetes binaries and the Pulumi engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuron_dra.localcluster.build import BuildError, cache_root, ensure_binaries, ensure_pulumi_binaries

HELP = (
    "Build etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and the Pulumi CLI and its Kubernetes "
    "provider (for the real-engine tests), from the Go module proxy at the versions pinned in "
    "localcluster/go/*/go.mod, cached outside the work tree ($NEURON_DRA_CACHE or ~/.cache/neuron-dra). "
    "A no-op when cached; a cold build takes minutes."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {cache_root()})")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the binary paths")
    parser.add_argument("--print-paths", action="store_true",
                        help="print one JSON object mapping each binary's name to its path (and nothing else on "
                             "stdout)")
    parser.add_argument("--no-pulumi", action="store_true",
                        help="skip the Pulumi CLI and provider (about 11 minutes of a cold build)")


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        if not args.quiet:
            print(f"neuron-dra cluster build: {message}", file=sys.stderr, flush=True)

    paths: dict[str, Path] = {}
    try:
        binaries = ensure_binaries(cache=args.cache, log=log)
        log(f"Kubernetes {binaries.kube_version}, etcd {binaries.etcd_version}")
        paths.update({
            "etcd": binaries.etcd,
            "kube-apiserver": binaries.kube_apiserver,
            "kube-controller-manager": binaries.kube_controller_manager,
            "kube-scheduler": binaries.kube_scheduler,
        })
        kubelet = getattr(binaries, "kubelet", None)  # per-minor builds add the kubelet
        if kubelet is not None:
            paths["kubelet"] = kubelet
        if not args.no_pulumi:
            engine = ensure_pulumi_binaries(cache=args.cache, log=log)
            log(f"Pulumi {engine.pulumi_version}, Kubernetes provider {engine.kubernetes_provider_version}")
            paths.update(engine.as_dict())
    except BuildError as e:
        print(f"neuron-dra cluster build: {e}", file=sys.stderr)
        return 1
    if args.print_paths:
        print(json.dumps({name: str(path) for name, path in paths.items()}, indent=2))
    else:
        for path in paths.values():
            print(path)
    return 0
