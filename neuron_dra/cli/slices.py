"""`neuron-dra slices`: print the ResourceSlices the driver publishes for an (emulated) host, as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, UnknownInstanceTypeError
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog
from neuron_dra.driver.model.config import LNC_VALUES
from neuron_dra.driver.model.discovery import DiscoveryError
from neuron_dra.driver.model.hosts import load_host
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.driver.model.partitions import CoreLayout, PartitionError, read_node_lnc
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool, resource_slices

HELP = "Print the JSON array of ResourceSlices the driver publishes for an emulated host or a host tree."


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--instance-type", metavar="T", help=f"emulate this type ({', '.join(CATALOG)})")
    src.add_argument("--host-root", metavar="DIR", help="read a host tree on disk (e.g. / or an emulated tree)")
    parser.add_argument("--node-name", required=True, metavar="N", help="node (and pool) name")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, metavar="D",
                        help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    parser.add_argument("--cores", action="store_true",
                        help="as on Kubernetes 1.36+: NeuronCores and counter sets beside whole devices "
                             "(docs/neuron-cores.md)")
    parser.add_argument("--lnc", type=int, choices=LNC_VALUES, help="the node's LNC with --cores (default: the host's "
                        "/opt/aws/neuron/logical_nc_config, else the family's default)")
    parser.add_argument("--catalog", metavar="FILE", help="catalog file with more instance types "
                        "(docs/catalog-file.md)")


def run(args: argparse.Namespace) -> int:
    try:
        catalog = load_catalog(args.catalog) if args.catalog else BUILTIN
        host = load_host(args.host_root, args.instance_type, catalog)
    except (DiscoveryError, UnknownInstanceTypeError, CatalogFileError) as e:
        print(f"neuron-dra slices: {e}", file=sys.stderr)
        return 2
    cores = None
    if args.cores:
        try:
            root = Path(args.host_root) if args.host_root else None
            cores = CoreLayout.for_spec(host.spec, read_node_lnc(root, host.spec, args.lnc))
        except PartitionError as e:
            print(f"neuron-dra slices: {e}", file=sys.stderr)
            return 2
    pool = build_pool(host, NodeFacts(args.node_name), PublishOptions(driver_name=args.driver_name, cores=cores))
    json.dump(resource_slices(pool), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
