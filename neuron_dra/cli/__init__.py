"""`neuron-dra`: one command line for every part of the project.

Each public module of this package is one command, named after its file (`emulate_fault.py`: `emulate-fault`):
the first line of its docstring is "`neuron-dra NAME`: SUMMARY." and it defines `HELP`, `configure(parser)` and
`run(args) -> int`. Only the module of the command that runs is imported, so `neuron-dra slices` does not import
Pulumi; `neuron-dra --help` imports none of them (it reads the summaries from their sources).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Protocol, cast

from neuron_dra.driver.errortext import did_you_mean, shown

# A third-party module a command may need -> the extra of pyproject.toml that installs it.
EXTRAS = {"celpy": "claims", "kubernetes": "local", "cryptography": "local", "tomli_w": "local",
          **dict.fromkeys(("pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes", "pulumi_awsx",
                           "pulumi_docker_build"), "pulumi"),
          "grafana_foundation_sdk": "dashboard"}


class CommandModule(Protocol):
    HELP: str

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def commands() -> dict[str, Path]:
    """Command name -> its module's source file, in name order (the order of `neuron-dra --help`)."""
    sources = sorted(p for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_"))
    return {p.stem.replace("_", "-"): p for p in sources}


def summary(source: Path) -> str:
    """The summary in a command module's docstring, read without importing the module."""
    doc = ast.get_docstring(ast.parse(source.read_text()))
    return doc.splitlines()[0].split("`: ", 1)[-1].rstrip(".") if doc else ""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    names = commands()
    selected = next((a for a in args_list if not a.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="neuron-dra", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"neuron-dra {metadata.version('neuron-dra')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if selected is not None and selected not in names:
        parser.error(f"unknown command {shown(selected)}{did_you_mean(selected, names)} (commands: "
                     f"{', '.join(names)})")
    module: CommandModule | None = None
    for name, source in names.items():
        if name == selected:
            try:
                module = cast(CommandModule, importlib.import_module(f"{__name__}.{source.stem}"))
            except ModuleNotFoundError as e:
                extra = EXTRAS.get((e.name or "").partition(".")[0])
                if extra is None:
                    raise
                print(f"neuron-dra {name}: needs the '{extra}' extra ({e.name} is not installed): pip install "
                      f"'neuron-dra[{extra}]'", file=sys.stderr)
                return 2
            module.configure(sub.add_parser(name, help=summary(source), description=module.HELP))
        else:  # the summaries show only in the top-level help
            sub.add_parser(name, help=None if selected in names else summary(source))
    args = parser.parse_args(args_list)
    if module is None:  # (argparse has exited on anything but a command)
        parser.error(f"no command given; one of {', '.join(names)}")
    try:
        return module.run(args)
    except KeyboardInterrupt:
        return 130
