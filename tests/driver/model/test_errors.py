"""One "not allowed" error: every part's refusal names the field, the value and what is allowed, and is a NotAllowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from neuron_dra.claim_templates import ClaimTemplate, Neuron, OpaqueConfig, TemplateError
from neuron_dra.components.settings import SettingError
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions
from neuron_dra.driver.errortext import MAX_SHOWN, refuse_unknown_keywords, shown
from neuron_dra.driver.model.config import ConfigError, decode
from neuron_dra.driver.model.errors import NotAllowed


def test_each_part_refuses_with_a_not_allowed_naming_field_value_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as config:
        decode({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3})
    with pytest.raises(DeployOptionError) as option:
        DriverDeployOptions(namespace="Not_A_Label")
    with pytest.raises(TemplateError) as template:
        Neuron(0)
    with pytest.raises(SettingError) as setting:
        decode_settings({"neuron-dra:kubernetesVersion": "1.20"})
    for info, field, value in ((config, "logicalNeuronCore", 3), (option, "namespace", "Not_A_Label"),
                               (template, "Neuron.count", 0), (setting, "neuron-dra:kubernetesVersion", "1.20")):
        error = info.value
        assert isinstance(error, NotAllowed) and isinstance(error, ValueError)
        assert (error.field, error.value) == (field, value), error
        assert error.allowed and f"{value!r} is not allowed; allowed: {error.allowed}" in str(error)
    assert str(config.value).startswith("opaque config field 'logicalNeuronCore': ")
    assert str(option.value).startswith("driver option namespace: ")
    assert option.value.option == "namespace" and setting.value.setting == "neuron-dra:kubernetesVersion"


def test_a_refusal_restated_by_another_part_keeps_value_and_allowed() -> None:
    """A bad opaque config in a template is the driver's ConfigError, restated as a TemplateError."""
    with pytest.raises(TemplateError) as info:
        ClaimTemplate("t", Neuron(1, instance_types="trn2.48xlarge"),
                      configs=[OpaqueConfig({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig",
                                            "logicalNeuronCore": 3})])
    with pytest.raises(ConfigError) as driver:
        decode({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3})
    assert info.value.field == "OpaqueConfig.parameters.logicalNeuronCore"
    assert (info.value.value, info.value.allowed) == (driver.value.value, driver.value.allowed)
    restated = driver.value.restated(DeployOptionError)
    assert type(restated) is DeployOptionError and restated.field == "logicalNeuronCore"


def test_shown_is_bounded_whatever_the_value() -> None:
    """Building the echo costs little and stays short: shared references (YAML aliases), deep nesting, integers
    Python refuses to print, megabyte strings."""
    shared: list[object] = ["x"] * 9
    for _ in range(12):
        shared = [shared] * 9  # 9**13 values if walked
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    for value, start in ((shared, "[[[[[...], [...],"), (deep, "[[[[[...]]]]]"), (10 ** 5000, "<int of about 5001"),
                         ("y" * 1_000_000, "'yyy"), ({"k": "v" * 300}, "{'k': 'vvv")):
        text = shown(value)
        assert text.startswith(start) and len(text) < 2 * MAX_SHOWN + 40, text
    assert shown("y" * 1_000_000).endswith("... (1000000 characters)")
    assert (shown(True), shown(2.0), shown(None), shown("ab"), shown([1, 2])) == ("True", "2.0", "None", "'ab'",
                                                                              "[1, 2]")


def test_one_rule_refuses_unknown_keywords_naming_the_closest_for_claims_and_components() -> None:
    made: list[tuple[str, object, str]] = []
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def make(field: str, value: object, allowed: str) -> Exception:
        made.append((field, value, allowed))
        return TypeError(allowed)

    @dataclass
    class Args:
        instance_types: tuple[str, ...] = ()
        count: int = 1

    refuse_unknown_keywords(Args, make, lambda self, args, kwargs: seen.append((args, kwargs)))
    assert Args(("trn2.48xlarge",), count=2).count == 2
    assert seen == [((("trn2.48xlarge",),), {"count": 2})]
    with pytest.raises(TypeError):
        Args(instance_type=("trn2.48xlarge",))  # type: ignore[call-arg]
    assert made == [("Args() keyword", "instance_type", "instance_types, count; did you mean 'instance_types'?")]
    assert len(seen) == 1  # refused before the constructor ran
