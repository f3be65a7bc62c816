"""Two installations side by side: with another driverName, every cluster-scoped object the driver creates has
another name (derived from the driver name, or named by its own setting), so neither overwrites the other."""

from __future__ import annotations

from typing import Any

import pytest

from neuron_dra.claim_templates import Drivers
from neuron_dra.driver.deploy import (
    DEFAULT_NAMESPACE,
    DriverDeployOptions,
    admission,
    manifests,
    namespace_for,
    object_key,
)
from neuron_dra.driver.model.k8s_names import DEFAULT_CORE_DEVICE_CLASS

OTHER = "neuron.example.com"


def cluster_scoped(options: DriverDeployOptions) -> dict[str, dict[str, Any]]:
    return {object_key(m): m for m in manifests(options) if "namespace" not in m["metadata"]}


def all_keys(options: DriverDeployOptions) -> set[str]:
    return {object_key(m) for m in manifests(options)}


def test_another_driver_name_renames_every_cluster_scoped_object() -> None:
    default, other = DriverDeployOptions(), DriverDeployOptions(driver_name=OTHER)
    a, b = cluster_scoped(default), cluster_scoped(other)
    kinds = sorted(m["kind"] for m in b.values())
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "DeviceClass", "DeviceClass", "Namespace",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicyBinding"]
    assert not set(a) & set(b)
    assert not all_keys(default) & all_keys(other)  # namespaced objects live in another namespace
    assert {m["metadata"]["name"] for m in b.values() if m["kind"] == "DeviceClass"} == {OTHER, f"cores.{OTHER}"}
    assert other.namespace == "neuron-dra-neuron-example-com"
    # The binding grants the other installation's own ClusterRole to its own service account.
    binding = next(m for m in b.values() if m["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == other.cluster_role_name
    assert binding["subjects"][0]["namespace"] == other.namespace
    policy_bindings = {m["spec"]["policyName"] for m in b.values() if m["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policy_bindings == {other.admission_policy_name, admission.policy_name(other.namespace, OTHER)}


def test_the_default_driver_keeps_its_names_and_own_settings_win() -> None:
    default = DriverDeployOptions()
    assert default.namespace == DEFAULT_NAMESPACE and default.core_device_class_name == DEFAULT_CORE_DEVICE_CLASS
    named = DriverDeployOptions(driver_name=OTHER, namespace="team-a", core_device_class_name="team-a-cores")
    assert named.namespace == "team-a" and named.core_device_class_name == "team-a-cores"
    assert named.cluster_role_name == "team-a:neuron-dra-driver-sa"
    long_name = "neuron." + "a" * 40 + ".example.com"
    ns = namespace_for(long_name)
    assert len(ns) <= 63 and ns != namespace_for(long_name.replace("a", "b", 1))
    DriverDeployOptions(driver_name=long_name)  # a valid DNS label


def test_claim_templates_follow_the_driver_name() -> None:
    drivers, deployed = Drivers(neuron_driver=OTHER), DriverDeployOptions(driver_name=OTHER)
    assert drivers.neuron_class == deployed.device_class
    assert drivers.neuron_core_class == deployed.core_device_class_name
    assert Drivers(neuron_driver=OTHER, neuron_class="mine").neuron_class == "mine"


@pytest.mark.cluster
def test_two_installations_apply_side_by_side_on_a_real_apiserver(api: Any) -> None:
    """Both rendered sets are created on the local control plane: no create meets an existing object."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(api)
    for options in (DriverDeployOptions(image="r.example.com/d:1"),
                    DriverDeployOptions(image="r.example.com/d:1", driver_name=OTHER)):
        for m in manifests(options):
            resource = dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])
            kwargs = {"namespace": m["metadata"]["namespace"]} if resource.namespaced else {}
            resource.create(body=m, **kwargs)  # 409 AlreadyExists on any shared name
    classes = {c.metadata.name for c in dyn.resources.get(api_version="resource.k8s.io/v1",
                                                          kind="DeviceClass").get().items}
    assert {"neuron.aws.com", "neuroncore.aws.com", OTHER, f"cores.{OTHER}"} <= classes
    daemonsets = dyn.resources.get(api_version="apps/v1", kind="DaemonSet").get().items
    assert {d.metadata.namespace for d in daemonsets} >= {DEFAULT_NAMESPACE, "neuron-dra-neuron-example-com"}
