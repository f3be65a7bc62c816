"""The UltraServer group controller's objects: schema-valid, least privilege, named after the driver."""

from __future__ import annotations

import pytest

from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions, manifests
from neuron_dra.driver.deploy import ultraserver as deploy_us
from neuron_dra.driver.deploy.ultraserver import UltraServerControllerOptions
from neuron_dra.driver.model.k8s_names import neuron_toleration
from tests.support import kubeschema


def test_every_object_is_schema_valid_and_names_the_driver() -> None:
    options = UltraServerControllerOptions(driver_name="neuron.example.com", namespace="ops", image="r/i:1")
    objs = deploy_us.manifests(options)
    for obj in objs:
        kubeschema.validate(obj, "1.34", strict=True)
    kinds = [o["kind"] for o in objs]
    assert kinds[-1] == "Deployment" and "DeviceClass" in kinds
    by_kind = {o["kind"]: o for o in objs}
    assert by_kind["DeviceClass"]["metadata"]["name"] == "ultraserver.neuron.example.com"
    assert by_kind["ClusterRole"]["metadata"]["name"] == "neuron-dra-ultraserver-neuron.example.com"
    spec = by_kind["Deployment"]["spec"]
    assert spec["replicas"] == 1 and spec["template"]["spec"]["serviceAccountName"] == "neuron-dra-ultraserver"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"][:3] == ["python", "-m", "neuron_dra.driver.groups"]
    assert "--driver-name=neuron.example.com" in container["command"] and "--namespace=ops" in container["command"]
    assert "--shared-counters=off" in container["command"]  # the default: safe at 1,000 nodes (§2a)
    on = deploy_us.deployment(UltraServerControllerOptions(shared_counters="auto"))
    assert "--shared-counters=auto" in on["spec"]["template"]["spec"]["containers"][0]["command"]
    # rendered here, once: a cluster of Neuron nodes only (tainted) still runs it
    assert spec["template"]["spec"]["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                                       neuron_toleration()]


def test_rbac_grants_no_more_than_the_controller_calls() -> None:
    rules = deploy_us.cluster_role(UltraServerControllerOptions())["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("resource.k8s.io", "resourceslices", "update") in granted
    # patch only of nodes (their UltraServer labels; the node policy bounds it), nothing else patched
    assert {(g, r) for g, r, v in granted if v == "patch"} == {("", "nodes")}
    assert {v for _, r, v in granted if r == "nodes"} == {"list", "watch", "patch"}
    assert not any(v in ("deletecollection", "*") or r in ("nodes/status", "*") for _, r, v in granted)
    assert not any(r == "resourceclaims" and v != "list" for _, r, v in granted)
    assert not any(r in ("leases", "secrets", "pods") for _, r, _ in granted)  # leases: its namespace only
    role = deploy_us.lease_role(UltraServerControllerOptions())
    assert role["kind"] == "Role" and role["rules"][1]["resourceNames"] == ["neuron-dra-ultraserver"]


def test_the_admission_policy_keeps_the_controller_off_node_slices() -> None:
    policy = deploy_us.admission_policy(UltraServerControllerOptions())
    (validation,) = policy["spec"]["validations"]
    assert "!has(object.spec.nodeName)" in validation["expression"]
    assert "!has(oldObject.spec.nodeName)" in validation["expression"]
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(
        '"system:serviceaccount:neuron-dra-driver:neuron-dra-ultraserver"')


def test_the_node_policy_names_the_drivers_label_keys_and_is_deployed_with_the_controller() -> None:
    options = UltraServerControllerOptions(driver_name="neuron.example.com")
    objs = deploy_us.manifests(options)
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["spec"]["policyName"] for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(policies) == bindings == {options.cluster_name, f"{options.cluster_name}-nodes"}
    nodes = policies[f"{options.cluster_name}-nodes"]["spec"]
    assert nodes["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    (validation,) = nodes["validations"]
    # a custom driver name gives its own keys; the default's never appear
    assert '"neuron.example.com/ultraserver", "neuron.example.com/ultraserver-pair"' in validation["expression"]
    assert "neuron.aws.com" not in validation["expression"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"driver_name": "Not A Driver"}, "driver_name"), ({"namespace": "a_b"}, "namespace"),
    ({"image": "has space"}, "image"), ({"taint_effect": "Sometimes"}, "taint_effect"),
    ({"resync_seconds": 0}, "resync_seconds"), ({"shared_counters": "on"}, "shared_counters"),
])
def test_bad_options_are_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"UltraServerControllerOptions.{field}"):
        UltraServerControllerOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [
    DriverDeployOptions(ultraserver_groups=True),
    DriverDeployOptions(ultraserver_groups=True, driver_name="neuron.example.com", namespace="ops",
                        image="r/i:1", labels={"team": "ml"}, ultraserver_shared_counters="auto"),
], ids=["defaults", "custom"])
def test_deploy_manifests_render_the_controller_with_the_drivers_name_namespace_image_and_labels(
        options: DriverDeployOptions) -> None:
    """With ultraserver_groups, deploy.manifests() ends with this module's objects for the controller options
    built, checked, from the driver's (spec_for builds them unchecked: the driver's options checked each value)."""
    checked = UltraServerControllerOptions(driver_name=options.driver_name, namespace=options.namespace,
                                           image=options.image, labels=dict(options.labels),
                                           shared_counters=options.ultraserver_shared_counters)
    assert deploy_us.spec_for(options) == checked
    expected = deploy_us.manifests(checked)
    assert manifests(options)[-len(expected):] == expected
    assert manifests(options.replace(ultraserver_groups=False)) == manifests(options)[:-len(expected)]
    for obj in expected:
        kubeschema.validate(obj, "1.36", strict=True)
        assert obj["metadata"]["labels"].items() >= options.labels.items()
    (deployment,) = [o for o in expected if o["kind"] == "Deployment"]
    assert deployment["spec"]["selector"]["matchLabels"] == deploy_us.POD_LABELS  # labels never change a selector
    assert {f"--shared-counters={options.ultraserver_shared_counters}", f"--namespace={options.namespace}"} <= \
        set(deployment["spec"]["template"]["spec"]["containers"][0]["command"])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"service_account": deploy_us.DEFAULT_NAME}, "service_account"),
    ({"core_device_class_name": "ultraserver.neuron.aws.com"}, "core_device_class_name"),
    ({"device_class_name": "ultraserver.neuron.aws.com"}, "device_class_name"),
    ({"ultraserver_shared_counters": "on"}, "ultraserver_shared_counters"),
    ({"ultraserver_groups": "yes"}, "ultraserver_groups"),
])
def test_driver_options_refuse_a_controller_that_cannot_work_naming_the_field(kwargs: dict[str, object],
                                                                             field: str) -> None:
    with pytest.raises(DeployOptionError) as e:
        DriverDeployOptions(**{"ultraserver_groups": True, **kwargs})
    assert e.value.option == field


def test_labels_are_checked_when_given_directly() -> None:
    with pytest.raises(ValueError, match=r"UltraServerControllerOptions\.labels"):
        UltraServerControllerOptions(labels={"bad key!": "x"})
