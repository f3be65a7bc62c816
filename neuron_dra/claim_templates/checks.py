"""Checks before deploy: a template's manifest against what the driver publishes on each instance type.

Every selector compiled with the real CEL environment (unpublished attributes, capacities and matchAttribute
names are errors naming the closest published name) and evaluated on every device of each node (a runtime error
is an error: Kubernetes aborts allocation there); Neuron opaque configs decoded by the driver's own code; a
request no device matches is an error; the allocator simulation says how many claims one empty node holds, and
why none when none.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from neuron_dra.claim_templates.allocator import DeviceResult, Simulator, simulate
from neuron_dra.claim_templates.cel_analysis import DeviceRef, RefKind
from neuron_dra.claim_templates.cel_env import (
    CelCompileError,
    CelDevice,
    CelEnvironment,
    CelEvaluationError,
    CompiledSelector,
)
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from neuron_dra.claim_templates.node_types import NodeType, NodeTypeInput
from neuron_dra.claim_templates.template import ClaimTemplate
from neuron_dra.claim_templates.ultraserver import UltraServerJob, UltraServerSet, group_devices
from neuron_dra.driver.errortext import did_you_mean
from neuron_dra.driver.model import config as driver_config
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.k8s_names import NEURON_CORE, ultraserver_class_selector
from neuron_dra.driver.model.partitions import parse_core_device
from neuron_dra.driver.model.slices import NEURON_DEVICE, NEURON_NODE, device_name
from neuron_dra.driver.model.taints import unhealthy_taint_key

INSTANCE_TYPE = "instanceType"  # the attribute that keeps a request to instance types

Severity = Literal["error", "warning"]


@runtime_checkable
class ManifestSource(Protocol):
    """Anything that renders a ResourceClaimTemplate manifest (ClaimTemplate, or another class)."""

    def to_manifest(self) -> Mapping[str, Any]: ...


TemplateInput = ManifestSource | Mapping[str, Any]


@dataclass(frozen=True)
class Issue:
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


@dataclass(frozen=True)
class Fit:
    """How a template does on one empty node of an instance type (at the node's LNC, `node.lnc`)."""

    node: NodeType
    claims_per_node: int
    reason: str | None = None  # why no claim fits
    devices: tuple[DeviceResult, ...] = ()  # what the first claim gets
    # Checker(unhealthy_device=True): claims per node when the first Neuron device of the first claim is tainted
    # unhealthy (the driver's NoSchedule taint), i.e. how the template degrades when a device in use fails.
    with_unhealthy_device: int | None = None
    lnc: int | None = None  # the LNC the node was modelled at (the family's default unless node.lnc)
    # False when a request's selectors keep it to other instance types (its instanceType selector rejects
    # the node's devices): the template is not meant for this type, and `claims check` says so in one line.
    targeted: bool = True

    @property
    def instance_type(self) -> str:
        return self.node.instance_type

    @property
    def label(self) -> str:
        """`trn2.48xlarge`, or `trn2.48xlarge:lnc=1` for a node checked at a given LNC."""
        return self.node.label


@dataclass(frozen=True)
class CheckReport:
    template: str  # namespace/name
    fits: tuple[Fit, ...]
    issues: tuple[Issue, ...]

    @property
    def errors(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def fitting(self) -> tuple[Fit, ...]:
        return tuple(f for f in self.fits if f.claims_per_node > 0)

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.fitting)

    def fit(self, node: NodeTypeInput) -> Fit:
        """The fit on a node type: `trn2.48xlarge:lnc=1` / NodeType(...) exactly, or a bare instance type (the
        first fit of that type)."""
        label = node.label if isinstance(node, NodeType) else node
        found = next((f for f in self.fits if f.label == label), None) or \
            next((f for f in self.fits if f.instance_type == label), None)
        if found is None:
            raise KeyError(f"{label} was not checked for {self.template}")
        return found

    def summary(self) -> str:
        lines = [str(i) for i in self.issues]
        for f in self.fits:
            degraded = "" if f.with_unhealthy_device is None else \
                f" ({f.with_unhealthy_device} with one unhealthy device)"
            lines.append(f"{f.label}: {f.claims_per_node} per node{degraded}" if f.claims_per_node
                         else f"{f.label}: does not fit: {f.reason}")
        return "; ".join(lines)


class TemplateCheckError(ValueError):
    """A template with check errors, or that fits none of the instance types."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        problems = [i.message for i in report.errors] or ["fits none of the instance types"]
        reasons = [f"{f.label}: {f.reason}" for f in report.fits if f.claims_per_node == 0 and f.reason
                   and f.targeted]
        elsewhere = [f.label for f in report.fits if not f.targeted]
        if elsewhere:
            reasons.append(f"not for {', '.join(elsewhere)} (its selectors pick other instance types)")
        detail = "; ".join(problems + reasons)
        super().__init__(f"claim template {report.template}: {detail}")


# --- the claim spec, flattened into requests and subrequests -----------------------------------------------

@dataclass
class _Unit:
    """One request without subrequests, or one subrequest."""

    ref: str  # "req" or "req/sub"
    base: str
    body: Mapping[str, Any]
    selectors: list[CompiledSelector] = field(default_factory=list)
    broken: bool = False  # a selector did not compile

    @property
    def label(self) -> str:
        return f"request {self.ref!r}"

    @property
    def all_mode(self) -> bool:
        return self.body.get("allocationMode") == "All"

    @property
    def count(self) -> int:
        return int(self.body.get("count", 1))

    @property
    def needs(self) -> int:
        """Devices it needs at least: its count, or one for `All`."""
        return 1 if self.all_mode else self.count


def _units(spec: Mapping[str, Any]) -> list[list[_Unit]]:
    """Per request, its unit(s): one, or one per firstAvailable alternative."""
    out = []
    for r in (spec.get("devices") or {}).get("requests") or []:
        if r.get("firstAvailable"):
            out.append([_Unit(f"{r['name']}/{s['name']}", r["name"], s) for s in r["firstAvailable"]])
        else:
            out.append([_Unit(r["name"], r["name"], r.get("exactly") or {})])
    return out


def _short(expression: str, limit: int = 90) -> str:
    return expression if len(expression) <= limit else expression[:limit - 3] + "..."


def _ref_hint(ref: DeviceRef, published: Mapping[tuple[RefKind, str], frozenset[str]]) -> str:
    """The did-you-mean for an unpublished name: the same name in another domain first (the driver publishes
    `numaNode` only as the standard `resource.kubernetes.io/numaNode`), else the domain's closest name."""
    elsewhere = sorted(d for (kind, d), names in published.items()
                       if kind is ref.kind and d != ref.domain and ref.name in names)
    if elsewhere:
        return (f"; did you mean device.{ref.kind.value}[{elsewhere[0]!r}].{ref.name} "
                f"({elsewhere[0]}/{ref.name})?")
    return did_you_mean(ref.name, sorted(published.get((ref.kind, ref.domain), ())), cutoff=0.0)


def _qualified_hint(name: str, known: Sequence[str]) -> str:
    """As `_ref_hint` for a qualified attribute name (`domain/name`) of a constraint."""
    short = name.rpartition("/")[2]
    elsewhere = [k for k in known if k.rpartition("/")[2] == short]
    return f"; did you mean {elsewhere[0]!r}?" if elsewhere else did_you_mean(name, known, cutoff=0.0)


def _quantity_example(ref: DeviceRef, text: str) -> str:
    return (f"device.{ref.kind.value}[{ref.domain!r}].{ref.name}.compareTo(quantity({text!r})) against 0 "
            f"(>= 0, == 0), or .isGreaterThan(quantity({text!r}))")


_QUANTITY_OVERLOAD = re.compile(r"no matching overload for '_(<|<=|>|>=|==|!=)_' applied to \((quantity|string), "
                                r"(quantity|string)\)")


def _overload_hint(message: str) -> str:
    """How to compare a quantity, for cel's missing overload of a comparison with a quantity operand."""
    m = _QUANTITY_OVERLOAD.search(message)
    if m is None or "quantity" not in (m.group(2), m.group(3)):
        return ""
    return ("; quantities compare with methods, against a quantity such as quantity(\"64Gi\") (not a string): "
            "x.compareTo(quantity(\"64Gi\")) >= 0, x.isGreaterThan(quantity(\"64Gi\")), x.isLessThan(...)")


@dataclass
class _Selection:
    """How a unit's selectors did on one node."""

    matched: list[CelDevice] = field(default_factory=list)
    in_class: list[CelDevice] = field(default_factory=list)  # the devices the request's DeviceClass selects
    rejected_by: Counter[str] = field(default_factory=Counter)  # request selector label -> devices it rejected
    by_instance_type: int = 0  # devices rejected by a selector that reads instanceType
    errors: list[tuple[str, CelEvaluationError]] = field(default_factory=list)


class Checker:
    """Checks templates; keeps node models, compiled selectors and evaluations between templates."""

    def __init__(self, drivers: Drivers = DEFAULT_DRIVERS, cel: CelEnvironment | None = None,
                 hardware: Catalog = BUILTIN, unhealthy_device: bool = False) -> None:
        self.drivers = drivers
        self.unhealthy_device = unhealthy_device  # also count claims with one faulty device (Fit.with_unhealthy_device)
        self.cel = cel or CelEnvironment()
        self.hardware = hardware  # the instance types nodes are modelled from
        self._catalogs: dict[Drivers, NodeCatalog] = {}
        self._simulators: dict[tuple[Drivers, str, int], Simulator] = {}

    def catalog(self, drivers: Drivers) -> NodeCatalog:
        if drivers not in self._catalogs:
            self._catalogs[drivers] = NodeCatalog(drivers, self.hardware)
        return self._catalogs[drivers]

    def _simulator(self, drivers: Drivers, node: NodeModel) -> Simulator:
        key = (drivers, node.instance_type, node.lnc)
        if key not in self._simulators:
            self._simulators[key] = Simulator(node.slices, node.device_classes, node.node_name, cel=self.cel)
        return self._simulators[key]

    def check(self, template: TemplateInput, instance_types: Sequence[NodeTypeInput] | None = None) -> CheckReport:
        """`instance_types`: instance types (`trn2.48xlarge`), node types at an LNC (`trn2.48xlarge:lnc=1`,
        NodeType(...)); default every catalog type at its default LNC. A bad one is a report error."""
        manifest: Mapping[str, Any]
        if isinstance(template, ClaimTemplate):
            manifest, drivers = template.to_manifest(), template.drivers
        elif isinstance(template, ManifestSource):
            manifest, drivers = template.to_manifest(), self.drivers
        else:
            manifest, drivers = template, self.drivers
        return _Check(self, manifest, drivers, tuple(instance_types or self.hardware.names)).run()


class _Check:
    def __init__(self, checker: Checker, manifest: Mapping[str, Any], drivers: Drivers,
                 instance_types: tuple[NodeTypeInput, ...]) -> None:
        self.checker = checker
        self.cel = checker.cel
        self.drivers = drivers
        self.catalog = checker.catalog(drivers)
        self.instance_types = instance_types
        meta = manifest.get("metadata") or {}
        self.name = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        self.manifest = manifest
        self.spec: Mapping[str, Any] = (manifest.get("spec") or {}).get("spec") or {}
        self.requests = _units(self.spec)
        self.units = [u for units in self.requests for u in units]
        self.devices: Mapping[str, Any] = self.spec.get("devices") or {}
        self.issues: list[Issue] = []
        self.classes = {c["metadata"]["name"]: c for c in drivers.device_classes()}
        self.matched: Counter[str] = Counter()  # unit ref -> devices matched over every checked node
        self.most_matched: Counter[str] = Counter()  # unit ref -> the most devices matched on one node
        # (request, selector, message) -> instance type -> devices it fails on
        self.failures: dict[tuple[str, str, str], Counter[str]] = {}

    def _named(self, names: Sequence[str]) -> list[_Unit]:
        """The units a constraint or config names (by request or `request/sub`); all when it names none."""
        return [u for u in self.units if not names or u.ref in names or u.base in names]

    def error(self, message: str) -> None:
        if Issue("error", message) not in self.issues:
            self.issues.append(Issue("error", message))

    def _node_types(self) -> list[NodeType]:
        """The node types to check; each bad one an error naming it and what is allowed."""
        out = []
        for t in self.instance_types:
            try:
                node = NodeType.of(t)
                node.spec(self.checker.hardware)
            except TemplateError as e:
                self.error(str(e))
                continue
            if node not in out:
                out.append(node)
        return out

    def run(self) -> CheckReport:
        nodes = self._node_types()
        types = [n.label for n in nodes]
        self._compile()
        self._check_constraints()
        configs = self._decode_configs()
        fits = []
        for n in nodes:
            node = self.catalog.node(n.instance_type, n.lnc)
            fits.append(dataclasses.replace(self._fit(n, node, configs), lnc=node.lnc))
        for (request, label, message), where in self.failures.items():
            on = ", ".join(f"{n} device{'s' * (n > 1)} of {t}" for t, n in where.items())
            self.error(f"{request} {label} fails on {on}: {message} (Kubernetes aborts allocation on such a node)"
                       f"{_overload_hint(message)}")
        self._check_unmatched(types)
        if types and not any(f.claims_per_node for f in fits) and not self.issues:
            self.error(f"fits none of the checked instance types ({', '.join(types)})")
        return CheckReport(self.name, tuple(fits), tuple(self.issues))

    # static checks

    def _compile(self) -> None:
        published = self.catalog.published()
        for units in self.requests:
            for u in units:
                cls = u.body.get("deviceClassName")
                if cls not in self.classes:
                    self.error(f"{u.label}: DeviceClass {cls!r} is not one the checks model "
                               f"({', '.join(self.classes)})")
                    u.broken = True
                for i, s in enumerate(u.body.get("selectors") or []):
                    expr = (s.get("cel") or {}).get("expression", "")
                    try:
                        compiled = self.cel.compile(expr)
                    except CelCompileError as e:
                        self.error(f"{u.label} selector #{i}: {e}")
                        u.broken = True
                        continue
                    u.selectors.append(compiled)
                    self._check_refs(u, i, compiled, published)
                    for ref, text in compiled.analysis.quantity_strings:
                        self.error(f"{u.label} selector #{i} compares {ref} (a quantity) with the string {text!r}: "
                                   f"no such comparison exists, so Kubernetes rejects the selector; compare "
                                   f"quantities, e.g. {_quantity_example(ref, text)}")

    def _check_refs(self, u: _Unit, i: int, compiled: CompiledSelector,
                    published: Mapping[tuple[RefKind, str], frozenset[str]]) -> None:
        for ref in sorted(compiled.refs):
            names = published.get((ref.kind, ref.domain))
            if names is None:
                domains = sorted({d for k, d in published if k is ref.kind})
                self.error(f"{u.label} selector #{i} reads {ref}, but no device publishes {ref.kind.value} in "
                           f"domain {ref.domain!r} (domains: {', '.join(domains)})")
            elif ref.name not in names:
                self.error(f"{u.label} selector #{i} reads {ref}, which the driver does not publish"
                           f"{_ref_hint(ref, published)}")

    def _check_constraints(self) -> None:
        known = self.catalog.published_qualified()
        refs = {u.ref for u in self.units} | {u.base for u in self.units}
        for i, c in enumerate(self.devices.get("constraints") or []):
            name = c.get("matchAttribute")
            if name is None:
                self.error(f"constraint #{i}: only matchAttribute constraints are supported")
                continue
            if name not in known:
                self.error(f"constraint #{i} matchAttribute {name!r}: no device publishes it"
                           f"{_qualified_hint(name, sorted(known))}")
            for r in c.get("requests") or []:
                if r not in refs:
                    self.error(f"constraint #{i} names request {r!r}, which the template does not have")

    def _decode_configs(self) -> list[tuple[tuple[str, ...], driver_config.OpaqueConfig]]:
        decoded = []
        for i, entry in enumerate(self.devices.get("config") or []):
            opaque = entry.get("opaque") or {}
            if opaque.get("driver") != self.drivers.neuron_driver:
                continue
            try:
                cfg = driver_config.decode(opaque.get("parameters"))
            except driver_config.ConfigError as e:
                self.error(f"config #{i} for {opaque.get('driver')}: {e} (the driver would fail prepare, "
                           "leaving the pod in ContainerCreating)")
                continue
            decoded.append((tuple(entry.get("requests") or ()), cfg))
        return decoded

    # per node

    def _select(self, u: _Unit, node: NodeModel) -> _Selection:
        sel = _Selection()
        cls = self.classes.get(u.body.get("deviceClassName", ""))
        class_selectors = [self.cel.compile(s["cel"]["expression"]) for s in (cls or {}).get("spec", {})
                           .get("selectors", [])]
        labelled = [(f"class selector #{i} `{_short(s.expression)}`", s, True) for i, s in enumerate(class_selectors)]
        labelled += [(f"selector #{i} `{_short(s.expression)}`", s, False) for i, s in enumerate(u.selectors)]
        # A merged selector (requests.merged_selectors) is false because of one of its `&&` parts: the first
        # false one, in the order `&&` evaluates them, is the reason named (and whether it reads instanceType).
        parts = {label: self.cel.parts(s) for label, s, of_class in labelled if not of_class}
        for device in node.devices:
            in_class = True
            for label, s, of_class in labelled:
                if in_class and not of_class:
                    sel.in_class.append(device)
                in_class = of_class
                try:
                    if not self.cel.evaluate(s, device):
                        if not of_class:  # the class's own choice of devices is not a reason
                            failed = self._failed_part(parts[label], device)
                            reason = label if failed is None or len(parts[label]) == 1 else \
                                f"{label.split(' `')[0]} part `{_short(failed.expression)}`"
                            sel.rejected_by[reason] += 1
                            sel.by_instance_type += any(r.name == INSTANCE_TYPE for r in (failed or s).refs)
                        break
                except CelEvaluationError as e:
                    sel.errors.append((label, e))
                    break
            else:
                if in_class:
                    sel.in_class.append(device)
                sel.matched.append(device)
        return sel

    def _failed_part(self, parts: Sequence[CompiledSelector], device: CelDevice) -> CompiledSelector | None:
        """The first part that is false (or fails) on the device, None when each is true on its own."""
        for part in parts:
            try:
                if not self.cel.evaluate(part, device):
                    return part
            except CelEvaluationError:
                return part
        return None

    def _fit(self, nt: NodeType, node: NodeModel,
             configs: list[tuple[tuple[str, ...], driver_config.OpaqueConfig]]) -> Fit:
        spec = self.checker.hardware.spec(node.instance_type)
        selections: dict[str, _Selection] = {}
        for units in self.requests:
            for u in units:
                if u.broken:
                    return Fit(nt, 0, f"{u.label} is invalid (see the errors)")
                sel = selections[u.ref] = self._select(u, node)
                self.matched[u.ref] += len(sel.matched)
                self.most_matched[u.ref] = max(self.most_matched[u.ref], len(sel.matched))
                for label, e in sel.errors:
                    self.failures.setdefault((u.label, label, e.message), Counter())[nt.label] += 1
        not_applicable = self._configs_not_applicable(configs, selections, spec)
        if not_applicable:
            return Fit(nt, 0, not_applicable)
        if self._short_of_devices(selections):
            # Fewer matching devices than a request needs: no claim fits, whatever the search would try (it
            # could take the simulation's whole budget to find that out).
            return self._no_fit(nt, node, selections)
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": self.name.split("/")[1], "namespace": self.name.split("/")[0]},
                 "spec": self.spec}
        result = simulate(node.slices, node.device_classes, [claim], node_name=node.node_name, mode="count",
                          simulator=self.checker._simulator(self.drivers, node))
        if result.count:
            degraded = self._with_unhealthy(node, claim, result.allocation[0]) if self.checker.unhealthy_device \
                else None
            return Fit(nt, result.count, None, result.allocation[0], degraded)
        if result.error:
            return Fit(nt, 0, f"the allocator fails: {result.error}")
        return self._no_fit(nt, node, selections)

    def _no_fit(self, nt: NodeType, node: NodeModel, selections: Mapping[str, _Selection]) -> Fit:
        return Fit(nt, 0, self._why_not(selections) + self._lnc_hint(nt, node),
                   targeted=not self._elsewhere(selections))

    def _short_of_devices(self, selections: Mapping[str, _Selection]) -> bool:
        """Whether some request has, in every alternative, fewer matching devices than it needs, with no
        selector error on the node (an error aborts allocation there: the simulation reports it)."""
        if any(selections[u.ref].errors for u in self.units):
            return False
        return any(all(len(selections[u.ref].matched) < u.needs for u in units)
                   for units in self.requests)

    def _elsewhere(self, selections: Mapping[str, _Selection]) -> bool:
        """Whether a request gets no device here because its selectors name other instance types."""
        return any(all(not selections[u.ref].matched and selections[u.ref].by_instance_type for u in units)
                   for units in self.requests)

    def _with_unhealthy(self, node: NodeModel, claim: Mapping[str, Any], first: Sequence[DeviceResult]
                        ) -> int | None:
        """Claims per node with the first claim's first Neuron device tainted as the driver taints it."""
        victim = next((d for d in first if d.driver == self.drivers.neuron_driver), None)
        if victim is None:
            return None
        taint = {"key": unhealthy_taint_key(self.drivers.neuron_driver), "value": "mem_ecc_uncorrected",
                 "effect": "NoSchedule"}
        # The driver taints a faulty device and the cores carved from it (partitions.py names them after it).
        core = parse_core_device(victim.device)
        base = device_name(core[0]) if core is not None else victim.device
        slices = copy.deepcopy(list(node.slices))
        for sl in slices:
            if sl["spec"]["driver"] != victim.driver:
                continue
            for dev in sl["spec"].get("devices") or ():  # counter-set slices have none
                if dev["name"] == base or dev["name"].startswith(f"{base}-core-"):
                    dev["taints"] = [taint]
        return simulate(slices, node.device_classes, [claim], node_name=node.node_name, mode="count",
                        cel=self.cel).count

    def _read_attributes(self) -> set[str]:
        """Every attribute the template's selectors and constraints read, as `domain/name`."""
        names = {f"{r.domain}/{r.name}" for u in self.units for s in u.selectors
                 for r in s.refs if r.kind is RefKind.ATTRIBUTE}
        names |= {c["matchAttribute"] for c in self.devices.get("constraints") or []
                  if c.get("matchAttribute")}
        return names

    def _lnc_hint(self, nt: NodeType, node: NodeModel) -> str:
        """When the template reads attributes this node lacks at its LNC but publishes at another one (core
        groups: coreGroup8_id exists on Trainium2 at LNC=1 only): which, and how to check that node."""
        wanted = self._read_attributes() - node.attribute_names
        for other in self.catalog.every_lnc(node.instance_type):
            there = sorted(wanted & other.attribute_names)
            if other.lnc != node.lnc and there:
                return (f"; {node.instance_type} publishes {', '.join(there)} at LNC={other.lnc} only (this node: "
                        f"LNC={node.lnc}); to check nodes at LNC={other.lnc}: "
                        f"{NodeType(node.instance_type, other.lnc).label}")
        return ""

    def _check_unmatched(self, types: Sequence[str]) -> None:
        if not types:
            return
        where = ", ".join(types)
        for units in self.requests:
            if any(u.broken for u in units):
                continue
            if not any(self.matched[u.ref] for u in units):
                what = "its selectors" if len(units) == 1 else "the selectors of any alternative"
                self.error(f"request {units[0].base!r}: no device of any checked instance type ({where}) matches "
                           f"{what}")
                continue
            for u in units:
                if len(units) > 1 and not self.matched[u.ref]:
                    self.issues.append(Issue("warning", f"{u.label}: no device of any checked instance type "
                                                        f"({where}) matches this alternative"))
                elif len(units) > 1 and not u.all_mode and self.most_matched[u.ref] < u.count:
                    self.issues.append(Issue("warning", f"{u.label}: this alternative can never be satisfied: it "
                                                        f"needs {u.count} devices and at most "
                                                        f"{self.most_matched[u.ref]} match on one node of the "
                                                        f"checked instance types ({where})"))

    def _configs_not_applicable(self, configs: list[tuple[tuple[str, ...], driver_config.OpaqueConfig]],
                                selections: Mapping[str, _Selection], spec: Any) -> str | None:
        for requests, cfg in configs:
            if not any(selections[u.ref].matched for u in self._named(requests)):
                continue  # the config's requests get no device here anyway
            try:
                driver_config.check_applies(cfg, spec)
            except driver_config.ConfigError as e:
                return f"opaque config: {e}"
        return None

    def _why_not(self, selections: Mapping[str, _Selection]) -> str:
        for units in self.requests:
            problems: list[str] = []
            for u in units:
                sel = selections[u.ref]
                have, need = len(sel.matched), u.needs
                if have >= need:
                    problems = []
                    break
                rejected = ", ".join(f"{label} rejects {n}" for label, n in sel.rejected_by.most_common(2))
                wants = "at least one device" if u.all_mode else f"{need} device{'s' * (need > 1)}"
                if not sel.in_class:
                    cls = u.body.get("deviceClassName")
                    problems.append(f"{u.label} needs {wants}; the node has no device of DeviceClass {cls!r}")
                    continue
                of, verb = _kinds(sel.in_class, self.drivers), "matches" if have == 1 else "match"
                problems.append(f"{u.label} needs {wants}; {have} of the node's {of} {verb}"
                                + (f" ({rejected})" if rejected else ""))
            if problems:
                return "; ".join(problems) if len(problems) == 1 else "no alternative fits: " + "; ".join(problems)
        for i, c in enumerate(self.devices.get("constraints") or []):
            attribute = c.get("matchAttribute", "")
            units = self._named(c.get("requests") or ())
            for u in units:
                matched = selections[u.ref].matched
                if matched and all(_attribute(d, attribute) is None for d in matched):
                    return (f"constraint #{i} matchAttribute {attribute}: no device that matches {u.label} "
                            "publishes it")
            for u in units:
                if u.all_mode:
                    continue
                values = Counter(v for d in selections[u.ref].matched if (v := _attribute(d, attribute)) is not None)
                if values and max(values.values()) < u.count:
                    return (f"constraint #{i} matchAttribute {attribute}: {u.label} needs {u.count} devices with "
                            f"one value; at most {max(values.values())} of the matching devices share one")
        return ("the allocator finds no combination of devices that satisfies every request and constraint "
                "together")


_KINDS = {NEURON_DEVICE: ("Neuron device", "Neuron devices"), NEURON_CORE: ("NeuronCore", "NeuronCores"),
          NEURON_NODE: ("UltraServer node device", "UltraServer node devices")}


def _kinds(devices: Sequence[CelDevice], drivers: Drivers) -> str:
    """`16 Neuron devices and 1 UltraServer node device`, `8 EFA devices`: what a DeviceClass selects on a node,
    counted by kind (a NeuronCore is a device too, but counting it with whole devices reads as 56 devices)."""
    counts: Counter[tuple[str, str]] = Counter()
    for d in devices:
        if d.driver == drivers.efa_driver:
            counts[("EFA device", "EFA devices")] += 1
            continue
        resource_type = d.attributes.get(d.driver, {}).get("resourceType", {}).get("string", "")
        counts[_KINDS.get(resource_type, ("device", "devices"))] += 1
    return " and ".join(f"{n} {one if n == 1 else many}" for (one, many), n in counts.items())


def _attribute(device: CelDevice, qualified: str) -> Any:
    domain, _, name = qualified.partition("/")
    value = device.attributes.get(domain, {}).get(name)
    return None if value is None else tuple(sorted(value.items()))


@functools.lru_cache(maxsize=4)
def default_checker(hardware: Catalog = BUILTIN) -> Checker:
    """A shared checker per hardware catalog, so repeated checks (e.g. one per template in a Pulumi program)
    emulate hosts once."""
    return Checker(hardware=hardware)


def check(template: TemplateInput, instance_types: Sequence[NodeTypeInput] | None = None,
          hardware: Catalog = BUILTIN) -> CheckReport:
    """Check one template against instance types of `hardware` (default: every type of it)."""
    return default_checker(hardware).check(template, instance_types)


def check_against(template: TemplateInput, instance_types: Sequence[NodeTypeInput], hardware: Catalog = BUILTIN
                  ) -> None:
    """Raise TemplateCheckError unless the template is error-free and fits one of `instance_types`."""
    report = check(template, instance_types, hardware)
    if not report.ok:
        raise TemplateCheckError(report)


def checked_manifest(template: ClaimTemplate, instance_types: Sequence[NodeTypeInput] | None = None
                     ) -> dict[str, Any]:
    """The template's manifest after the checks passed against `instance_types` (default: every built-in catalog type);
    TemplateCheckError with the reasons otherwise. A function here, not a ClaimTemplate method: the checks
    import the template module, never the other way round."""
    check_against(template, list(instance_types or BUILTIN.names))
    return template.to_manifest()


# --- UltraServer jobs (docs/ultraserver.md §4, docs/workloads.md) ------------------------------------------------


@dataclass(frozen=True)
class UltraServerFit:
    """How many of a job one UltraServer set holds at once: the group devices its shared claim can take there."""

    ultraserver: UltraServerSet
    groups: tuple[str, ...]  # the matching group devices (`ultraserver`, or each `ultraserver-half`)
    reason: str | None = None  # why none

    @property
    def jobs_each(self) -> int:
        # Every matching device has the job's nodeCount, and devices of one nodeCount have disjoint members.
        return len(self.groups)

    @property
    def jobs(self) -> int:
        return self.jobs_each * self.ultraserver.count


@dataclass(frozen=True)
class JobReport:
    """An UltraServerJob checked: its per-pod template on each target type, and its shared group claim against
    UltraServer sets (given ones: a cluster; else each set size of each target type: which sizes fit)."""

    job: str  # namespace/name
    nodes: int
    node_template: CheckReport
    fits: tuple[UltraServerFit, ...]
    issues: tuple[Issue, ...]
    cluster: bool  # the sets are a given cluster (else one of each size the catalog allows)

    @property
    def errors(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def jobs(self) -> int:
        """How many such jobs the sets hold at once."""
        return sum(f.jobs for f in self.fits)

    @property
    def ok(self) -> bool:
        return not self.errors and self.jobs > 0


def check_job(job: UltraServerJob, ultraservers: Sequence[UltraServerSet] | None = None,
              checker: Checker | None = None) -> JobReport:
    """Predict where an UltraServerJob runs. The per-pod template is checked like any template on the job's target
    types (each must hold exactly one: one job pod per node); the group claim's selectors (the class's and the
    request's) are evaluated with real CEL on the group devices the controller's model renders for each set.
    Without `ultraservers`, every set size of every target type is tried (which sizes fit). A job that fits no
    given UltraServer is an error naming the largest there is."""
    checker = checker or default_checker(job.catalog)
    drivers = job.drivers
    types = [f"{t}:lnc={job.lnc}" if job.lnc is not None else t for t in job.target_types]
    node_report = checker.check(job.node_template(), types)
    issues = [Issue(i.severity, f"per-pod template {job.template_name}: {i.message}") for i in node_report.issues]
    for f in node_report.fits:
        if f.claims_per_node == 0:
            issues.append(Issue("error", f"per-pod template {job.template_name} fits no {f.label} node: {f.reason}"))
        elif f.claims_per_node > 1:
            issues.append(Issue("error", f"per-pod template {job.template_name}: {f.claims_per_node} claims fit one "
                                f"{f.label} node, so two job pods could share a node"))
    cluster = ultraservers is not None
    sets = tuple(ultraservers) if ultraservers is not None else tuple(
        UltraServerSet(t, n) for t in job.target_types
        for n in job.catalog.spec(t).ultraserver.modes)  # type: ignore[union-attr]
    class_selector = checker.cel.compile(ultraserver_class_selector(drivers.neuron_driver))
    request_selector = checker.cel.compile(job.group_selector())
    fits = []
    for s in sets:
        devices = group_devices(s.instance_type, s.nodes, drivers.neuron_driver, job.catalog)
        matched = tuple(d["name"] for d in devices
                        if all(checker.cel.evaluate(sel, CelDevice.from_api(drivers.neuron_driver, d))
                               for sel in (class_selector, request_selector)))
        reason = None
        if not matched:
            sizes = sorted({d["attributes"]["nodeCount"]["int"] for d in devices})
            reason = (f"not a target type of the job ({', '.join(job.target_types)})"
                      if s.instance_type not in job.target_types
                      else f"it publishes {' and '.join(map(str, sizes))}-node groups only, the job needs {job.nodes}")
        fits.append(UltraServerFit(s, matched, reason))
    report = JobReport(f"{job.namespace}/{job.name}", job.nodes, node_report, tuple(fits), tuple(issues), cluster)
    if report.jobs == 0:
        targets = [s for s in sets if s.instance_type in job.target_types]
        largest = max((s.nodes for s in targets), default=0)
        where = "of the cluster" if cluster else "of the catalog"
        issues.append(Issue("error", f"fits no UltraServer {where}: the job needs a {job.nodes}-node group of "
                                     f"{', '.join(job.target_types)}; the largest there is "
                                     + (f"{largest} nodes" if largest else "none")))
        report = dataclasses.replace(report, issues=tuple(issues))
    return report
