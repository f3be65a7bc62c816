"""`neuron-dra claims`: render or check the claim templates a Python file defines.

  neuron-dra claims render FILE.py            every module-level template as multi-document YAML (after checks)
  neuron-dra claims check FILE.py [--instance-type T[:lnc=N] ...] [--json] [--verbose]
                                              template x instance type -> claims per node, or why not
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from neuron_dra.claim_templates.checks import Checker, CheckReport, default_checker
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.loader import LoadError, load_templates
from neuron_dra.claim_templates.node_types import NodeType
from neuron_dra.claim_templates.template import ClaimTemplate, to_yaml_documents
from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, Catalog
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog

CATALOG_HELP = ("catalog file with more instance types (docs/catalog-file.md); the templates file sees it as the "
                "global `catalog`")
HELP = ("Render typed claim templates from a Python file as ResourceClaimTemplate YAML, or check them against "
        "the devices the driver publishes on each instance type (the file is executed).")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="claims_command", metavar="SUBCOMMAND", required=True)
    render = sub.add_parser("render", help="print every module-level template as multi-document YAML")
    render.add_argument("file", metavar="FILE.py")
    render.add_argument("--instance-type", action="append", metavar="T", dest="instance_types",
                        help="check against these instance types first (default: every catalog type)")
    render.add_argument("--no-check", action="store_true", help="render without running the checks")
    render.add_argument("--catalog", metavar="FILE", help=CATALOG_HELP)
    check = sub.add_parser("check", help="print template x instance type -> claims per node, or the reason")
    check.add_argument("file", metavar="FILE.py")
    check.add_argument("--instance-type", action="append", metavar="T[:lnc=N]", dest="instance_types",
                       help="instance types to check, each optionally at a node LNC (`trn2.48xlarge:lnc=1`: the "
                            "NeuronCores the driver publishes at LNC=1; Trainium2 and later) (repeatable; default: "
                            f"all of {', '.join(CATALOG)} at their default LNC)")
    check.add_argument("--json", action="store_true", help="print the reports as JSON")
    check.add_argument("--unhealthy-device", action="store_true",
                       help="also count claims per node when a device the first claim uses is tainted unhealthy")
    check.add_argument("--catalog", metavar="FILE", help=CATALOG_HELP)


def run(args: argparse.Namespace) -> int:
    try:
        hardware = load_catalog(args.catalog) if args.catalog else BUILTIN
        # The file sees the catalog as the global `catalog`, for Neuron(..., catalog=catalog) on its own types.
        templates = load_templates(args.file, hardware)
    except (LoadError, CatalogFileError) as e:
        print(f"neuron-dra claims: {e}", file=sys.stderr)
        return 2
    types = list(args.instance_types or hardware.names)
    try:
        for t in types:
            NodeType.parse(t).spec(hardware)
    except TemplateError as e:
        print(f"neuron-dra claims: --instance-type: {e}", file=sys.stderr)
        return 2
    if args.claims_command == "render":
        return _render(templates, types, not args.no_check, hardware)
    return _check(templates, types, args.json, hardware, args.unhealthy_device)


def _reports(templates: Sequence[ClaimTemplate], types: Sequence[str], hardware: Catalog,
             unhealthy_device: bool = False) -> list[CheckReport]:
    checker = Checker(hardware=hardware, unhealthy_device=True) if unhealthy_device else default_checker(hardware)
    return [checker.check(t, types) for t in templates]


def _render(templates: Sequence[ClaimTemplate], types: Sequence[str], run_checks: bool, hardware: Catalog) -> int:
    if run_checks:
        failed = [r for r in _reports(templates, types, hardware) if not r.ok]
        for r in failed:
            print(f"neuron-dra claims: {r.template}: {r.summary()}", file=sys.stderr)
        if failed:
            return 1
    sys.stdout.write(to_yaml_documents(templates))
    return 0


def _check(templates: Sequence[ClaimTemplate], types: Sequence[str], as_json: bool, hardware: Catalog,
           unhealthy_device: bool = False) -> int:
    reports = _reports(templates, types, hardware, unhealthy_device)
    if as_json:
        json.dump([_report_json(r) for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(reports, types))
    return 0 if all(r.ok for r in reports) else 1


def _report_json(r: CheckReport) -> dict[str, object]:
    return {"template": r.template, "ok": r.ok,
            "issues": [{"severity": i.severity, "message": i.message} for i in r.issues],
            "fits": [{"instanceType": f.instance_type, "nodeType": f.label, "lnc": f.lnc,
                      "claimsPerNode": f.claims_per_node, "reason": f.reason,
                      "devices": [d.to_api() for d in f.devices],
                      **({} if f.with_unhealthy_device is None
                         else {"claimsPerNodeWithUnhealthyDevice": f.with_unhealthy_device})} for f in r.fits]}


def format_table(reports: Sequence[CheckReport], types: Sequence[str]) -> str:
    """Claims per node for each template and instance type; '-' with the reasons listed below."""
    names = [r.template for r in reports]
    first = max([len("template"), *map(len, names)])
    widths = [max(len(t), 3) for t in types]
    lines = ["  ".join(["template".ljust(first), *(t.rjust(w) for t, w in zip(types, widths, strict=True))])]
    notes = []
    for r in reports:
        cells = []
        for t, w in zip(types, widths, strict=True):
            f = r.fit(t)
            cell = str(f.claims_per_node) if f.claims_per_node else "-"
            if f.claims_per_node and f.with_unhealthy_device is not None:
                cell += f"/{f.with_unhealthy_device}"  # claims per node / with one device in use unhealthy
            cells.append(cell.rjust(w))
        status = "" if r.ok else "  FAILS"
        lines.append("  ".join([r.template.ljust(first), *cells]) + status)
        for issue in r.issues:
            notes.append(f"{r.template}: {issue}")
        notes += [f"{r.template} on {f.label}: {f.reason}" for f in r.fits if f.reason]
    out = "\n".join(lines) + "\n"
    if any(f.with_unhealthy_device is not None for r in reports for f in r.fits):
        out += "(N/M: N claims per node; M when one device the first claim uses is tainted unhealthy)\n"
    if notes:
        out += "\n" + "\n".join(notes) + "\n"
    return out
