"""The claim admission policy (deploy/admission.py): its CEL evaluated on cel-python against claims and templates
and compared with what the driver's own `config.decode` says of the same parameters; the rendered objects under
kubernetes-validate. The real API server's verdict is in test_admission_apiserver.py."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from neuron_dra.claim_templates.cel_env import METHODS
from neuron_dra.driver.deploy import admission
from neuron_dra.driver.model import config
from neuron_dra.driver.model.config import ConfigError, decode
from tests.support import kubeschema

DRIVER = "neuron.aws.com"
OTHER = "gpu.example.com"
NAMESPACE = "neuron-dra-driver"
LABELS = {"app.kubernetes.io/name": "neuron-dra-driver", "app.kubernetes.io/component": "admission"}
NEURON = {"apiVersion": config.API_VERSION, "kind": config.NEURON_CONFIG}
ULTRA = {"apiVersion": config.API_VERSION, "kind": config.ULTRASERVER_CONFIG}
_ENV = celpy.Environment()
_FUNCTIONS = {"substring": METHODS["substring"]}


def policy(driver: str = DRIVER) -> dict[str, Any]:
    return admission.claim_config_policy(driver, NAMESPACE, LABELS)


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)


def _run(expression: str, activation: Mapping[str, Any]) -> Any:
    """One expression on cel-python; an evaluation error raises."""
    value = _program(expression).evaluate(dict(activation))
    if isinstance(value, CELEvalError):
        raise value
    return value


def admit(obj: Mapping[str, Any], *, operation: str = "CREATE", old: Mapping[str, Any] | None = None,
          resource: str | None = None, pol: Mapping[str, Any] | None = None) -> str | None:
    """The policy as the API server runs it: variables in order, then each validation; None when admitted, else
    the refusal's message."""
    spec = (pol or policy())["spec"]
    resource = resource or ("resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims")
    activation: dict[str, Any] = {
        "object": json_to_cel(dict(obj)), "oldObject": json_to_cel(None if old is None else dict(old)),
        "request": json_to_cel({"operation": operation, "resource": {
            "group": "resource.k8s.io", "version": "v1", "resource": resource}}),
    }
    bound: dict[str, Any] = {}
    for v in spec["variables"]:
        activation["variables"] = celtypes.MapType(bound)
        bound[celtypes.StringType(v["name"])] = _run(v["expression"], activation)
    activation["variables"] = celtypes.MapType(bound)
    for check in spec["validations"]:
        if not _run(check["expression"], activation):
            return str(_run(check["messageExpression"], activation))
    return None


def claim(*configs: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "d"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                                 "config": list(configs)}}}


def template(*configs: Mapping[str, Any]) -> dict[str, Any]:
    c = claim(*configs)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": c["metadata"],
            "spec": {"spec": c["spec"]}}


def opaque(parameters: object, driver: str = DRIVER) -> dict[str, Any]:
    return {"requests": ["r"], "opaque": {"driver": driver, "parameters": parameters}}


def drivers_refusal(parameters: object) -> str | None:
    try:
        decode(parameters)
    except ConfigError as e:
        return str(e)
    return None


# Parameters whose refusal shows the value as the driver does (strings, whole numbers, booleans, null).
SAMPLES: list[object] = [
    NEURON, {**NEURON, "logicalNeuronCore": 1}, {**NEURON, "logicalNeuronCore": 2},
    {**NEURON, "logicalNeuronCore": None}, {**ULTRA, "ultraserverMode": 1}, {**ULTRA, "ultraserverMode": 4},
    # the typo of the issue, and other unknown fields
    {**NEURON, "logicalNeuronCoreCount": 2}, {**ULTRA, "ultraserverMode": 2, "mode": "x"},
    {**NEURON, "ultraserverMode": 2}, {**ULTRA, "logicalNeuronCore": 2, "ultraserverMode": 2},
    {**NEURON, "a": True, "b": 1},  # two unknown: the first in name order (decode: in the document's, a then b)
    # values out of range or of the wrong type
    {**NEURON, "logicalNeuronCore": 3}, {**NEURON, "logicalNeuronCore": 0}, {**NEURON, "logicalNeuronCore": "2"},
    {**NEURON, "logicalNeuronCore": True}, {**NEURON, "logicalNeuronCore": 2.0}, {**NEURON, "logicalNeuronCore": 1.5},
    {**NEURON, "logicalNeuronCore": -3e15}, {**ULTRA, "ultraserverMode": 3}, {**ULTRA, "ultraserverMode": None},
    ULTRA, {**ULTRA, "ultraserverMode": -1}, {**ULTRA, "ultraserverMode": False},
    # apiVersion and kind
    {"kind": config.NEURON_CONFIG}, {**NEURON, "apiVersion": "neuron.aws.com/v2"}, {**NEURON, "apiVersion": 1},
    {"apiVersion": config.API_VERSION}, {**NEURON, "kind": "neuronconfig"}, {**NEURON, "kind": None},
    {**NEURON, "kind": "GpuConfig", "logicalNeuronCore": 9},
    # not an object (the API server refuses these before admission; the policy still says the driver's words)
    "NeuronConfig", 2, None,
    # long values and names: cut as the driver cuts them
    {**NEURON, "logicalNeuronCore": "x" * 250}, {**NEURON, "k" * 290: 1}, {**NEURON, "apiVersion": "v" * 201},
]


@pytest.mark.parametrize("parameters", SAMPLES, ids=lambda s: str(s)[:60])
@pytest.mark.parametrize("wrap", [claim, template], ids=["claim", "template"])
def test_the_policy_refuses_what_the_driver_refuses_in_its_words(parameters: object, wrap: Any) -> None:
    obj = wrap(opaque({"apiVersion": "gpu.example.com/v1", "whatever": 1}, OTHER), opaque(parameters))
    expected = drivers_refusal(parameters)
    path = "spec.spec.devices.config" if wrap is template else "spec.devices.config"
    assert admit(obj) == (None if expected is None else f"{path}[1]: {expected}")


@pytest.mark.parametrize(("value", "shown"), [([1, 2], "[...]"), ({"a": 1}, "{...}")])
def test_lists_and_objects_are_shown_short(value: object, shown: str) -> None:
    """The driver prints the repr ([1, 2]); CEL has no generic printer, so the policy says what kind of value."""
    message = admit(claim(opaque({**NEURON, "logicalNeuronCore": value})))
    assert message == (f"spec.devices.config[0]: opaque config field 'logicalNeuronCore': {shown} is not allowed; "
                       "allowed: 1 or 2")
    assert drivers_refusal({**NEURON, "logicalNeuronCore": value}) is not None


def test_of_several_unknown_fields_the_first_in_name_order_is_named() -> None:
    """Go maps have no order, so the policy sorts (the driver names the first in the document's order)."""
    message = admit(claim(opaque({**NEURON, "zeta": 1, "mu": 2, "alpha": 3})))
    assert message is not None and "field 'alpha': 3 is not allowed" in message
    many = {**NEURON, **{f"f{i:02d}": i for i in range(admission.MAX_SORTED_UNKNOWN + 4)}}
    message = admit(claim(opaque(many)))
    assert message is not None and "is not allowed; allowed: the fields of NeuronConfig" in message


def test_every_refused_config_is_counted_and_the_first_is_named() -> None:
    good = opaque({**NEURON, "logicalNeuronCore": 1})
    bad = [opaque({**NEURON, "logicalNeuronCore": n}) for n in (3, 4, 5)]
    message = admit(claim(good, bad[0], opaque({"x": 1}, OTHER), bad[1], bad[2]))
    assert message == ("spec.devices.config[1]: opaque config field 'logicalNeuronCore': 3 is not allowed; "
                       "allowed: 1 or 2 (and 2 more)")
    full = claim(*[opaque({**ULTRA, "ultraserverMode": 3})] * admission.MAX_CONFIGS)
    message = admit(full)
    assert message is not None and message.startswith("spec.devices.config[0]: ") and \
        message.endswith(f"(and {admission.MAX_CONFIGS - 1} more)")


def test_other_drivers_and_claims_without_configs_are_untouched() -> None:
    assert admit(claim(opaque({"logicalNeuronCoreCount": "anything"}, OTHER))) is None
    assert admit(claim()) is None
    no_config = claim()
    del no_config["spec"]["devices"]["config"]
    assert admit(no_config) is None
    assert admit(template()) is None
    # ... and another installation's driver name is another driver
    assert admit(claim(opaque({**NEURON, "logicalNeuronCoreCount": 2}, "neuron.example.com"))) is None
    assert admit(claim(opaque({**NEURON, "logicalNeuronCoreCount": 2}, "neuron.example.com")),
                 pol=policy("neuron.example.com")) is not None


def test_update_is_checked_when_the_configs_change_and_not_otherwise() -> None:
    bad = claim(opaque({**NEURON, "logicalNeuronCoreCount": 2}))
    good = claim(opaque({**NEURON, "logicalNeuronCore": 2}))
    # A bad claim stored before the policy: a metadata update (a finalizer removed) goes through.
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert admit(relabelled, operation="UPDATE", old=bad) is None
    # Configs changed to a bad one: refused, as on create.
    assert admit(bad, operation="UPDATE", old=good) == admit(bad)
    assert admit(good, operation="UPDATE", old=bad) is None
    assert admit(template(*bad["spec"]["devices"]["config"]), operation="UPDATE",
                 old=template(*good["spec"]["devices"]["config"])) is not None


def test_the_policy_follows_the_drivers_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field added to CONFIG_KINDS (here a required second field of NeuronConfig, allowing only 7) is checked by
    decode and the policy alike: the policy is generated from the table, not a copy of it."""
    extra = config.ConfigKind("NeuronConfig", config.NeuronConfig, (
        *config.CONFIG_KINDS[0].fields,
        config.ConfigField("ultraserverMode", "logical_neuron_core", (7,), required=True)))
    monkeypatch.setattr(config, "CONFIG_KINDS", (extra, *config.CONFIG_KINDS[1:]))
    for parameters in ({**NEURON, "logicalNeuronCore": 1, "ultraserverMode": 7},
                       {**NEURON, "logicalNeuronCore": 1}, {**NEURON, "ultraserverMode": 4}):
        expected = drivers_refusal(parameters)
        assert admit(claim(opaque(parameters))) == (None if expected is None else f"spec.devices.config[0]: "
                                                                                 f"{expected}")
    assert drivers_refusal({**NEURON, "logicalNeuronCore": 1}) == (
        "opaque config field 'ultraserverMode': None is not allowed; allowed: 7")


def test_the_objects_pass_kubernetes_validate_strict() -> None:
    objs = admission.manifests(DRIVER, NAMESPACE, LABELS)
    assert [o["kind"] for o in objs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for obj in objs:
        kubeschema.validate(obj, "1.34", strict=True)
    assert objs[1]["spec"]["policyName"] == objs[0]["metadata"]["name"] == \
        f"{NAMESPACE}.{DRIVER}-{admission.POLICY_SUFFIX}"
    assert objs[0]["metadata"]["labels"] == LABELS


def test_every_expression_compiles_and_the_driver_name_is_quoted() -> None:
    for v in policy('a"b')["spec"]["variables"]:
        _ENV.compile(v["expression"])
    assert '"a\\"b"' in next(v["expression"] for v in policy('a"b')["spec"]["variables"] if v["name"] == "ours")
