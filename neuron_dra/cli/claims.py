"""`neuron-dra claims`: render or check the claim templates (and UltraServer jobs) a Python file defines.

  neuron-dra claims render FILE.py            every module-level template as multi-document YAML (after checks),
                                              then each UltraServerJob's shared claim and per-pod template
  neuron-dra claims check FILE.py [--instance-type T[:lnc=N] ...] [--json] [--verbose] [--nodes N]
                                  [--ultraservers T:N[xK],...]
                                              template x instance type -> claims per node, or why not;
                                              with --nodes, the scheduler's filter work at N nodes; each
                                              UltraServerJob: which UltraServer sizes fit, or (--ultraservers)
                                              how many such jobs those UltraServers hold at once
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence

import yaml

from neuron_dra.claim_templates.checks import Checker, CheckReport, JobReport, check_job, default_checker
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.loader import LoadError, load_definitions
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.node_types import NodeType
from neuron_dra.claim_templates.scale import CALIBRATION, ScaleEstimate, check_nodes, estimate
from neuron_dra.claim_templates.template import ClaimTemplate, to_yaml_documents
from neuron_dra.claim_templates.ultraserver import UltraServerJob, UltraServerSet, parse_ultraservers
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
    check.add_argument("--verbose", action="store_true",
                       help="also explain why a template does not fit instance types its selectors exclude")
    check.add_argument("--unhealthy-device", action="store_true",
                       help="also count claims per node when a device the first claim uses is tainted unhealthy")
    check.add_argument("--catalog", metavar="FILE", help=CATALOG_HELP)
    check.add_argument("--nodes", type=int, default=None, metavar="N",
                       help="also estimate the kube-scheduler filter work per pod at a cluster of N nodes of each "
                            "type the template fits, warning near the DRA filter's 10 s limit per node "
                            "(calibrated with bench/bench_scale.py; docs/scale.md §4)")
    check.add_argument("--core-partitions", choices=("on", "off"), default="on",
                       help="with --nodes: whether the nodes publish NeuronCores and counters (on: the driver's "
                            "default on Kubernetes 1.36, whose scheduler reads every node's counters on each node; "
                            "off: --core-partitions off on the driver)")
    check.add_argument("--ultraservers", action="append", metavar="T:N[xK],...", default=None,
                       help="the cluster's UltraServers for the file's UltraServerJobs: `trn2u.48xlarge:4,"
                            "trn2u.48xlarge:2x3` is one 4-node set and three 2-node sets (nodes in mode N, as "
                            "`cluster up --node T:N` makes them); says how many such jobs run at once, and fails a "
                            "job that fits none (default: each set size of each target type: which sizes fit)")


def run(args: argparse.Namespace) -> int:
    try:
        hardware = load_catalog(args.catalog) if args.catalog else BUILTIN
        # The file sees the catalog as the global `catalog`, for Neuron(..., catalog=catalog) on its own types.
        templates, jobs = load_definitions(args.file, hardware)
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
        return _render(templates, types, not args.no_check, hardware, jobs)
    ultraservers: tuple[UltraServerSet, ...] | None = None
    try:
        if args.ultraservers:
            ultraservers = tuple(s for text in args.ultraservers for s in parse_ultraservers(text, hardware))
    except TemplateError as e:
        print(f"neuron-dra claims: {e}", file=sys.stderr)
        return 2
    if args.nodes is not None:
        try:
            check_nodes(args.nodes)
        except ValueError as e:
            print(f"neuron-dra claims: {e}", file=sys.stderr)
            return 2
    return _check(templates, types, args.json, hardware, args.unhealthy_device, args.verbose, args.nodes,
                  args.core_partitions == "on", jobs, ultraservers)


def _reports(templates: Sequence[ClaimTemplate], types: Sequence[str], hardware: Catalog,
             unhealthy_device: bool = False) -> list[CheckReport]:
    checker = Checker(hardware=hardware, unhealthy_device=True) if unhealthy_device else default_checker(hardware)
    return [checker.check(t, types) for t in templates]


def _render(templates: Sequence[ClaimTemplate], types: Sequence[str], run_checks: bool, hardware: Catalog,
            jobs: Sequence[UltraServerJob] = ()) -> int:
    """Every template that passes its checks, as YAML, then each UltraServerJob's shared claim and per-pod
    template; each one that fails is named on stderr (exit 1), so one bad template costs only itself."""
    passed = list(templates)
    passed_jobs = list(jobs)
    if run_checks:
        reports = _reports(templates, types, hardware)
        passed = [t for t, r in zip(templates, reports, strict=True) if r.ok]
        for r in reports:
            if not r.ok:
                print(f"neuron-dra claims: {r.template}: {r.summary()} (not rendered)", file=sys.stderr)
        job_reports = [check_job(j, checker=default_checker(hardware)) for j in jobs]
        passed_jobs = [j for j, r in zip(jobs, job_reports, strict=True) if r.ok]
        for jr in job_reports:
            if not jr.ok:
                print(f"neuron-dra claims: {jr.job}: {'; '.join(map(str, jr.errors))} (not rendered)",
                      file=sys.stderr)
    out = to_yaml_documents(passed) if passed else ""
    if passed_jobs:
        documents = [m for j in passed_jobs for m in j.manifests()]
        out += ("---\n" if out else "") + yaml.safe_dump_all(documents, sort_keys=False)
    sys.stdout.write(out)
    return 0 if len(passed) == len(templates) and len(passed_jobs) == len(jobs) else 1


def _check(templates: Sequence[ClaimTemplate], types: Sequence[str], as_json: bool, hardware: Catalog,
           unhealthy_device: bool = False, verbose: bool = False, nodes: int | None = None,
           core_partitions: bool = True, jobs: Sequence[UltraServerJob] = (),
           ultraservers: Sequence[UltraServerSet] | None = None) -> int:
    reports = _reports(templates, types, hardware, unhealthy_device)
    scale = _estimates(templates, reports, nodes, hardware, core_partitions) if nodes is not None else {}
    job_reports = [check_job(j, ultraservers, default_checker(hardware)) for j in jobs]
    if as_json:
        out = [_report_json(r) for r in reports]
        for entry in out:
            if nodes is not None:
                entry["scale"] = [e.to_json() for e in scale.get(str(entry["template"]), ())]
        out += [_job_json(r) for r in job_reports]
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if reports:
            sys.stdout.write(format_table(reports, types, verbose))
        if nodes is not None:
            sys.stdout.write(format_estimates(scale, nodes))
        if job_reports:
            sys.stdout.write(("\n" if reports else "") + format_jobs(job_reports))
    return 0 if all(r.ok for r in reports) and all(r.ok for r in job_reports) else 1


def format_jobs(reports: Sequence[JobReport]) -> str:
    """Per UltraServerJob: its per-pod template, each UltraServer set (how many such jobs it holds at once, or
    why none) and the total."""
    lines = []
    for r in reports:
        lines.append(f"ultraserver job {r.job}: {r.nodes} pods, one per node of one {r.nodes}-node UltraServer group"
                     + ("" if r.ok else "  FAILS"))
        per_node = ", ".join(f"{f.label} {f.claims_per_node}" for f in r.node_template.fits)
        lines.append(f"  per-pod template claims per node: {per_node}")
        for f in r.fits:
            what = (f"{f.jobs_each} job{'s' if f.jobs_each != 1 else ''} at once "
                    f"({', '.join(f.groups)})" if f.groups else f"none: {f.reason}")
            count = f" x{f.ultraserver.count} = {f.jobs}" if f.ultraserver.count != 1 and f.groups else ""
            lines.append(f"  {f.ultraserver.instance_type} {f.ultraserver.nodes}-node set: {what}{count}")
        if r.cluster:
            sets = sum(f.ultraserver.count for f in r.fits)
            lines.append(f"  the {sets} UltraServer set{'s' if sets != 1 else ''} hold {r.jobs} such "
                         f"job{'s' if r.jobs != 1 else ''} at once")
        lines += [f"  {i}" for i in r.issues]
    return "\n".join(lines) + "\n"


def _job_json(r: JobReport) -> dict[str, object]:
    return {"job": r.job, "ok": r.ok, "nodes": r.nodes, "jobsAtOnce": r.jobs if r.cluster else None,
            "issues": [{"severity": i.severity, "message": i.message} for i in r.issues],
            "nodeTemplate": _report_json(r.node_template),
            "ultraservers": [{"instanceType": f.ultraserver.instance_type, "nodes": f.ultraserver.nodes,
                              "count": f.ultraserver.count, "groups": list(f.groups), "jobsEach": f.jobs_each,
                              "reason": f.reason} for f in r.fits]}


def _estimates(templates: Sequence[ClaimTemplate], reports: Sequence[CheckReport], nodes: int, hardware: Catalog,
               core_partitions: bool) -> dict[str, list[ScaleEstimate]]:
    """Per template, the estimate on each instance type it fits (at the type's default LNC)."""
    catalog = NodeCatalog(hardware=hardware, partitionable=core_partitions)
    out: dict[str, list[ScaleEstimate]] = {}
    for template, report in zip(templates, reports, strict=True):
        fitting = dict.fromkeys(f.instance_type for f in report.fits if f.claims_per_node)
        out[report.template] = [estimate(template, nodes, t, catalog, shared_counters=core_partitions)
                                for t in fitting]
    return out


SIZING_RATE = 10  # claim pods/s to size the control plane's cores for
SIZING_CORES = 16  # control-plane cores to derive sustained claim pods/s for


def format_estimates(scale: Mapping[str, Sequence[ScaleEstimate]], nodes: int) -> str:
    lines = ["", f"control-plane CPU per claim pod at {nodes} nodes (empty nodes, Kubernetes 1.36, adaptive "
                 "percentageOfNodesToScore; estimate, kube-scheduler's filter work first):"]
    warnings = []
    for name, estimates in scale.items():
        for e in estimates:
            others = ", ".join(f"{k} {v:.0f}" for k, v in e.others_ms_per_pod.items())
            lines.append(f"  {name} on {e.instance_type}: {e.selector_evaluations} selector evaluations, "
                         f"{e.per_node_ms:.2f} ms per node x {e.filtered_nodes} nodes filtered = "
                         f"{e.cpu_ms_per_pod:.0f} ms scheduler CPU per pod; with {others} ms: "
                         f"{e.control_plane_s_per_pod:.3f} CPU s per claim pod, {e.cores_for(SIZING_RATE):.1f} cores "
                         f"for {SIZING_RATE} pods/s, {SIZING_CORES / e.control_plane_s_per_pod:.0f} pods/s on "
                         f"{SIZING_CORES} cores")
            if e.warning:
                warnings.append(f"WARNING: {e.warning}")
        if not estimates:
            lines.append(f"  {name}: fits no instance type checked")
    return "\n".join([*lines, f"  ({CALIBRATION})", *warnings]) + "\n"


def _report_json(r: CheckReport) -> dict[str, object]:
    return {"template": r.template, "ok": r.ok,
            "issues": [{"severity": i.severity, "message": i.message} for i in r.issues],
            "fits": [{"instanceType": f.instance_type, "nodeType": f.label, "lnc": f.lnc,
                      "claimsPerNode": f.claims_per_node, "reason": f.reason, "targeted": f.targeted,
                      "devices": [d.to_api() for d in f.devices],
                      **({} if f.with_unhealthy_device is None
                         else {"claimsPerNodeWithUnhealthyDevice": f.with_unhealthy_device})} for f in r.fits]}


def format_table(reports: Sequence[CheckReport], types: Sequence[str], verbose: bool = False) -> str:
    """Claims per node for each template and instance type; '-' with the reasons listed below: for the types a
    template is meant for, and the others in one line (each explained with `verbose`)."""
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
        notes += [f"{r.template} on {f.label}: {f.reason}" for f in r.fits if f.reason and (verbose or f.targeted)]
        elsewhere = [f.label for f in r.fits if not f.targeted]
        if elsewhere and not verbose:
            notes.append(f"{r.template}: not for {', '.join(elsewhere)} (its selectors pick other instance types; "
                         "--verbose explains each)")
    out = "\n".join(lines) + "\n"
    if any(f.with_unhealthy_device is not None for r in reports for f in r.fits):
        out += "(N/M: N claims per node; M when one device the first claim uses is tainted unhealthy)\n"
    if notes:
        out += "\n" + "\n".join(notes) + "\n"
    return out
