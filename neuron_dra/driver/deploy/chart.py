"""The driver's Helm chart, generated from `manifests()` so that chart and stack cannot drift (docs/helm.md).

How the templates are derived, with no second rendering of any object:
- Scalars: `manifests()` renders once with a sentinel for each templated option (`@@name@@` for strings, a
  distinctive number for numbers); every string holding sentinels becomes a Helm expression that prints the same
  text with the values in their place, every integer equal to one becomes `.Values.x`.
  Mappings holding the labels sentinel become `mergeOverwrite` of their own keys and the labels values; the
  instance-type list becomes `.Values.instanceTypes`.
- Shapes: each option that turns parts on or off (a port of 0, a flag, an extended resource or a limit of null,
  an API-client setting at its default) is rendered off too, alone and in pairs; what the off renders lack is
  wrapped in `{{- if }}` on the options whose being off removed it (an object, a mapping key or a list item). A
  part that appears only when an option is off, or a constant that changes, is a ChartError: the generator says
  it cannot template it rather than guess.
- Names derived from the driver name when left empty (namespace_for, device_class_names) are the one rule stated
  twice: in Python and in templates/_helpers.tpl (HELPERS); the tests compare both for long and short names.
- Options the chart does not template (TEMPLATED lists those it does) keep their defaults: they are not values,
  and the schema refuses them as unknown keys.

The option values are validated before rendering by values.schema.json, generated from the options model
(`DriverDeployOptions`' pydantic schema, JSON-schema draft 7, no additional properties).
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter
from pydantic.alias_generators import to_camel

from neuron_dra.driver.deploy import (
    DEFAULT_NAMESPACE,
    MIN_MINOR,
    DriverDeployOptions,
    Manifest,
    Resources,
    manifests,
    ultraserver,
)
from neuron_dra.driver.deploy.options import _QUANTITY  # the options' own quantity check of resources
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.k8s_names import (  # the checks' own patterns
    _DNS_LABEL,
    _DNS_SUBDOMAIN,
    DEFAULT_CORE_DEVICE_CLASS,
    DEFAULT_DRIVER_NAME,
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    DRIVER_NAME_MAX,
)
from neuron_dra.driver.model.version import VERSION

CHART_NAME = "neuron-dra-driver"
# The options a chart is generated for rather than templated: what the cluster's Kubernetes minor serves changes
# objects and the daemon's flags in ways a template would have to re-implement (KUBERNETES_FEATURES,
# publishes_cores), so a chart is for a minor and up, as a stack is (Chart.yaml's kubeVersion says which). The
# default is the default stack's minor (components/settings.py DEFAULT_KUBERNETES_VERSION; a test checks).
DEFAULT_GENERATION: Mapping[str, Any] = {"kubernetes_version": "1.36", "core_partitions": "auto"}
NodePath = tuple[Any, ...]

# The options the chart templates: DriverDeployOptions field -> value name (camelCase, as the stack's config names
# the options it feeds: components/settings.py _alias).
TEMPLATED: Mapping[str, str] = {
    name: to_camel(name) for name in (
        "image", "image_pull_policy", "driver_name", "device_class_name", "core_device_class_name",
        "extended_resource_name", "core_extended_resource_name", "namespace", "service_account", "daemonset_name",
        "plugins_dir", "registry_dir", "cdi_root", "host_root", "host_paths_root", "healthcheck_port",
        "metrics_port", "metrics_service", "pod_monitor", "neuron_monitor", "instance_types", "priority_class_name",
        "labels", "pod_monitor_labels", "unhealthy_taint_effect", "max_surge", "max_unavailable", "resources",
        "kube_api_qps", "kube_api_burst", "kube_api_timeout", "ultraserver_groups", "ultraserver_shared_counters",
    )
}
# The fields of `resources` (a mapping value: resources.cpuRequest, ...).
_RESOURCES = ("cpu_request", "memory_request", "memory_limit", "cpu_limit")
# Integer options: each renders as a distinctive number (no default or fixed value in the objects equals one).
_INT_SENTINELS = {"healthcheck_port": 61001, "metrics_port": 61002, "max_surge": 61003, "max_unavailable": 61004,
                  "kube_api_qps": 61005, "kube_api_burst": 61006, "kube_api_timeout": 61007}
# How an option prints where the objects hold it as text (default: toString). The daemon's API-client flags are
# printed with Python's `:g` (deploy.driver_args), which is C's %g with 6 significant digits, as is Go's %.6g.
_API_CLIENT = ("kube_api_qps", "kube_api_burst", "kube_api_timeout")
_TEXT_FORMS = {f: f'printf "%.6g" (float64 .Values.{TEMPLATED[f]})' for f in _API_CLIENT}
# String options with a derived default ("" or None: from the driver name) are rendered through a named template.
_DERIVED = {"namespace": "neuron-dra.namespace", "device_class_name": "neuron-dra.deviceClass",
            "core_device_class_name": "neuron-dra.coreDeviceClass"}
_STRINGS = ("image", "image_pull_policy", "driver_name", "device_class_name", "core_device_class_name",
            "extended_resource_name", "core_extended_resource_name", "namespace", "service_account",
            "daemonset_name", "plugins_dir", "registry_dir", "cdi_root", "host_root", "host_paths_root",
            "priority_class_name", "unhealthy_taint_effect", "ultraserver_shared_counters")
# The paths as they appear in the objects: without a trailing "/" (the chart's schema refuses one, so the value
# is used as is), except host_paths_root, whose "/" is the empty prefix of the node's paths.
_EXPRESSIONS = {"host_paths_root": '(trimSuffix "/" .Values.hostPathsRoot)'}
# Toggles: option, its "off" value, and the Helm condition under which the "on" render's parts exist.
_DEFAULTS = DriverDeployOptions()
_TOGGLES: tuple[tuple[str, Any, str], ...] = (
    ("metrics_port", 0, ".Values.metricsPort"),
    ("healthcheck_port", 0, ".Values.healthcheckPort"),
    ("metrics_service", False, ".Values.metricsService"),
    ("pod_monitor", False, ".Values.podMonitor"),
    ("neuron_monitor", False, ".Values.neuronMonitor"),
    ("ultraserver_groups", False, ".Values.ultraserverGroups"),
    ("extended_resource_name", None, ".Values.extendedResourceName"),
    ("core_extended_resource_name", None, ".Values.coreExtendedResourceName"),
    ("resources.memory_limit", None, ".Values.resources.memoryLimit"),
    ("resources.cpu_limit", None, ".Values.resources.cpuLimit"),
    # The API-client flags are passed only when changed (no rollout otherwise: deploy.driver_args).
    *((f, getattr(_DEFAULTS, f), f"ne (float64 .Values.{TEMPLATED[f]}) {float(getattr(_DEFAULTS, f))!r}")
      for f in _API_CLIENT),
)
_LABELS_SENTINEL = "@@labels@@"
_POD_MONITOR_LABELS_SENTINEL = "@@pod_monitor_labels@@"
_INSTANCE_TYPES_SENTINEL = "@@instance_types@@"
_SENTINEL = re.compile(r"@@([a-z_.]+)@@")
# The chart refuses what it cannot template as the options do: a path with a trailing "/" (the objects use it
# both with and without).
_PATH_PATTERN = r"^(/[^/]+)+$"
_PATHS = ("plugins_dir", "registry_dir", "cdi_root", "host_root")

HELPERS = f'''{{{{/* Names derived from the driver name when left empty (driver/deploy: namespace_for,
device_class_names). Generated by neuron_dra/driver/deploy/chart.py. */}}}}
{{{{- define "neuron-dra.namespace" -}}}}
{{{{- if .Values.namespace -}}}}{{{{ .Values.namespace }}}}
{{{{- else if eq .Values.driverName "{DEFAULT_DRIVER_NAME}" -}}}}{DEFAULT_NAMESPACE}
{{{{- else -}}}}
{{{{- $n := printf "neuron-dra-%s" (replace "." "-" .Values.driverName) -}}}}
{{{{- if le (len $n) 63 -}}}}{{{{ $n }}}}
{{{{- else -}}}}{{{{ regexReplaceAll "-+$" (trunc 54 $n) "" }}}}-{{{{ trunc 8 (sha256sum .Values.driverName) }}}}
{{{{- end -}}}}
{{{{- end -}}}}
{{{{- end -}}}}
{{{{- define "neuron-dra.deviceClass" -}}}}
{{{{- .Values.deviceClassName | default .Values.driverName -}}}}
{{{{- end -}}}}
{{{{- define "neuron-dra.coreDeviceClass" -}}}}
{{{{- if .Values.coreDeviceClassName -}}}}{{{{ .Values.coreDeviceClassName }}}}
{{{{- else if eq .Values.driverName "{DEFAULT_DRIVER_NAME}" -}}}}{DEFAULT_CORE_DEVICE_CLASS}
{{{{- else -}}}}cores.{{{{ .Values.driverName }}}}
{{{{- end -}}}}
{{{{- end -}}}}
'''


class ChartError(Exception):
    """manifests() changed in a way this generator cannot template (a value, not a shape, differs)."""


@dataclass(frozen=True)
class Expr:
    """A Helm expression (a pipeline) whose value, as JSON, is the node."""

    text: str


def _value_expr(field: str) -> str:
    if "." in field:  # resources.cpu_request
        return ".Values." + ".".join(to_camel(part) for part in field.split("."))
    if field in _DERIVED:
        return f'(include "{_DERIVED[field]}" .)'
    if field in _EXPRESSIONS:
        return _EXPRESSIONS[field]
    return f".Values.{TEMPLATED[field]}"


def _sentinel_options(fixed: Mapping[str, Any], **off: Any) -> DriverDeployOptions:
    """The default options with a sentinel in every templated option, then `off`'s values (no validation: the
    sentinels are not valid values; manifests() only prints them)."""
    options = DriverDeployOptions()
    values: dict[str, Any] = {f: f"@@{f}@@" for f in _STRINGS}
    values.update(_INT_SENTINELS)
    values.update(metrics_service=True, pod_monitor=True, neuron_monitor=True, ultraserver_groups=True,
                  labels={_LABELS_SENTINEL: _LABELS_SENTINEL},
                  pod_monitor_labels={_POD_MONITOR_LABELS_SENTINEL: _POD_MONITOR_LABELS_SENTINEL},
                  instance_types=(_INSTANCE_TYPES_SENTINEL,))
    values.update({f"resources.{f}": f"@@resources.{f}@@" for f in _RESOURCES})
    values.update(fixed)
    values.update(off)
    resources = {k.partition(".")[2]: values.pop(k) for k in list(values) if k.startswith("resources.")}
    values["resources"] = Resources(**resources)
    for name, value in values.items():
        object.__setattr__(options, name, value)
    return options


def _object_id(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def _absent(on: Any, off: Any, path: NodePath, out: set[NodePath]) -> None:
    """Paths (in `on`) of the parts `off` lacks; a part present in both must have the same shape."""
    if isinstance(on, dict) and isinstance(off, dict):
        if set(off) - set(on):
            raise ChartError(f"{path}: keys {sorted(set(off) - set(on))} appear only when an option is off")
        for key, value in on.items():
            if key not in off:
                out.add((*path, key))
            else:
                _absent(value, off[key], (*path, key), out)
    elif isinstance(on, list) and isinstance(off, list):
        matcher = difflib.SequenceMatcher(a=[json.dumps(x, sort_keys=True) for x in on],
                                          b=[json.dumps(x, sort_keys=True) for x in off], autojunk=False)
        for op, a0, a1, b0, b1 in matcher.get_opcodes():
            if op == "delete":
                out.update((*path, i) for i in range(a0, a1))
            elif op == "replace" and a1 - a0 == b1 - b0:
                for i, j in zip(range(a0, a1), range(b0, b1), strict=True):
                    _absent(on[i], off[j], (*path, i), out)
            elif op != "equal":
                raise ChartError(f"{path}: items {on[a0:a1]} become {off[b0:b1]} when an option is off")
    elif on != off and not _holds_sentinel(on):  # a value printed from the option's own value: any value
        raise ChartError(f"{path}: {on!r} becomes {off!r} when an option is off")


def _holds_sentinel(node: Any) -> bool:
    text = json.dumps(node)
    return bool(_SENTINEL.search(text)) or any(str(v) in text for v in _INT_SENTINELS.values())


def _conditions(fixed: Mapping[str, Any]) -> tuple[list[Manifest], dict[NodePath, str]]:
    """The "everything on" render and the Helm condition of each of its parts that some option turns off: the
    AND, over the smallest sets of toggles that remove the part, of the OR of their conditions."""
    base = manifests(_sentinel_options(fixed))
    removed_by: dict[NodePath, list[tuple[int, ...]]] = {}
    for size in (1, 2):
        for combo in itertools.combinations(range(len(_TOGGLES)), size):
            variant = manifests(_sentinel_options(fixed, **{_TOGGLES[i][0]: _TOGGLES[i][1] for i in combo}))
            by_id = {_object_id(m): m for m in variant}
            gone: set[NodePath] = set()
            for index, obj in enumerate(base):
                other = by_id.get(_object_id(obj))
                if other is None:
                    gone.add((index,))
                else:
                    _absent(obj, other, (index,), gone)
            for path in gone:
                sets = removed_by.setdefault(path, [])
                if not any(set(s) <= set(combo) for s in sets):
                    sets.append(combo)
    conditions: dict[NodePath, str] = {}
    for path, sets in removed_by.items():
        terms = []
        for s in sets:
            conds = [_TOGGLES[i][2] for i in s]
            terms.append(conds[0] if len(conds) == 1 else f"(or {' '.join(conds)})")
        conditions[path] = terms[0] if len(terms) == 1 else f"and {' '.join(terms)}"
    return base, conditions


def _string_expr(text: str) -> Expr | str:
    """`text` with its sentinels as a Helm expression printing the same text with the values in."""
    parts: list[str] = []
    pos = 0
    for m in _SENTINEL.finditer(text):
        if m.start() > pos:
            parts.append(json.dumps(text[pos:m.start()]))
        parts.append(_value_expr(m.group(1)))
        pos = m.end()
    if not parts:
        if text in {str(v) for v in _INT_SENTINELS.values()}:
            field = next(f for f, v in _INT_SENTINELS.items() if str(v) == text)
            return Expr(_TEXT_FORMS.get(field, f"toString {_value_expr(field)}"))
        return text
    if pos < len(text):
        parts.append(json.dumps(text[pos:]))
    return Expr(parts[0] if len(parts) == 1 else f"print {' '.join(parts)}")


def _templated(node: Any, path: NodePath = (), conditions: Mapping[NodePath, str] | None = None) -> Any:
    """`node` with every sentinel replaced by an Expr. `conditions` (at `path`): a constant label that an option
    turns off is merged only under its condition (a label mapping becomes one expression, so `_emit` cannot wrap
    its keys)."""
    conditions = conditions or {}
    if isinstance(node, dict):
        sources = {_LABELS_SENTINEL: "labels", _POD_MONITOR_LABELS_SENTINEL: "pod_monitor_labels"}
        if sources.keys() & node.keys():
            # The keys in order: literal runs and the label values between them; a later one wins, as in the
            # dict manifests() built (e.g. the Namespace's Pod Security labels over `labels`).
            args: list[str] = []
            run: list[str] = []
            for k, v in node.items():
                if k in sources:
                    if run or not args:  # the first argument is a fresh mapping (mergeOverwrite changes it)
                        args.append(f"(dict {' '.join(run)})".replace(" )", ")"))
                    args.append(_value_expr(sources[k]))
                    run = []
                elif not isinstance(v, str) or _SENTINEL.search(k + v):
                    raise ChartError(f"labels {node} hold more than constant labels")
                elif (cond := conditions.get((*path, k))) is not None:
                    if run or not args:
                        args.append(f"(dict {' '.join(run)})".replace(" )", ")"))
                    args.append(f"(ternary (dict {json.dumps(k)} {json.dumps(v)}) (dict) ({cond}))")
                    run = []
                else:
                    run += [json.dumps(k), json.dumps(v)]
            if run:
                args.append(f"(dict {' '.join(run)})")
            return Expr(f"mergeOverwrite {' '.join(args)}")
        return {k: _templated(v, (*path, k), conditions) for k, v in node.items()}
    if isinstance(node, list):
        if node == [_INSTANCE_TYPES_SENTINEL]:
            return Expr(_value_expr("instance_types"))
        return [_templated(x, (*path, i), conditions) for i, x in enumerate(node)]
    if isinstance(node, str):
        return _string_expr(node)
    if isinstance(node, int) and not isinstance(node, bool) and node in _INT_SENTINELS.values():
        return Expr(_value_expr(next(f for f, v in _INT_SENTINELS.items() if v == node)))
    return node


def _inline(node: Any) -> str | None:
    if isinstance(node, Expr):
        return f"{{{{ {node.text} | toJson }}}}"
    if isinstance(node, (dict, list)):
        return "{}" if node == {} else "[]" if node == [] else None
    return json.dumps(node)


def _emit(node: Any, path: NodePath, conditions: Mapping[NodePath, str], indent: int) -> Iterator[str]:
    """YAML lines of a mapping or list whose parts may be conditional (each `{{- if }}` on its own line)."""
    pad = " " * indent
    items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
    for key, value in items:
        cond = conditions.get((*path, key))
        if cond:
            yield f"{{{{- if {cond} }}}}"
        head = f"{pad}{json.dumps(key)}:" if isinstance(node, dict) else f"{pad}-"
        inline = _inline(value)
        if inline is not None:
            yield f"{head} {inline}"
        else:
            yield head
            children = value.keys() if isinstance(value, dict) else range(len(value))
            child_conds = [conditions.get((*path, key, k)) for k in children]
            if all(child_conds) and isinstance(value, list):
                # Every item may be off: then the list is empty, not null.
                yield f"{{{{- if or {' '.join(f'({c})' for c in child_conds)} }}}}"
                yield from _emit(value, (*path, key), conditions, indent + 2)
                yield "{{- else }}"
                yield f"{head} []"
                yield "{{- end }}"
            else:
                yield from _emit(value, (*path, key), conditions, indent + 2)
        if cond:
            yield "{{- end }}"


def templates(fixed: Mapping[str, Any] = DEFAULT_GENERATION) -> dict[str, str]:
    """templates/*.yaml: file name -> text, one object a file in manifests() order (for the `fixed` options)."""
    base, conditions = _conditions(fixed)
    files: dict[str, str] = {"_helpers.tpl": HELPERS}
    for index, obj in enumerate(base):
        cond = conditions.get((index,))
        lines = [f"{{{{- if {cond} }}}}"] if cond else []
        lines.append("# Generated by neuron_dra/driver/deploy/chart.py from deploy.manifests(): do not edit.")
        lines.extend(_emit(_templated(obj, (index,), conditions), (index,), conditions, 0))
        if cond:
            lines.append("{{- end }}")
        files[f"{index:02d}-{obj['kind'].lower()}.yaml"] = "\n".join(lines) + "\n"
    return files


def default_values() -> dict[str, Any]:
    """values.yaml: the options' defaults under their value names (derived names left empty, as the options)."""
    options = DriverDeployOptions()
    out: dict[str, Any] = {}
    for field, name in TEMPLATED.items():
        value = getattr(options, field)
        if field in ("namespace", "core_device_class_name"):
            value = ""  # derived from the driver name (the options' own default)
        elif field == "device_class_name":
            value = value or ""
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, Resources):
            value = {to_camel(f): getattr(value, f) for f in _RESOURCES}
        out[name] = value
    return out


def values_schema() -> dict[str, Any]:
    """values.schema.json: the options model's JSON schema (pydantic), for the templated options under their value
    names, as JSON-schema draft 7 with no additional properties, so a bad value is refused naming its field."""
    model = TypeAdapter(DriverDeployOptions).json_schema()
    properties: dict[str, Any] = {}
    for field, name in TEMPLATED.items():
        prop = copy.deepcopy(model["properties"][field])
        prop.pop("title", None)
        prop.pop("default", None)
        # The k8s_names checks the options run (BeforeValidators: not in pydantic's schema); "" derives the name.
        if field in ("device_class_name", "core_device_class_name"):
            prop = {"type": "string", "maxLength": DNS_SUBDOMAIN_MAX,
                    "pattern": f"^$|{_DNS_SUBDOMAIN.pattern}", "description": "empty: derived from driverName"}
        if field == "namespace":
            prop = {"type": "string", "maxLength": DNS_LABEL_MAX, "pattern": f"^$|{_DNS_LABEL.pattern}",
                    "description": "empty: derived from driverName"}
        if field in ("driver_name", "service_account", "daemonset_name"):
            prop.update(pattern=_DNS_SUBDOMAIN.pattern,
                        maxLength=DRIVER_NAME_MAX if field == "driver_name" else DNS_SUBDOMAIN_MAX)
        if field in _PATHS:
            prop["pattern"] = _PATH_PATTERN
        if field == "host_paths_root":
            prop["pattern"] = r"^/$|" + _PATH_PATTERN
        if field == "instance_types":
            prop["items"] = {"type": "string", "enum": list(BUILTIN.names)}
            prop["minItems"] = 1
        if field == "resources":
            fields = model["$defs"]["Resources"]["properties"]
            prop = {"type": "object", "additionalProperties": False, "properties": {
                to_camel(f): _quantity(fields[f]) for f in _RESOURCES}}
        if field in ("labels", "pod_monitor_labels"):
            prop = {"type": "object", "additionalProperties": {"type": "string"}}
        properties[name] = prop
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"{CHART_NAME} values (DriverDeployOptions)",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        # The options' checks across fields (DriverDeployOptions.__post_init__) that a schema can state.
        "allOf": [
            {"if": {"properties": {"podMonitor": {"const": True}}, "required": ["podMonitor"]},
             "then": {"properties": {"metricsPort": {"minimum": 1}}, "required": ["metricsPort"]}},
            {"if": {"properties": {"maxSurge": {"const": 0}}, "required": ["maxSurge"]},
             "then": {"properties": {"maxUnavailable": {"minimum": 1}}}},
            {"if": {"properties": {"ultraserverGroups": {"const": True}}, "required": ["ultraserverGroups"]},
             "then": {"properties": {"serviceAccount": {"not": {"const": ultraserver.DEFAULT_NAME}}}}},
        ],
    }


def _quantity(prop: Mapping[str, Any]) -> dict[str, Any]:
    """A Resources field's schema (a string, or a string or null) with the quantity pattern the options check."""
    out = {k: v for k, v in prop.items() if k not in ("title", "default")}
    for branch in out.get("anyOf", [out]):
        if branch.get("type") == "string":
            branch["pattern"] = _QUANTITY.pattern
    return out


def chart_yaml(fixed: Mapping[str, Any] = DEFAULT_GENERATION) -> dict[str, Any]:
    minor = fixed.get("kubernetes_version")
    return {
        "apiVersion": "v2",
        "name": CHART_NAME,
        "description": "The Neuron DRA driver (AWS Trainium/Inferentia), rendered from neuron_dra.driver.deploy",
        "type": "application",
        "version": VERSION,
        "appVersion": VERSION,
        "kubeVersion": f">={minor or '1.' + str(MIN_MINOR)}.0-0",
        "annotations": {f"neuron-dra/{k}": str(v) for k, v in fixed.items()},
    }


def write_chart(directory: Path, fixed: Mapping[str, Any] = DEFAULT_GENERATION) -> Path:
    """The chart in `directory/neuron-dra-driver/` (replacing its templates) for the `fixed` options; its path."""
    DriverDeployOptions(**fixed)  # refused here, naming the option, if not valid
    root = directory / CHART_NAME
    (root / "templates").mkdir(parents=True, exist_ok=True)
    for old in (root / "templates").iterdir():
        old.unlink()
    (root / "Chart.yaml").write_text(yaml.safe_dump(chart_yaml(fixed), sort_keys=False))
    header = "# Defaults of neuron_dra.driver.deploy.DriverDeployOptions (generated by driver/deploy/chart.py).\n"
    (root / "values.yaml").write_text(header + yaml.safe_dump(default_values(), sort_keys=False))
    (root / "values.schema.json").write_text(json.dumps(values_schema(), indent=2) + "\n")
    for name, text in templates(fixed).items():
        (root / "templates" / name).write_text(text)
    return root


def options_from_values(values: Mapping[str, Any],
                        fixed: Mapping[str, Any] = DEFAULT_GENERATION) -> DriverDeployOptions:
    """The DriverDeployOptions that chart values stand for (the tests compare both renders)."""
    fields = {v: f for f, v in TEMPLATED.items()}
    kwargs: dict[str, Any] = dict(fixed)
    for name, value in values.items():
        field = fields[name]
        if field == "device_class_name" and value == "":
            value = None
        if field == "instance_types":
            value = tuple(value)
        if field == "resources":
            value = Resources(**{f: value[to_camel(f)] for f in _RESOURCES if to_camel(f) in value})
        kwargs[field] = value
    return DriverDeployOptions(**kwargs)
