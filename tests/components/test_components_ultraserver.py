"""UltraServerGroups under Pulumi mocks: the group controller and its DeviceClass where the stack holds UltraServer
types (a trn2u node group from a Capacity Block, a static Karpenter pool, an existing cluster that names them), from
the driver's image; nothing for a trn2-only stack."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from neuron_dra.components import UltraServerGroups, UltraServerGroupsArgs, plan
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.settings import SettingError
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.deploy import ultraserver as controller
from neuron_dra.driver.model.k8s_names import neuron_toleration
from tests.components.test_components_stack import KUBECONFIG, project_defaults, run_stack
from tests.support import kubeschema

IMAGE = "example.com/neuron-dra-driver@sha256:" + "a" * 64
RESERVATION = "cr-0123456789abcdef0"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CLASS = "kubernetes:resource.k8s.io/v1:DeviceClass"
# Two policies and bindings: the group slices only, and the members' labels only on Nodes.
CONTROLLER_KINDS = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding", "DeviceClass", "Deployment"]


def stack(**values: Any) -> dict[str, Any]:
    return {**project_defaults(), "driverImage": IMAGE, "claimTemplatesModule": "", **values}


def trn2u_group(**kwargs: Any) -> dict[str, Any]:
    return {"name": "ultra", "instanceType": "trn2u.48xlarge", "desiredSize": 4, "minSize": 0, "maxSize": 4,
            "capacityReservationId": RESERVATION, "availabilityZone": "us-east-2b", **kwargs}


def controller_objects(run: OfflineRun[Any]) -> list[dict[str, Any]]:
    return [m for m in plan.kubernetes_manifests(run)
            if m["metadata"].get("labels", {}).get("app.kubernetes.io/component") == controller.COMPONENT]


def test_a_trn2u_node_group_gets_the_controller_its_rbac_and_the_group_class_from_the_drivers_image() -> None:
    run = run_stack(stack(nodeGroups=[trn2u_group()]))
    objects = controller_objects(run)
    assert sorted(m["kind"] for m in objects) == sorted(CONTROLLER_KINDS)
    for m in objects:
        kubeschema.validate(m, "1.36", strict=True)
    (deployment,) = [m for m in objects if m["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (daemonset,) = [r.plain_inputs for r in run.of_type("kubernetes:apps/v1:DaemonSet")
                    if r.plain_inputs["metadata"]["name"] == "neuron-dra-driver-kubelet-plugin"]  # not neuron-monitor
    assert pod["containers"][0]["image"] == daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert pod["containers"][0]["command"][:3] == ["python", "-m", "neuron_dra.driver.groups"]
    assert "--driver-name=neuron.aws.com" in pod["containers"][0]["command"]
    assert pod["tolerations"].count(neuron_toleration()) == 1  # the stack's only nodes may be Neuron nodes
    assert deployment["metadata"]["namespace"] == "neuron-dra-driver"
    assert deployment["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    (group_class,) = [m for m in objects if m["kind"] == "DeviceClass"]
    assert group_class["metadata"]["name"] == run.exports["ultraserverDeviceClass"] == "ultraserver.neuron.aws.com"
    # RBAC as the deploy module renders it; the Deployment waits for it, and namespaced objects for the Namespace.
    (role,) = [m for m in objects if m["kind"] == "ClusterRole"]
    assert role["rules"] == [dict(r) for r in controller.CLUSTER_RULES]
    by_urn = run.by_urn()
    deployment_resource = run.one(DEPLOYMENT)
    waits = {by_urn[u].type.rsplit(":", 1)[1] for u in deployment_resource.dependencies}
    assert {"ServiceAccount", "ClusterRoleBinding", "RoleBinding", "ValidatingAdmissionPolicyBinding",
            "DeviceClass", "Namespace"} <= waits
    component = run.one("neuron-dra:index:UltraServerGroups")
    assert deployment_resource.parent == component.urn
    provider = run.one("pulumi:providers:kubernetes")
    assert deployment_resource.provider.startswith(provider.urn)


def test_a_trn2_only_stack_gets_no_controller() -> None:
    run = run_stack(stack(nodeGroups=[{"name": "trn2", "instanceType": "trn2.48xlarge"}]))
    assert not controller_objects(run)
    assert not run.of_type("neuron-dra:index:UltraServerGroups")
    classes = [m["metadata"]["name"] for m in plan.kubernetes_manifests(run) if m["kind"] == "DeviceClass"]
    assert "neuron.aws.com" in classes and not [c for c in classes if c.startswith("ultraserver.")]
    assert run.exports["ultraserverDeviceClass"] is None


def test_a_static_karpenter_pool_of_ultraservers_gets_the_controller() -> None:
    pools = [{"name": "ultra", "instanceTypes": ["trn2u.48xlarge"], "replicas": 4,
              "capacityReservationId": RESERVATION, "availabilityZone": "us-east-2b"}]
    run = run_stack(stack(nodeGroups=[], nodePools=pools))
    assert len(run.of_type(DEPLOYMENT)) == 1
    assert run.exports["ultraserverDeviceClass"] == "ultraserver.neuron.aws.com"


@pytest.mark.parametrize(("types", "created"), [(["trn2u.48xlarge", "trn2.48xlarge"], True),
                                                (["trn2.48xlarge"], False), ([], False)])
def test_an_existing_cluster_gets_it_when_its_instance_types_name_an_ultraserver_type(
        types: list[str], created: bool) -> None:
    run = run_stack(stack(kubeconfig=KUBECONFIG, clusterInstanceTypes=types, efaDriver="external"))
    assert bool(run.of_type(DEPLOYMENT)) is created


def test_plan_table_shows_the_controller_and_the_class() -> None:
    out = plan.render_table(plan.plan(plan_config(nodeGroups=[trn2u_group()])))
    assert "UltraServerGroups" in out
    assert "neuron-dra-driver/neuron-dra-ultraserver" in out
    assert "ultraserver.neuron.aws.com" in out


def plan_config(**values: Any) -> dict[str, str]:
    from tests.components.test_components_stack import engine_config

    return engine_config({"driverImage": IMAGE, "claimTemplatesModule": "", **values})


def run_component(driver_options: DriverDeployOptions | None = None, **kwargs: Any
                  ) -> OfflineRun[UltraServerGroups]:
    def program() -> UltraServerGroups:
        provider = pulumi.ResourceOptions(provider=k8s.Provider("target", kubeconfig="{}"))
        driver = NeuronDraDriver("driver", NeuronDraDriverArgs(options=driver_options or DriverDeployOptions(),
                                                               image=IMAGE), opts=provider)
        return UltraServerGroups("ultra", driver=driver, opts=provider, **kwargs)

    return run_offline(program)


def test_the_component_follows_the_drivers_name_namespace_and_options() -> None:
    run = run_component(DriverDeployOptions(driver_name="neuron.example.com", namespace="ml-dra"),
                        taint_effect="NoExecute", rollout_timeout_seconds=120, shared_counters="auto")
    assert run.result.device_class_name == "ultraserver.neuron.example.com"
    deployment = run.one(DEPLOYMENT)
    spec = deployment.plain_inputs
    assert spec["metadata"]["namespace"] == "ml-dra" and "annotations" not in spec["metadata"]
    command = spec["spec"]["template"]["spec"]["containers"][0]["command"]
    assert {"--driver-name=neuron.example.com", "--namespace=ml-dra", "--taint-effect=NoExecute",
            "--shared-counters=auto"} <= set(command)
    default = run_component().one(DEPLOYMENT).plain_inputs["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--shared-counters=off" in default  # safe at 1,000 nodes (docs/ultraserver.md §2a)
    policies = [m for m in plan.kubernetes_manifests(run) if m["kind"] == "ValidatingAdmissionPolicy"
                and m["metadata"]["name"].startswith(controller.DEFAULT_NAME)]
    assert len(policies) == 2  # the group slices', and the Nodes' (the driver's own label keys)
    for policy in policies:
        assert "system:serviceaccount:ml-dra:neuron-dra-ultraserver" in str(policy["spec"]["matchConditions"])
    (nodes,) = [p for p in policies if p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]]
    assert '"neuron.example.com/ultraserver"' in nodes["spec"]["validations"][0]["expression"]


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    ({"taint_effect": "Sometimes"}, "UltraServerGroupsArgs.taint_effect", "NoSchedule"),
    ({"resync_seconds": 0}, "UltraServerGroupsArgs.resync_seconds", "1 to 3600"),
    ({"shared_counters": "on"}, "UltraServerGroupsArgs.shared_counters", "auto, off"),
    ({"name": "Not A Name"}, "UltraServerGroupsArgs.name", ""),
    ({"rollout_timeout_seconds": -1}, "UltraServerGroupsArgs.rollout_timeout_seconds", "0 (do not wait"),
])
def test_bad_args_name_the_field(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(SettingError) as e:
        run_component(**kwargs)
    assert e.value.field == field and allowed in e.value.allowed


def test_the_driver_must_be_a_driver_component() -> None:
    with pytest.raises(SettingError) as e:
        UltraServerGroupsArgs(driver="neuron.aws.com")  # type: ignore[arg-type]
    assert e.value.field == "UltraServerGroupsArgs.driver"


def test_the_driver_component_leaves_the_controller_to_ultraserver_groups() -> None:
    """deploy.manifests() renders the controller with ultraserver_groups (the Helm chart's value); the driver
    component refuses it, so a stack never creates the controller twice (UltraServerGroups creates it)."""
    with pytest.raises(SettingError) as e:
        NeuronDraDriverArgs(options=DriverDeployOptions(ultraserver_groups=True), image=IMAGE)
    assert e.value.field == "NeuronDraDriverArgs.options.ultraserver_groups" and "UltraServerGroups" in e.value.allowed
