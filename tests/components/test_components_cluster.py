"""TrainiumCluster under Pulumi mocks: the EKS control plane, add-ons, VPC and Kubernetes provider."""

from __future__ import annotations

import json
from typing import Any

import pytest

from neuron_dra.components.cluster import ADMIN_POLICY_ARN, TrainiumCluster, TrainiumClusterArgs
from neuron_dra.components.mocks import ACCOUNT, OfflineRun, _hex, run_offline
from neuron_dra.components.settings import SettingError


def run_cluster(args: TrainiumClusterArgs, coredns: bool = True) -> OfflineRun[TrainiumCluster]:
    def program() -> TrainiumCluster:
        cluster = TrainiumCluster("c", args)
        if coredns:
            cluster.install_coredns(after=[])
        return cluster

    return run_offline(program, exports=lambda c: {"kubeconfig": c.kubeconfig, "sg": c.cluster_security_group_id,
                                                   "subnets": c.private_subnet_ids, "vpc": c.vpc_id})


def test_new_vpc_cluster() -> None:
    run = run_cluster(TrainiumClusterArgs(
        cluster_name="trn", availability_zones=("us-east-2c", "us-east-2a"),
        admin_principal_arns=("arn:aws:iam::123456789012:role/admins",), vpc_cni_version="v1.19.0-eksbuild.1",
        kube_proxy_version="v1.34.0-eksbuild.2", coredns_version="v1.12.3-eksbuild.1",
        pod_identity_agent_version="v1.3.8-eksbuild.2", efa_only_interfaces=True,
        public_access_cidrs=("203.0.113.0/24",)))
    eks = run.one("eks:index:Cluster").plain_inputs
    assert eks["name"] == "trn" and eks["version"] == "1.36"
    assert eks["authenticationMode"] == "API"
    assert eks["createOidcProvider"] is True
    assert eks["skipDefaultNodeGroup"] is True and eks["skipDefaultSecurityGroups"] is True
    assert eks["endpointPrivateAccess"] is True and eks["publicAccessCidrs"] == ["203.0.113.0/24"]
    assert eks["enabledClusterLogTypes"] == ["api", "audit", "authenticator"]
    assert eks["vpcCniOptions"]["addonVersion"] == "v1.19.0-eksbuild.1"
    assert eks["kubeProxyAddonOptions"]["enabled"] is True
    assert eks["kubeProxyAddonOptions"]["version"] == "v1.34.0-eksbuild.2"
    # pulumi-eks would create CoreDNS before any node exists (DEGRADED, then a create timeout).
    assert eks["corednsAddonOptions"]["enabled"] is False
    assert eks["accessEntries"] == {"admin-0": {
        "principalArn": "arn:aws:iam::123456789012:role/admins", "type": "STANDARD",
        "accessPolicies": {"cluster-admin": {"policyArn": ADMIN_POLICY_ARN, "accessScope": {"type": "cluster"}}}}}
    vpc = run.one("awsx:ec2:Vpc").plain_inputs
    assert vpc["availabilityZoneNames"] == ["us-east-2c", "us-east-2a"]
    assert vpc["natGateways"] == {"strategy": "Single"}
    assert {s["type"] for s in vpc["subnetSpecs"]} == {"Private", "Public"}
    assert eks["privateSubnetIds"] == run.exports["subnets"] and len(eks["privateSubnetIds"]) == 2
    assert eks["vpcId"] == run.exports["vpc"]

    addons = {r.plain_inputs["addonName"]: r for r in run.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {"eks-pod-identity-agent", "coredns"}
    assert addons["eks-pod-identity-agent"].plain_inputs["addonVersion"] == "v1.3.8-eksbuild.2"
    coredns = addons["coredns"].plain_inputs
    assert coredns["clusterName"] == "trn" and coredns["addonVersion"] == "v1.12.3-eksbuild.1"
    tolerations = json.loads(coredns["configurationValues"])["tolerations"]
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    eks_urn = run.one("eks:index:Cluster").urn
    assert eks_urn in addons["coredns"].dependencies and eks_urn in addons["eks-pod-identity-agent"].dependencies

    # The VPC CNI's own identity: a role only EKS Pod Identity can assume, with the CNI policy, associated with
    # kube-system/aws-node once the Pod Identity agent exists.
    (role,) = [r for r in run.of_type("aws:iam/role:Role") if r.name == "c-vpc-cni"]
    assert json.loads(role.plain_inputs["assumeRolePolicy"]) == {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
        "Action": ["sts:AssumeRole", "sts:TagSession"]}]}
    (attachment,) = run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    role_name, role_arn = f"c-vpc-cni-{_hex('c-vpc-cni', 7)}", f"arn:aws:iam:us-east-2:{ACCOUNT}:c-vpc-cni"
    assert attachment.plain_inputs == {"role": role_name,
                                       "policyArn": "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"}
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert {k: v for k, v in association.plain_inputs.items() if k != "tags"} == {
        "clusterName": "trn", "namespace": "kube-system", "serviceAccount": "aws-node",
        "roleArn": role_arn}
    assert addons["eks-pod-identity-agent"].urn in association.dependencies
    assert attachment.urn in association.dependencies

    provider = run.one("pulumi:providers:kubernetes").plain_inputs
    assert json.loads(provider["kubeconfig"]) == json.loads(run.exports["kubeconfig"])
    assert json.loads(provider["kubeconfig"])["clusters"][0]["name"] == "trn"
    assert run.exports["sg"].startswith("sg-")


def test_given_vpc_creates_no_vpc() -> None:
    run = run_cluster(TrainiumClusterArgs(
        cluster_name="trn", vpc_id="vpc-0123456789abcdef0",
        private_subnet_ids=("subnet-0000000000000000a", "subnet-0000000000000000b"),
        public_subnet_ids=("subnet-0000000000000000c",)), coredns=False)
    assert run.of_type("awsx:ec2:Vpc") == []
    eks = run.one("eks:index:Cluster").plain_inputs
    assert eks["vpcId"] == "vpc-0123456789abcdef0"
    assert eks["privateSubnetIds"] == ["subnet-0000000000000000a", "subnet-0000000000000000b"]
    assert eks["publicSubnetIds"] == ["subnet-0000000000000000c"]
    assert "accessEntries" not in eks or eks["accessEntries"] == {}
    assert [r.plain_inputs["addonName"] for r in run.of_type("aws:eks/addon:Addon")] == ["eks-pod-identity-agent"]


def test_vpc_cni_on_the_node_role_creates_no_identity() -> None:
    run = run_cluster(TrainiumClusterArgs(cluster_name="trn", vpc_cni_identity="nodeRole"), coredns=False)
    assert run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation") == []
    assert run.of_type("aws:iam/role:Role") == []


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"])
def test_the_versions_eks_offers_are_accepted(version: str) -> None:
    assert TrainiumClusterArgs(kubernetes_version=version).kubernetes_version == version


@pytest.mark.parametrize(("kwargs", "setting", "fragment"), [
    ({"kubernetes_version": "1.33"}, "kubernetes_version", "1.34 to 1.36"),
    ({"kubernetes_version": "1.9"}, "kubernetes_version", "1.34 to 1.36"),
    ({"kubernetes_version": "1.38"}, "kubernetes_version", "1.34 to 1.36"),
    ({"kubernetes_version": "latest"}, "kubernetes_version", "such as 1.36"),
    ({"vpc_cni_identity": "irsa"}, "vpc_cni_identity", "podIdentity or nodeRole"),
    ({"vpc_cni_version": "v1.18.3-eksbuild.1", "efa_only_interfaces": True}, "vpc_cni_version", "v1.18.4"),
    ({"vpc_cni_version": "1.18"}, "vpc_cni_version", "add-on version"),
    ({"vpc_id": "vpc-0123456789abcdef0", "private_subnet_ids": ("subnet-0000000000000000a",)},
     "private_subnet_ids", "two subnets"),
    ({"private_subnet_ids": ("subnet-0000000000000000a", "subnet-0000000000000000b")}, "private_subnet_ids",
     "unless vpc_id"),
    ({"nat_gateways": "Many"}, "nat_gateways", "Single or OnePerAz"),
])
def test_bad_cluster_args_name_the_argument(kwargs: dict[str, Any], setting: str, fragment: str) -> None:
    with pytest.raises(SettingError) as err:
        TrainiumClusterArgs(**kwargs)
    assert err.value.setting == f"TrainiumClusterArgs.{setting}"
    assert fragment in str(err.value)


def test_old_vpc_cni_is_fine_without_efa_only_interfaces() -> None:
    assert TrainiumClusterArgs(vpc_cni_version="v1.16.0-eksbuild.1").vpc_cni_version


def test_coredns_is_installed_once() -> None:
    def program() -> None:
        cluster = TrainiumCluster("c", TrainiumClusterArgs())
        cluster.install_coredns(after=[])
        cluster.install_coredns(after=[])

    with pytest.raises(RuntimeError, match="already installed"):
        run_offline(program)


def test_network_policy_enforcement_is_on_by_default() -> None:
    # Without an enforcing CNI every NetworkPolicy (the driver's included) is accepted and ignored.
    on = run_cluster(TrainiumClusterArgs(), coredns=False).one("eks:index:Cluster").plain_inputs
    assert on["vpcCniOptions"]["enableNetworkPolicy"] is True
    off = run_cluster(TrainiumClusterArgs(network_policy=False), coredns=False).one("eks:index:Cluster")
    assert off.plain_inputs["vpcCniOptions"]["enableNetworkPolicy"] is False


def test_network_policy_needs_vpc_cni_1_14() -> None:
    with pytest.raises(SettingError) as err:
        TrainiumClusterArgs(vpc_cni_version="v1.13.4-eksbuild.1")
    assert err.value.setting == "TrainiumClusterArgs.vpc_cni_version" and "v1.14.0" in str(err.value)
    assert TrainiumClusterArgs(vpc_cni_version="v1.13.4-eksbuild.1", network_policy=False).network_policy is False


def test_the_cluster_name_defaults_to_the_resource_name() -> None:
    run = run_offline(lambda: TrainiumCluster("team-a", vpc_cni_identity="nodeRole"),
                      exports=lambda c: {"name": c.cluster_name})
    assert run.one("eks:index:Cluster").plain_inputs["name"] == "team-a" and run.exports["name"] == "team-a"


def test_args_and_keyword_arguments_are_exclusive() -> None:
    with pytest.raises(TypeError, match="either args or keyword"):
        run_offline(lambda: TrainiumCluster("c", TrainiumClusterArgs(), vpc_cni_identity="nodeRole"))


def test_network_inputs_from_another_stack_as_outputs() -> None:
    """VPC, subnets, admin ARNs, add-on versions and the name as Outputs (what a StackReference gives)."""
    import pulumi

    def program() -> TrainiumCluster:
        out = pulumi.Output.from_input
        return TrainiumCluster("c", TrainiumClusterArgs(
            cluster_name=out("shared-trn"), vpc_id=out("vpc-0123456789abcdef0"),
            private_subnet_ids=out(["subnet-0000000000000000a", "subnet-0000000000000000b"]),
            public_subnet_ids=[out("subnet-0000000000000000c")],
            admin_principal_arns=out(["arn:aws:iam::123456789012:role/admins"]),
            vpc_cni_version=out("v1.20.4-eksbuild.1"), coredns_version=out("v1.12.3-eksbuild.1")))

    run = run_offline(program, exports=lambda c: {"subnets": c.private_subnet_ids, "vpc": c.vpc_id,
                                                   "name": c.cluster_name})
    eks = run.one("eks:index:Cluster").plain_inputs
    assert eks["name"] == "shared-trn" and eks["vpcId"] == "vpc-0123456789abcdef0"
    assert eks["privateSubnetIds"] == ["subnet-0000000000000000a", "subnet-0000000000000000b"]
    assert eks["publicSubnetIds"] == ["subnet-0000000000000000c"]
    assert eks["accessEntries"]["admin-0"]["principalArn"] == "arn:aws:iam::123456789012:role/admins"
    assert eks["vpcCniOptions"]["addonVersion"] == "v1.20.4-eksbuild.1"
    assert run.exports == {"subnets": eks["privateSubnetIds"], "vpc": "vpc-0123456789abcdef0", "name": "shared-trn"}
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation").plain_inputs
    assert association["clusterName"] == "shared-trn"


@pytest.mark.parametrize(("kwargs", "setting", "fragment"), [
    ({"vpc_id": "vpc-0123456789abcdef0", "private_subnet_ids": ["subnet-0000000000000000a"]},
     "private_subnet_ids", "two subnets"),
    ({"vpc_id": "vpc-0123456789abcdef0", "private_subnet_ids": ["subnet-0000000000000000a", "sn-1"]},
     "private_subnet_ids", "subnet ids such as"),
    ({"vpc_id": "vpc-x", "private_subnet_ids": ["subnet-0000000000000000a", "subnet-0000000000000000b"]},
     "vpc_id", "a VPC id"),
    ({"admin_principal_arns": ["admins"]}, "admin_principal_arns", "IAM role or user ARNs"),
    ({"vpc_cni_version": "1.18"}, "vpc_cni_version", "add-on version"),
    ({"cluster_name": "-bad"}, "cluster_name", "starting with a letter or digit"),
])
def test_a_bad_output_fails_the_run_with_the_known_value_message(
        kwargs: dict[str, Any], setting: str, fragment: str) -> None:
    """The same check for a value known at construction and one that resolves later (inside apply)."""
    import pulumi

    with pytest.raises(SettingError) as known:
        TrainiumClusterArgs(**kwargs)

    def program() -> TrainiumCluster:
        outputs: dict[str, Any] = {k: pulumi.Output.from_input(v) for k, v in kwargs.items()}
        return TrainiumCluster("c", TrainiumClusterArgs(**outputs))

    with pytest.raises(Exception) as late:  # Pulumi wraps errors raised in apply
        run_offline(program)
    ours = late.value
    while ours is not None and not isinstance(ours, SettingError):
        ours = ours.__cause__ or ours.__context__  # type: ignore[assignment]
    assert isinstance(ours, SettingError), late.value
    assert str(ours) == str(known.value)
    assert ours.setting == f"TrainiumClusterArgs.{setting}" and fragment in str(ours)
