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
from neuron_dra.components import plan, provider
from neuron_dra.components.mocks import PlanMocks, run_offline

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
    assert set(resources) == {f"neuron-dra:index:{c}" for c in (
        "TrainiumCluster", "TrainiumNodeGroup", "TrainiumKarpenter", "TrainiumNodePool", "NeuronDraDriver",
        "ClaimTemplates")}
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


def test_the_schema_lists_node_groups_karpenter_and_pools_placed_by_the_clusters_outputs() -> None:
    resources = schema()["resources"]
    group = resources["neuron-dra:index:TrainiumNodeGroup"]
    assert set(group["requiredInputs"]) == {"clusterName", "vpcId", "clusterSecurityGroupId", "kubernetesVersion"}
    assert {"instanceType", "desiredSize", "candidateSubnetIds", "availabilityZones", "capacityReservationId",
            "lnc", "efaInterfaceType", "installCoredns"} <= set(group["inputProperties"])
    assert "cluster" not in group["inputProperties"]  # the object cannot cross (docs/components.md)
    assert group["inputProperties"]["desiredSize"]["type"] == "integer"
    assert {"checkTarget", "nodeGroupArn", "roleArn", "subnetIds", "launchTemplateId"} <= set(group["required"])
    assert "TrainiumCluster's clusterSecurityGroupId" in group["inputProperties"]["clusterSecurityGroupId"][
        "description"]  # each input says which output feeds it
    karpenter = resources["neuron-dra:index:TrainiumKarpenter"]
    assert set(karpenter["requiredInputs"]) == {"clusterName", "subnetIds", "kubernetesVersion"}
    assert {"nodeRoleName", "nodeRoleArn", "controllerRoleArn", "queueName", "chartVersion"} == set(
        karpenter["properties"])
    pool = resources["neuron-dra:index:TrainiumNodePool"]
    assert set(pool["requiredInputs"]) == {"nodeRoleName", "subnetIds", "securityGroupIds"}
    assert {"instanceTypes", "replicas", "capacityReservationId", "kubeconfig"} <= set(pool["inputProperties"])
    assert {"checkTargets", "nodeLimit", "efaCount"} <= set(pool["properties"])
    assert "efaCount" not in pool["required"]


def _cluster_then(build: Any) -> Any:
    """A program as a YAML one composes it: the cluster adapter, then `build(cluster)` wiring its outputs (Outputs,
    as the engine hands them on) into the next adapter."""
    def program() -> Any:
        c = provider.TrainiumCluster("c", {"cluster_name": "team-a", "kubernetes_version": "1.36",
                                           "availability_zones": ["us-east-2a", "us-east-2b"]})
        return c, build(c)
    return program


def adapter(run: Any, component: str) -> Any:
    """The adapter of `component` (the parent of the Python component of the same type token)."""
    found = run.of_type(f"neuron-dra:index:{component}")
    (outer,) = [r for r in found if any(inner.parent == r.urn for inner in found)]
    return outer


def coredns_of(run: Any) -> Any:
    (addon,) = [a for a in run.of_type("aws:eks/addon:Addon") if a.plain_inputs["addonName"] == "coredns"]
    return addon


def cluster_security_group(run: Any) -> str:
    """The cluster security group id the mocked EKS cluster reports (PlanMocks)."""
    from neuron_dra.components.mocks import _hex

    return f"sg-{_hex(run.one('eks:index:Cluster').plain_inputs['name'] + 'cluster')}"


def test_the_node_group_adapter_places_the_group_by_the_clusters_outputs() -> None:
    def build(c: provider.TrainiumCluster) -> provider.TrainiumNodeGroup:
        wire: Any = {  # numbers as the host hands them on: doubles
            "cluster_name": c.cluster_name, "vpc_id": c.vpc_id,
            "cluster_security_group_id": c.cluster_security_group_id, "kubernetes_version": "1.36",
            "candidate_subnet_ids": c.private_subnet_ids, "availability_zones": ["us-east-2b"],
            "instance_type": "trn2.48xlarge", "desired_size": 2.0, "max_size": 4.0, "lnc": 1.0,
            "install_coredns": True}
        return provider.TrainiumNodeGroup("trn2", wire, pulumi.ResourceOptions(depends_on=[c]))

    mocks = PlanMocks()
    run = run_offline(_cluster_then(build), exports=lambda r: outputs(r[1], ["name", "check_target", "subnet_ids",
                                                                             "lnc"]), mocks=mocks)
    cluster = run.one("eks:index:Cluster").plain_inputs
    group = run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs
    assert group["clusterName"] == cluster["name"] == "team-a"
    assert group["amiType"] == "AL2023_x86_64_NEURON" and group["instanceTypes"] == ["trn2.48xlarge"]
    assert group["scalingConfig"] == {"desiredSize": 2, "minSize": 0, "maxSize": 4}
    assert group["version"] == "1.36"
    assert group["labels"]["neuron-dra/lnc"] == "1"
    assert group["taints"] == [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NO_SCHEDULE"}]
    # An EFA group: one subnet, the cluster's private subnet in its AZ, chosen from the cluster's outputs.
    (subnet,) = group["subnetIds"]
    assert mocks.subnet_zones[subnet] == "us-east-2b"
    assert run.exports["subnet_ids"] == [subnet]
    template = run.one("aws:ec2/launchTemplate:LaunchTemplate").plain_inputs
    interfaces = template["networkInterfaces"]  # every EFA interface has the cluster's security group first
    assert len(interfaces) == 16
    assert {i["securityGroups"][0] for i in interfaces} == {cluster_security_group(run)}
    assert template["metadataOptions"]["httpTokens"] == "required"
    # dependsOn the cluster reaches the EKS node group: the VPC CNI's identity exists before its nodes.
    association = next(r for r in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                       if r.plain_inputs["serviceAccount"] == "aws-node")
    assert association.urn in run.one("aws:eks/nodeGroup:NodeGroup").dependencies
    addon = coredns_of(run)
    assert addon.plain_inputs["clusterName"] == "team-a"
    assert run.one("aws:eks/nodeGroup:NodeGroup").urn in addon.dependencies  # after the group's nodes
    assert run.exports == {"name": "trn2", "check_target": "trn2.48xlarge:lnc=1", "subnet_ids": [subnet],
                           "lnc": 1}


def test_the_node_group_adapter_refuses_what_the_python_args_refuse_naming_it() -> None:
    base: dict[str, Any] = {"cluster_name": "c1", "vpc_id": "vpc-0123456789abcdef0",
                            "cluster_security_group_id": "sg-0cluster0000000000", "kubernetes_version": "1.36",
                            "candidate_subnet_ids": ["subnet-0000000000000000a"],
                            "availability_zones": ["us-east-2a"]}
    with pytest.raises(ValueError, match=r"instance_type|instanceType"):
        run_offline(lambda: provider.TrainiumNodeGroup("g", {**base, "instance_type": "trn2.48xlarg"}))  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="candidate_subnet_ids"):
        run_offline(lambda: provider.TrainiumNodeGroup("g", {**base, "candidate_subnet_ids": []}))  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="imds_hop_limit"):
        run_offline(lambda: provider.TrainiumNodeGroup("g", {**base, "imds_hop_limit": 1.5}))  # type: ignore[typeddict-item]


def test_karpenter_and_a_pool_from_the_outputs_of_the_cluster_and_of_karpenter() -> None:
    def build(c: provider.TrainiumCluster) -> Any:
        k = provider.TrainiumKarpenter("karpenter", {
            "cluster_name": c.cluster_name, "subnet_ids": c.private_subnet_ids, "kubernetes_version": "1.36",
            "kubeconfig": c.kubeconfig, "install_coredns": True})
        wire: Any = {
            "node_role_name": k.node_role_name, "subnet_ids": c.private_subnet_ids,
            "security_group_ids": c.cluster_security_group_id.apply(lambda sg: [sg]),
            "instance_types": ["trn2.48xlarge"], "replicas": 2.0, "capacity_reservation_id": "cr-0123456789abcdef0",
            "availability_zone": "us-east-2a",
            "kubeconfig": c.kubeconfig}
        pool = provider.TrainiumNodePool("reserved", wire, pulumi.ResourceOptions(depends_on=[k]))
        return k, pool

    run = run_offline(_cluster_then(build), exports=lambda r: {
        **outputs(r[1][0], ["node_role_name", "chart_version"]),
        **outputs(r[1][1], ["name", "check_targets", "node_limit", "efa_count"])})
    role = next(r for r in run.of_type("aws:iam/role:Role") if r.name == "karpenter-node-role")
    access = run.one("aws:eks/accessEntry:AccessEntry").plain_inputs
    assert access["clusterName"] == "team-a" and access["type"] == "EC2_LINUX"
    system = run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs
    assert system["clusterName"] == "team-a" and system["version"] == "1.36"
    assert len(system["subnetIds"]) == 2  # the cluster's private subnets, one an AZ
    release = run.one("kubernetes:helm.sh/v3:Release").plain_inputs
    assert release["values"]["settings"]["clusterName"] == "team-a"
    (node_class,) = [m for m in plan.kubernetes_manifests(run) if m["kind"] == "EC2NodeClass"]
    assert node_class["spec"]["role"] == run.exports["node_role_name"]
    assert node_class["spec"]["subnetSelectorTerms"] == [{"id": s} for s in system["subnetIds"]]
    assert node_class["spec"]["securityGroupSelectorTerms"] == [{"id": cluster_security_group(run)}]
    assert node_class["spec"]["capacityReservationSelectorTerms"] == [{"id": "cr-0123456789abcdef0"}]
    (node_pool,) = [m for m in plan.kubernetes_manifests(run) if m["kind"] == "NodePool"]
    assert node_pool["spec"]["replicas"] == 2
    pool_resource = next(r for r in run.of_type("kubernetes:karpenter.sh/v1:NodePool"))
    # The pool's Kubernetes objects go through the kubeconfig's provider, and wait for Karpenter (its CRDs).
    assert "reserved-k8s" in pool_resource.provider
    chart = run.one("kubernetes:helm.sh/v3:Release").urn
    assert chart in pool_resource.dependencies
    assert chart in next(iter(run.of_type("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"))).dependencies
    assert run.one("aws:eks/nodeGroup:NodeGroup").urn in coredns_of(run).dependencies
    assert role.plain_inputs["assumeRolePolicy"]
    assert run.exports == {"node_role_name": run.exports["node_role_name"], "chart_version": "1.15.0",
                           "name": "reserved", "check_targets": ["trn2.48xlarge"], "node_limit": 2,
                           "efa_count": 16}
