"""The components for other Pulumi languages (neuron_dra/components/provider.py): the schema Pulumi's component host
infers from the adapters, and the adapters giving the same objects and refusals as the Python components."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.provider.experimental.component import ComponentProvider

from neuron_dra.claim_templates.loader import LoadError
from neuron_dra.components import provider
from neuron_dra.components.mocks import run_offline

TEMPLATES = '''
from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron

rows = ClaimTemplate("rows", Neuron(4, topology=Connected()), namespace="team-ml")
'''


def schema() -> dict[str, Any]:
    host = ComponentProvider(provider.COMPONENTS, provider.PACKAGE, None, "0.0.0")
    assert host.schema is not None
    loaded: dict[str, Any] = json.loads(host.schema)
    return loaded


def test_the_inferred_schema_lists_the_components_with_their_inputs_and_outputs() -> None:
    resources = schema()["resources"]
    assert set(resources) == {f"neuron-dra:index:{c}" for c in ("TrainiumCluster", "NeuronDraDriver", "ClaimTemplates")}
    cluster = resources["neuron-dra:index:TrainiumCluster"]
    assert {"clusterName", "kubernetesVersion", "vpcId", "privateSubnetIds", "vpcCniIdentity", "tags"} <= set(
        cluster["inputProperties"])
    assert {"kubeconfig", "clusterName", "vpcId", "oidcProviderArn"} <= set(cluster["properties"])
    driver = resources["neuron-dra:index:NeuronDraDriver"]
    assert driver["isComponent"] is True
    assert set(driver["inputProperties"]) == {"options", "image", "kubernetesVersion", "kubeconfig",
                                              "forceDeleteRepository", "platform", "rolloutTimeoutSeconds"}
    assert driver["inputProperties"]["options"]["additionalProperties"]["$ref"] == "pulumi.json#/Any"
    assert set(driver["properties"]) == {"namespace", "driverName", "deviceClassName", "coreDeviceClassName",
                                         "deviceClassNames", "image"}
    assert "coreDeviceClassName" not in driver["required"]  # absent where the minor has no NeuronCore class
    templates = resources["neuron-dra:index:ClaimTemplates"]
    assert set(templates["inputProperties"]) == {"templatesFile", "instanceTypes", "kubeconfig", "efaTargets",
                                                 "efaDriverExternal", "allowSlowScheduling"}
    assert templates["requiredInputs"] == ["templatesFile"]
    assert set(templates["properties"]) == {"names", "manifests"}


def outputs(component: pulumi.ComponentResource, names: list[str]) -> dict[str, Any]:
    return {n: getattr(component, n) for n in names}


def test_the_driver_adapter_passes_its_options_to_the_python_component() -> None:
    args: provider.NeuronDraDriverArgs = {
        "options": {"namespace": "team-dra", "driver_name": "team.neuron.aws.com"},
        "image": "registry.invalid/team/neuron-dra-driver:1", "kubernetes_version": "1.35",
        "rollout_timeout_seconds": 0}
    run = run_offline(lambda: provider.NeuronDraDriver("dra", args),
                      exports=lambda d: outputs(d, ["namespace", "driver_name", "device_class_name", "image",
                                                    "device_class_names"]))
    assert run.exports == {"namespace": "team-dra", "driver_name": "team.neuron.aws.com",
                           "device_class_name": "team.neuron.aws.com",
                           "image": "registry.invalid/team/neuron-dra-driver:1",
                           "device_class_names": ["team.neuron.aws.com"]}


def test_whole_numbers_from_the_wire_reach_the_args_as_ints() -> None:
    """Pulumi sends every number as a double and the host passes integer inputs on as floats: 0.0 and 9400.0 reach
    our Args as ints, and a fraction still reaches them to be refused."""
    args: dict[str, Any] = {"options": {"metrics_port": 9400.0}, "image": "registry.invalid/d:1",
                            "rollout_timeout_seconds": 0.0}
    run = run_offline(lambda: provider.NeuronDraDriver("dra", args),  # type: ignore[arg-type]
                      exports=lambda d: outputs(d, ["namespace"]))
    assert run.of_type("kubernetes:core/v1:Service")  # the metrics port's Service
    with pytest.raises(ValueError, match="rollout_timeout_seconds"):
        run_offline(lambda: provider.NeuronDraDriver("dra", {**args, "rollout_timeout_seconds": 1.5}))  # type: ignore[typeddict-item]


def test_a_bad_driver_option_is_refused_by_the_options_model_naming_it() -> None:
    args: provider.NeuronDraDriverArgs = {"options": {"logical_core_count": 2}, "image": "registry.invalid/d:1"}
    with pytest.raises(ValueError, match="logical_core_count"):
        run_offline(lambda: provider.NeuronDraDriver("dra", args))


def test_the_templates_adapter_loads_the_file_and_checks_like_the_python_component(tmp_path: Path) -> None:
    file = tmp_path / "templates.py"
    file.write_text(textwrap.dedent(TEMPLATES))
    args: provider.ClaimTemplatesArgs = {"templates_file": str(file), "instance_types": ["trn2.48xlarge"]}
    run = run_offline(lambda: provider.ClaimTemplates("claims", args), exports=lambda c: outputs(c, ["names"]))
    assert run.exports == {"names": ["team-ml/rows"]}
    # The same check as in Python: four connected devices do not fit a trn1.2xlarge (one device).
    small: provider.ClaimTemplatesArgs = {"templates_file": str(file), "instance_types": ["trn1.2xlarge"]}
    with pytest.raises(ValueError, match="team-ml/rows"):
        run_offline(lambda: provider.ClaimTemplates("claims", small))
    with pytest.raises(LoadError, match="no such file"):
        run_offline(lambda: provider.ClaimTemplates("claims", {"templates_file": str(tmp_path / "none.py")}))


def test_the_cluster_adapter_passes_its_inputs_to_the_python_component() -> None:
    args: provider.TrainiumClusterArgs = {"cluster_name": "team-a", "vpc_cni_identity": "nodeRole",
                                          "kubernetes_version": "1.35"}
    run = run_offline(lambda: provider.TrainiumCluster("c", args),
                      exports=lambda c: outputs(c, ["cluster_name", "kubernetes_version"]))
    assert run.one("eks:index:Cluster").plain_inputs["name"] == "team-a"
    assert run.exports == {"cluster_name": "team-a", "kubernetes_version": "1.35"}
    bad: provider.TrainiumClusterArgs = {"vpc_cni_identity": "instanceProfile"}
    with pytest.raises(ValueError, match="vpc_cni_identity"):
        run_offline(lambda: provider.TrainiumCluster("c", bad))
