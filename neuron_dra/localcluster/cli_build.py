"""`neuron-dra cluster build`: build (or find cached) every binary the local cluster runs, and the Pulumi engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuron_dra.localcluster.build import (
    DEFAULT_MINOR,
    BuildError,
    Log,
    build_fakecri,
    cache_root,
    ensure_binaries,
    ensure_pulumi_binaries,
    supported_minors,
)

HELP = (
    "Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and the fake CRI runtime from "
    "the Go module proxy "
    "at the versions pinned in localcluster/go/*/go.mod, cached outside the work tree "
    "($NEURON_DRA_CACHE or ~/.cache/neuron-dra), and the Pulumi CLI and its Kubernetes provider (pulumi, "
    "pulumi-resource-kubernetes: the real-engine tests; --no-pulumi skips them). A no-op when cached; a cold "
    "build takes minutes."
)


def configure(parser: argparse.ArgumentParser) -> None:
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


def _minors(requested: list[str] | None) -> list[str]:
    """The minors to build, the primary one (plain names in --print-paths) first."""
    if not requested:
        return [DEFAULT_MINOR]
    if "all" in requested:
        return [DEFAULT_MINOR, *[m for m in supported_minors() if m != DEFAULT_MINOR]]
    return list(dict.fromkeys(requested))


def binary_paths(minors: list[str], *, cache: Path | None, log: Log) -> dict[str, Path]:
    """name -> path of every binary for `minors` (the first minor's under plain names)."""
    paths: dict[str, Path] = {}
    for index, minor in enumerate(minors):
        binaries = ensure_binaries(minor, cache=cache, log=log)
        suffix = "" if index == 0 else f"@{minor}"
        paths[f"kube-apiserver{suffix}"] = binaries.kube_apiserver
        paths[f"kube-controller-manager{suffix}"] = binaries.kube_controller_manager
        paths[f"kube-scheduler{suffix}"] = binaries.kube_scheduler
        paths[f"kubelet{suffix}"] = binaries.kubelet
        paths["etcd"] = binaries.etcd
    paths["fakecri"] = build_fakecri(cache=cache, log=log)  # the kubelets' container runtime (go/fakecri)
    return paths


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        if not (args.quiet or args.print_paths):
            print(f"neuron-dra cluster build: {message}", file=sys.stderr, flush=True)

    try:
        minors = _minors(args.kubernetes_version)
        paths = binary_paths(minors, cache=args.cache, log=log)
        if not args.no_pulumi:
            paths.update(ensure_pulumi_binaries(cache=args.cache, log=log).as_dict())
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
