"""Names that carry through: the driver name and its DeviceClass names come from one rule
(`k8s_names.device_class_names`); templates deployed with a driver take that driver's names, and a template naming a
DeviceClass no component creates fails the program naming the class and the classes that exist."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from neuron_dra.claim_templates import ClaimTemplate, Drivers, Efa, Neuron, NeuronCores
from neuron_dra.components.claims import ClaimTemplates, ClaimTemplatesArgs, device_class_refs
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.efa_driver import EfaDraDriver, EfaDraDriverArgs
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.plan import kubernetes_manifests, plan
from neuron_dra.components.settings import SettingError
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.k8s_names import device_class_names

CUSTOM = "neuron.example.com"
IMAGE = "registry.example.com/neuron-dra-driver@sha256:" + "0" * 64


def test_one_rule_derives_the_driver_name_and_both_class_names() -> None:
    default = device_class_names("neuron.aws.com")
    assert (default.driver_name, default.device_class, default.core_device_class) == (
        "neuron.aws.com", "neuron.aws.com", "neuroncore.aws.com")
    custom = device_class_names(CUSTOM)
    assert (custom.device_class, custom.core_device_class) == (CUSTOM, f"cores.{CUSTOM}")
    assert device_class_names(CUSTOM, "whole", "parts").core_device_class == "parts"
    # The deployment and the templates' Drivers use that rule, so they agree.
    options = DriverDeployOptions(driver_name=CUSTOM)
    assert options.class_names == custom and Drivers.of(custom) == Drivers(neuron_driver=CUSTOM)


def run_stack(templates: Sequence[Any], version: str = "1.36", driver_name: str = CUSTOM, efa: str | None = None,
              efa_class: str = "efa.networking.k8s.aws") -> OfflineRun[ClaimTemplates]:
    # NeuronCores asked for explicitly: on 1.36 `auto` publishes none (docs/neuron-cores.md §5).
    options = DriverDeployOptions(driver_name=driver_name, core_partitions="on")

    def program() -> ClaimTemplates:
        provider = k8s.Provider("target", kubeconfig="{}")
        opts = pulumi.ResourceOptions(provider=provider)
        driver = NeuronDraDriver("drv", NeuronDraDriverArgs(options=options, image=IMAGE,
                                                            kubernetes_version=version), opts=opts)
        efa_driver: Any = efa
        if efa == "component":
            efa_driver = EfaDraDriver("efa", EfaDraDriverArgs(node_groups=["trn2"], device_class_name=efa_class),
                                      opts=opts)
        return ClaimTemplates("tpl", ClaimTemplatesArgs(templates=list(templates), instance_types=["trn2.48xlarge"],
                                                        driver=driver, efa_driver=efa_driver), opts=opts)

    return run_offline(program)


def sent(run: OfflineRun[Any], kind: str) -> list[dict[str, Any]]:
    return [r.plain_inputs for r in run.resources if r.plain_inputs.get("kind") == kind]


def test_templates_deployed_with_a_custom_driver_take_its_names() -> None:
    whole, cores = ClaimTemplate("whole", Neuron(2)), ClaimTemplate("cores", NeuronCores(4))
    aligned = ClaimTemplate("aligned", Neuron(4), Efa(4, aligned_to="neurons"))
    run = run_stack([whole, cores, aligned], efa="component", efa_class="efa.example.com")
    classes = {m["metadata"]["name"] for m in sent(run, "DeviceClass")}
    assert classes == {CUSTOM, f"cores.{CUSTOM}"}
    by_name = {m["metadata"]["name"]: m for m in sent(run, "ResourceClaimTemplate")}
    assert [c for _, c in device_class_refs(by_name["whole"])] == [CUSTOM]
    assert [c for _, c in device_class_refs(by_name["cores"])] == [f"cores.{CUSTOM}"]
    assert sorted(c for _, c in device_class_refs(by_name["aligned"])) == ["efa.example.com", CUSTOM]
    # Not only the class: the selectors read the custom driver's attributes.
    (neurons, _) = by_name["aligned"]["spec"]["spec"]["devices"]["requests"]
    assert neurons["exactly"]["selectors"][0]["cel"]["expression"].startswith(f"device.attributes['{CUSTOM}']")
    assert "neuron.aws.com" not in str(by_name["aligned"])
    deployed = run.result.templates[0]
    assert isinstance(deployed, ClaimTemplate) and deployed.drivers.neuron_driver == CUSTOM
    assert whole.drivers.neuron_driver == "neuron.aws.com"  # the caller's object is unchanged


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_neuron_cores_are_refused_where_the_minor_has_no_core_class(version: str) -> None:
    with pytest.raises(SettingError) as err:
        run_stack([ClaimTemplate("whole", Neuron(1)), ClaimTemplate("cores", NeuronCores(2))], version=version)
    assert err.value.field == "claim template default/cores request cores deviceClassName"
    assert err.value.value == f"cores.{CUSTOM}"
    assert f"({CUSTOM})" in err.value.allowed and "1.36 or newer" in err.value.allowed
    assert f"runs {version}" in err.value.allowed


def test_a_template_with_its_own_names_must_name_a_class_that_exists() -> None:
    own = ClaimTemplate("own", Neuron(1), drivers=Drivers())  # explicitly the default names: they stand
    with pytest.raises(SettingError) as err:
        run_stack([own])
    assert err.value.value == "neuron.aws.com" and err.value.field.startswith("claim template default/own request")
    assert err.value.allowed.startswith(f"a DeviceClass this stack creates ({CUSTOM}, cores.{CUSTOM})")
    run_stack([own], driver_name="neuron.aws.com")  # the classes exist: fine


def test_a_raw_manifest_naming_a_missing_class_is_refused() -> None:
    class Raw:
        name, namespace = "raw", "default"

        def to_manifest(self) -> dict[str, Any]:
            manifest = ClaimTemplate("raw", Neuron(1)).to_manifest()
            manifest["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.example.com"
            return manifest

    with pytest.raises(SettingError) as err:
        run_stack([Raw()], driver_name="neuron.aws.com")
    assert err.value.value == "gpu.example.com" and "neuron.aws.com, neuroncore.aws.com" in err.value.allowed


def test_the_default_stack_with_a_custom_driver_name_names_only_classes_it_creates() -> None:
    run = plan({"neuron-dra:driverName": CUSTOM, "neuron-dra:driverImage": IMAGE})
    manifests = kubernetes_manifests(run)
    classes = {m["metadata"]["name"] for m in manifests if m["kind"] == "DeviceClass"}
    templates = [m for m in manifests if m["kind"] == "ResourceClaimTemplate"]
    assert CUSTOM in classes and len(templates) >= 8
    named = {c for m in templates for _, c in device_class_refs(m)}
    assert CUSTOM in named and named <= classes | {"efa.networking.k8s.aws"}
    releases = [r.plain_inputs for r in run.of_type("kubernetes:helm.sh/v3:Release")]
    if "efa.networking.k8s.aws" in named:  # the EFA class is the aws-dranet release's own
        assert any(r["values"]["deviceClass"]["name"] == "efa.networking.k8s.aws" for r in releases)
