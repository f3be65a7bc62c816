"""The claim admission policy: a ValidatingAdmissionPolicy that refuses, at `kubectl apply`, a ResourceClaim or
ResourceClaimTemplate whose opaque config for this driver the driver would refuse at prepare (docs/hardening.md §8).

The CEL is generated from the driver's own table of config kinds (`model.config.CONFIG_KINDS`: apiVersion, the
kinds, each kind's fields, their allowed values, which are required), checks in `decode`'s order and says what
`decode` says (`ConfigError`'s wording), so the API server and the daemon cannot disagree about a config. No
webhook server: CEL runs inside the API server. Configs for other drivers are not looked at. Only what holds on
every host is checked here; whether a valid config fits the node it lands on (`check_applies`) is still prepare's.

Written for what kube-apiserver accepts and runs (docs/hardening.md §8): no `cel.bind` in its admission
environment, `dyn()` reads (the type checker knows `parameters` only as an object without fields), work bounded
by the API server's own limits (32 configs, 10 KiB parameters) since it estimates no cost at create.

Plain dicts, no Pulumi: the deploy manifests (and so the stack, the chart and the local cluster) include them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from neuron_dra.driver.errortext import MAX_SHOWN
from neuron_dra.driver.model import config

Manifest = dict[str, Any]

# resource.k8s.io/v1 validation runs before validating admission and caps a claim's configs at 32 and parameters
# at 10 KiB (docs/hardening.md §8); the policy walks config indices from a literal list of that length, so its
# cost is bounded whatever the type checker knows of `object`.
MAX_CONFIGS = 32
# With more unknown fields than this, the refusal names one of them without sorting (the sort is quadratic); with
# this many or fewer, the first in name order, so the message is the same on every try.
MAX_SORTED_UNKNOWN = 16
WHERE_LIMIT = 300  # errors.NotAllowed cuts a field's description at this many characters
POLICY_SUFFIX = "claim-configs"
RESOURCES = ("resourceclaims", "resourceclaimtemplates")


def policy_name(namespace: str, driver_name: str) -> str:
    """Beside the ResourceSlice policy's `<namespace>.<driver>-resourceslices`: one per installation."""
    return f"{namespace}.{driver_name}-{POLICY_SUFFIX}"


def _lit(value: object) -> str:
    """A CEL literal of strings, whole numbers, lists and maps of them: their JSON is CEL."""
    return json.dumps(value)


def _bind(name: str, value: str, body: str) -> str:
    """`body` with `name` bound to `value`, evaluated once. The admission policy environment has no `cel.bind`
    (kube-apiserver 1.36: "undeclared reference to 'cel'"), so a one-element list is mapped instead."""
    return f"[{value}].map({name}, {body})[0]"


def tables() -> list[Manifest]:
    """CONFIG_KINDS as CEL values, one variable each (the policy reads the table, it does not restate it):
    `fields` kind -> its fields besides apiVersion and kind, in check order; `required` kind -> the fields that
    must be given; `values` kind -> field -> the whole numbers allowed; `allowed` kind -> field -> what a refusal
    says is allowed; `fieldsText` kind -> what a refusal of an unknown field says is allowed."""
    def table(value: Any) -> str:
        return _lit({k.kind: value(k) for k in config.CONFIG_KINDS})

    return [
        {"name": "fields", "expression": table(lambda k: [f.name for f in k.fields])},
        {"name": "required", "expression": table(lambda k: [f.name for f in k.fields if f.required])},
        {"name": "values", "expression": table(lambda k: {f.name: list(f.allowed) for f in k.fields})},
        {"name": "allowed", "expression": table(lambda k: {f.name: f.allowed_text for f in k.fields})},
        {"name": "fieldsText", "expression": table(lambda k: k.fields_text)},
    ]


def refused_field(p: str) -> str:
    """CEL: which field `decode` refuses in the parameters `p` (a name: it is read more than once), "" when it
    accepts them: "parameters" (not an object), "apiVersion", "kind", "?KEY" (an unknown field KEY: unknown
    names are kept apart from known ones by the "?"), or one of the kind's fields. `decode`'s checks in its order;
    of several unknown fields the first in name order (the API server hands CEL an unordered map)."""
    kinds = [k.kind for k in config.CONFIG_KINDS]
    first = f"(size(u) <= {MAX_SORTED_UNKNOWN} ? u.filter(x, u.all(y, x <= y))[0] : u[0])"
    # A field is refused when absent or null and required, or given and not an allowed whole number (decode's
    # _strict_int: a JSON true is no 1, 2.0 no 2).
    bad = (f"f in {p} && type({p}[f]) != null_type ? "
           f"(type({p}[f]) != int || !({p}[f] in variables.values[{p}.kind][f])) : "
           f"f in variables.required[{p}.kind]")
    return (
        f'type({p}) != map ? "parameters" : '
        f'!("apiVersion" in {p}) || type({p}.apiVersion) != string || '
        f'{p}.apiVersion != {_lit(config.API_VERSION)} ? "apiVersion" : '
        f'!("kind" in {p}) || type({p}.kind) != string || !({p}.kind in {_lit(kinds)}) ? "kind" : '
        + _bind("u", f'{p}.filter(x, x != "apiVersion" && x != "kind" && !(x in variables.fields[{p}.kind]))',
                f'size(u) > 0 ? "?" + {first} : '
                + _bind("b", f"variables.fields[{p}.kind].filter(f, {bad})", 'size(b) > 0 ? b[0] : ""'))
    )


def _shown(v: str) -> str:
    """errortext.shown in CEL: exact for strings without quotes or escapes, whole numbers, booleans, null and
    doubles below 1e16 (Python's repr: 'text', 2, True, None, 2.0, 2.5); lists and objects only as [...] and {...};
    larger doubles as CEL prints them."""
    return (
        f"(type({v}) == string ? (size({v}) <= {MAX_SHOWN} ? \"'\" + {v} + \"'\" : "
        f"\"'\" + {v}.substring(0, {MAX_SHOWN}) + \"'... (\" + string(size({v})) + \" characters)\") : "
        f"type({v}) == int ? string({v}) : "
        # Python's repr keeps ".0" on whole doubles below 1e16 (2.0); CEL's string() drops it (2).
        f"type({v}) == double ? ({v} > -1e16 && {v} < 1e16 && {v} == double(int({v})) ? string(int({v})) + \".0\" : "
        f"string({v})) : "
        f"type({v}) == bool ? ({v} ? \"True\" : \"False\") : "
        f"type({v}) == null_type ? \"None\" : type({v}) == list ? \"[...]\" : \"{{...}}\")"
    )


def refusal(p: str, r: str) -> str:
    """CEL: ConfigError's message for the refused field `r` (refused_field's answer, not "") of `p`:
    `opaque config field 'F': VALUE is not allowed; allowed: ...`, the field's description cut as
    NotAllowed.where cuts it."""
    where = "(\"opaque config field '\" + f + \"'\")"
    cut = (f"(size({where}) > {WHERE_LIMIT} ? {where}.substring(0, {WHERE_LIMIT}) + \"... (\" + "
           f"string(size({where})) + \" characters)\" : {where})")
    allowed = (f'{r} == "parameters" ? {_lit(config.PARAMETERS_TEXT)} : '
               f'{r} == "apiVersion" ? {_lit(config.API_VERSION)} : {r} == "kind" ? {_lit(config.KINDS_TEXT)} : '
               f'{r}.startsWith("?") ? variables.fieldsText[{p}.kind] : variables.allowed[{p}.kind][{r}]')
    value = f'({r} == "parameters" ? {p} : f in {p} ? {p}[f] : null)'
    return _bind("f", f'{r}.startsWith("?") ? {r}.substring(1) : {r}', _bind(
        "v", value, f'{cut} + ": " + {_shown("v")} + " is not allowed; allowed: " + ({allowed})'))


def _spec_of(obj: str) -> str:
    """A claim's spec, or a template's `spec.spec` (the claim spec it stamps out)."""
    return f'(request.resource.resource == "resourceclaimtemplates" ? dyn({obj}).spec.spec : dyn({obj}).spec)'


def _configs_of(spec: str) -> str:
    return _bind("s", spec, "has(s.devices) && has(s.devices.config) ? s.devices.config : []")


def variables(driver_name: str) -> list[Manifest]:
    """The policy's variables, in evaluation order (each may use those before it)."""
    indices = _lit(list(range(MAX_CONFIGS)))
    c = "variables.configs[i]"
    return [
        *tables(),
        {"name": "configs", "expression": _configs_of(_spec_of("object"))},
        # UPDATE: checked only when the configs change (the spec is immutable in resource.k8s.io/v1 today). A claim
        # stored before the policy existed keeps taking metadata updates: its finalizer must stay removable.
        {"name": "unchanged", "expression": (f'request.operation == "UPDATE" && '
                                             f'{_configs_of(_spec_of("oldObject"))} == variables.configs')},
        {"name": "path", "expression": ('request.resource.resource == "resourceclaimtemplates" ? '
                                        '"spec.spec.devices.config" : "spec.devices.config"')},
        # The indices of this driver's opaque configs.
        {"name": "ours", "expression": (f"{indices}.filter(i, i < size(variables.configs) && has({c}.opaque) && "
                                        f"{c}.opaque.driver == {_lit(driver_name)})")},
        # One message per refused config: `<path>[i]: <decode's refusal>`.
        {"name": "errors", "expression": (
            "variables.ours.map(i, " + _bind("p", f"dyn({c}.opaque.parameters)", _bind(
                "r", refused_field("p"), f'r == "" ? "" : variables.path + "[" + string(i) + "]: " + '
                                         f'{refusal("p", "r")}')) + ').filter(e, e != "")')},
    ]


def claim_config_policy(driver_name: str, namespace: str, labels: Mapping[str, str]) -> Manifest:
    """The ValidatingAdmissionPolicy; `labels` as on the driver's other objects."""
    name = policy_name(namespace, driver_name)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                # Equivalent: a claim written through another version arrives converted to v1, the shape the CEL
                # reads.
                "matchPolicy": "Equivalent",
                "resourceRules": [{
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": list(RESOURCES),
                }],
            },
            "variables": variables(driver_name),
            "validations": [{
                "expression": "variables.unchanged || size(variables.errors) == 0",
                "reason": "Invalid",
                "messageExpression": ('variables.errors[0] + (size(variables.errors) > 1 ? " (and " + '
                                      'string(size(variables.errors) - 1) + " more)" : "")'),
                "message": f"an opaque config for {driver_name} that the driver would refuse at prepare",
            }],
        },
    }


def claim_config_policy_binding(driver_name: str, namespace: str, labels: Mapping[str, str]) -> Manifest:
    name = policy_name(namespace, driver_name)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def manifests(driver_name: str, namespace: str, labels: Mapping[str, str]) -> list[Manifest]:
    """The policy and its binding, in apply order."""
    return [claim_config_policy(driver_name, namespace, labels),
            claim_config_policy_binding(driver_name, namespace, labels)]
