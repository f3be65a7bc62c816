"""`neuron-dra emulate-utilisation`: set or clear what the neuron-monitor stand-in of an emulated node reports.

The local cluster runs a stand-in for neuron-monitor's exporter per node (localcluster/nodes/
neuron_monitor_emulator.py, docs/utilisation.md); this writes its state, as `emulate-fault` writes the hardware
counters: one emulated Neuron runtime (its `runtime_tag`) using some NeuronCores at a utilisation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.localcluster.nodes.neuron_monitor_emulator import (
    Runtime,
    StateError,
    check_core,
    clear_runtimes,
    read_runtimes,
    set_runtime,
)
from neuron_dra.localcluster.nodes.topology import NodePaths

HELP = ("Make the neuron-monitor stand-in of an emulated host (or, with --node, of a local cluster's node) report "
        "a Neuron runtime using NeuronCores at a utilisation, or clear it; the dashboard's utilisation panels "
        "join it with the driver's attribution.")
MAX_CORES = 256


def parse_cores(text: str) -> tuple[int, ...]:
    """`0-3,8` -> (0, 1, 2, 3, 8): NEURON_RT_VISIBLE_CORES' notation."""
    cores: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo, hi = check_core(first), check_core(last if dash else first)
        except StateError as e:
            raise StateError(f"--cores {text!r}: {e}; e.g. 0-3,8") from e
        if hi < lo or len(cores) + hi - lo + 1 > MAX_CORES:
            raise StateError(f"--cores {text!r}: not allowed; ascending ranges of at most {MAX_CORES} cores, e.g. "
                             "0-3,8")
        cores.extend(range(lo, hi + 1))
    return tuple(dict.fromkeys(cores))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", type=Path,
                        help="the emulated host root, or with --node the local cluster's directory")
    parser.add_argument("--node", default=None, help="a node of the local cluster in DIR")
    parser.add_argument("--runtime-tag", default="1", help="the emulated runtime (neuron-monitor's runtime_tag)")
    parser.add_argument("--cores", default=None, help="NeuronCore ids the runtime uses, e.g. 0-3,8")
    parser.add_argument("--ratio", type=float, default=0.5, help="their utilisation, 0 to 1 (default 0.5)")
    parser.add_argument("--device-memory", type=int, default=0, metavar="BYTES",
                        help="Neuron device memory the runtime holds, spread over its cores")
    parser.add_argument("--host-memory", type=int, default=0, metavar="BYTES")
    parser.add_argument("--latency", type=float, default=0.0, metavar="SECONDS", help="median execution latency")
    parser.add_argument("--clear", action="store_true", help="remove the runtime (with --all: every runtime)")
    parser.add_argument("--all", action="store_true", help="with --clear: every runtime of the node")


def host_root_of(args: argparse.Namespace) -> Path:
    return NodePaths.of(args.dir, args.node).host_root if args.node else Path(args.dir)


def run(args: argparse.Namespace) -> int:
    prog = "neuron-dra emulate-utilisation"
    root = host_root_of(args)
    if not root.is_dir():
        print(f"{prog}: {root}: no such emulated host root", file=sys.stderr)
        return 2
    try:
        if args.clear:
            clear_runtimes(root, None if args.all else args.runtime_tag)
        else:
            if args.cores is None:
                print(f"{prog}: --cores is required unless --clear", file=sys.stderr)
                return 2
            cores = parse_cores(args.cores)
            set_runtime(root, Runtime(args.runtime_tag, dict.fromkeys(cores, args.ratio), args.device_memory,
                                      args.host_memory, args.latency))
            read_runtimes(root)  # what the stand-in will read: refused here, not at its next scrape
    except StateError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    for r in read_runtimes(root):
        print(f"runtime {r.tag}: {len(r.cores)} cores, utilisation {max(r.cores.values(), default=0):g}")
    return 0
