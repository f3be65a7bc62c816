"""`neuron-dra emulate`: write a fake Neuron host tree for an instance type."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, UnknownInstanceTypeError
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog
from neuron_dra.driver.model.emulate import DEFAULT_KERNEL_DRIVER_VERSION, EmulationOptions, emulate

HELP = "Write a fake host tree (sysfs, /dev, neuron-ls, EFA, UltraServer files) that discovery reads as a real host."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance_type", metavar="INSTANCE_TYPE", help=", ".join(CATALOG))
    parser.add_argument("dir", metavar="DIR", type=Path, help="target directory (absent or empty)")
    parser.add_argument("--kernel-driver-version", default=DEFAULT_KERNEL_DRIVER_VERSION)
    parser.add_argument("--host-id", default="emulated", help="seeds serial numbers and UltraServer ids")
    parser.add_argument("--ultraserver-node", type=int, default=0, choices=range(4),
                        help="position of this host in its UltraServer (UltraServer types only)")
    parser.add_argument("--no-neuron-ls", action="store_true", help="do not install a neuron-ls")
    parser.add_argument("--catalog", metavar="FILE", help="catalog file with more instance types "
                        "(docs/catalog-file.md)")


def run(args: argparse.Namespace) -> int:
    opts = EmulationOptions(kernel_driver_version=args.kernel_driver_version, neuron_ls=not args.no_neuron_ls,
                            host_id=args.host_id, ultraserver_node=args.ultraserver_node)
    try:
        catalog = load_catalog(args.catalog) if args.catalog else BUILTIN
        root = emulate(args.instance_type, args.dir, opts, catalog)
    except (UnknownInstanceTypeError, FileExistsError, CatalogFileError) as e:
        print(f"neuron-dra emulate: {e}", file=sys.stderr)
        return 2
    print(root)
    return 0
