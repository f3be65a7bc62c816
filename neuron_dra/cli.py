"""`neuron-dra`: one command line for every part of the project.

Each subcommand lives in the module of the part it belongs to and is imported only when it runs,
so `neuron-dra slices` does not import Pulumi. A command module exposes `HELP`,
`configure(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol

# name -> module; the order is the order of `neuron-dra --help`.
COMMANDS: dict[str, str] = {
    "demo": "neuron_dra.localcluster.cli_demo",
    "slices": "neuron_dra.driver.cli.slices",
    "emulate": "neuron_dra.driver.cli.emulate",
    "emulate-fault": "neuron_dra.driver.cli.fault",
    "claims": "neuron_dra.claim_templates.cli",
    "plan": "neuron_dra.components.cli_plan",
    "cluster": "neuron_dra.localcluster.cli_cluster",
    "dashboard": "neuron_dra.driver.deploy.cli_dashboard",
}

SUMMARIES: dict[str, str] = {
    "demo": "run the local cluster with emulated Trainium nodes, the driver and example workloads",
    "slices": "print the ResourceSlices the driver publishes for an (emulated) host",
    "emulate": "write a fake Neuron host tree for an instance type",
    "emulate-fault": "inject or clear a hardware fault on one device of an emulated host tree",
    "claims": "render or check typed claim templates",
    "plan": "run the Pulumi stack offline under mocks and print resources or manifests",
    "cluster": "start or stop the local control plane with emulated nodes",
    "dashboard": "print the Grafana dashboard of the driver's metrics (JSON or its ConfigMap)",
}


class CommandModule(Protocol):
    HELP: str

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> CommandModule:
    module: CommandModule = importlib.import_module(COMMANDS[name])
    return module


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-dra", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if name == selected:
            module = _load(name)
            child = sub.add_parser(name, help=SUMMARIES[name], description=module.HELP)
            module.configure(child)
        else:
            sub.add_parser(name, help=SUMMARIES[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if not a.startswith("-")), None)
    if selected not in COMMANDS:
        selected = None
    parser = build_parser(selected)
    args = parser.parse_args(args_list)
    module = _load(args.command)
    try:
        return module.run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
