"""`neuron-dra emulate-fault`: inject or clear a hardware fault on one device of an emulated host tree.

Also the arguments and the action of `neuron-dra cluster fault` (the same, on a node of a running local cluster).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.driver.model.emulate import FaultError, clear_faults, inject_fault
from neuron_dra.driver.model.health_source import ERROR_COUNTERS, read_device_health

HELP = ("Add uncorrectable ECC events to one device of an emulated host tree (written by `neuron-dra emulate`), "
        "or clear them; a driver reading that tree reports the device Unhealthy, taints it, and recovers on --clear.")


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=int, required=True, metavar="N", help="Neuron device index (neuronN)")
    parser.add_argument("--clear", action="store_true", help="reset the device's error counters to 0")
    parser.add_argument("--counter", default="mem_ecc_uncorrected", choices=list(ERROR_COUNTERS),
                        help="which counter to raise (default mem_ecc_uncorrected: an HBM uncorrectable error)")
    parser.add_argument("--count", type=int, default=1, help="events to add (default 1)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", type=Path, help="the emulated host root")
    add_fault_arguments(parser)


def apply_fault(host_root: Path, args: argparse.Namespace, prog: str) -> int:
    try:
        if args.clear:
            clear_faults(host_root, args.device)
        else:
            inject_fault(host_root, args.device, args.counter, args.count)
    except FaultError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    health = read_device_health(host_root, args.device)
    print(f"neuron{args.device}: {health.health.value}" + (f" ({health.message})" if health.message else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    return apply_fault(args.dir, args, "neuron-dra emulate-fault")
