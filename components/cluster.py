"""`TrainiumCluster`: an EKS control plane for Neuron node groups.

pulumi_eks.Cluster with a pinned Kubernetes version (1.34 to 1.37), API authentication with access entries,
an OIDC provider, no default node group and no pulumi-eks security groups (so `cluster_security_group_id` is
the EKS-created cluster security group that managed nodes use), the vpc-cni, kube-proxy and
eks-pod-identity-agent add-ons, and a Kubernetes provider from its kubeconfig. The VPC CNI (service account
kube-system/aws-node) gets its own IAM role with AmazonEKS_CNI_Policy through an EKS Pod Identity association
(`vpc_cni_identity="podIdentity"`, the default; docs/eks-trainium.md §5), so the node role does not need that
policy; node groups must be created after `node_group_dependencies` (pods get their credentials only if the
association exists when they are created). CoreDNS is created by `install_coredns()` once node groups exist:
an add-on without nodes stays DEGRADED and its creation times out (pulumi-eks creates it before any node group).
Its pods tolerate the Neuron taint, so a cluster whose only nodes are Neuron nodes still resolves names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_awsx as awsx
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from neuron_dra.components.settings import (
    DEFAULT_KUBERNETES_VERSION,
    MIN_VPC_CNI_FOR_EFA_ONLY,
    NAT_GATEWAY_STRATEGIES,
    VPC_CNI_IDENTITIES,
    SettingError,
    parse_addon_version,
    parse_kubernetes_version,
)
from neuron_dra.driver.model.k8s_names import neuron_toleration

ADMIN_POLICY_ARN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator")
CNI_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
VPC_CNI_SERVICE_ACCOUNT = ("kube-system", "aws-node")  # the vpc-cni add-on's service account
# EKS Pod Identity: the role trusts the service principal pods.eks.amazonaws.com (AssumeRole and TagSession).
POD_IDENTITY_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                   "Action": ["sts:AssumeRole", "sts:TagSession"]}],
}
# CoreDNS may run on Neuron nodes when they are the only nodes (tolerations in its add-on configuration).
COREDNS_TOLERATIONS = (
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    neuron_toleration(),
)


@dataclass(frozen=True)
class TrainiumClusterArgs:
    """Inputs of `TrainiumCluster`. Without `vpc_id` a new VPC with private subnets is created (awsx)."""

    name: str
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
    vpc_id: str | None = None
    private_subnet_ids: Sequence[str] = ()
    public_subnet_ids: Sequence[str] = ()
    vpc_cidr: str = "10.0.0.0/16"
    availability_zones: Sequence[str] = ()  # new VPC: these AZs (the node groups' AZs first)
    nat_gateways: str = "Single"
    admin_principal_arns: Sequence[str] = ()
    endpoint_public_access: bool = True
    public_access_cidrs: Sequence[str] = ()
    vpc_cni_version: str | None = None
    coredns_version: str | None = None
    kube_proxy_version: str | None = None
    pod_identity_agent_version: str | None = None
    efa_only_interfaces: bool = False  # some node group uses EFA-only interfaces: vpc-cni >= 1.18.4
    # podIdentity: the VPC CNI's own role; nodeRole: none here (its node groups carry AmazonEKS_CNI_Policy).
    vpc_cni_identity: str = "podIdentity"
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parse_kubernetes_version("TrainiumClusterArgs.kubernetes_version", self.kubernetes_version)
        if self.vpc_id is not None and len(self.private_subnet_ids) < 2:
            raise SettingError("TrainiumClusterArgs.private_subnet_ids", list(self.private_subnet_ids),
                               "at least two subnets of vpc_id in different AZs")
        if self.vpc_id is None and (self.private_subnet_ids or self.public_subnet_ids):
            raise SettingError("TrainiumClusterArgs.private_subnet_ids", list(self.private_subnet_ids),
                               "unset unless vpc_id is set")
        if self.vpc_cni_identity not in VPC_CNI_IDENTITIES:
            raise SettingError("TrainiumClusterArgs.vpc_cni_identity", self.vpc_cni_identity,
                               " or ".join(VPC_CNI_IDENTITIES))
        if self.nat_gateways not in NAT_GATEWAY_STRATEGIES:
            raise SettingError("TrainiumClusterArgs.nat_gateways", self.nat_gateways,
                               " or ".join(NAT_GATEWAY_STRATEGIES))
        for key in ("coredns_version", "kube_proxy_version", "pod_identity_agent_version"):
            if (value := getattr(self, key)) is not None:
                parse_addon_version(f"TrainiumClusterArgs.{key}", value)
        if self.vpc_cni_version is not None:
            cni = parse_addon_version("TrainiumClusterArgs.vpc_cni_version", self.vpc_cni_version)
            if self.efa_only_interfaces and cni < MIN_VPC_CNI_FOR_EFA_ONLY:
                raise SettingError("TrainiumClusterArgs.vpc_cni_version", self.vpc_cni_version,
                                   "v1.18.4 or newer (EFA-only interfaces are used)")


class TrainiumCluster(pulumi.ComponentResource):
    """An EKS cluster ready for Neuron node groups and the DRA driver."""

    name: str
    kubernetes_version: str
    eks_cluster: eks.Cluster
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    cluster_security_group_id: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]

    def __init__(self, resource_name: str, args: TrainiumClusterArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("neuron-dra:index:TrainiumCluster", resource_name, None, opts)
        self.args = args
        self.name = args.name
        self.kubernetes_version = args.kubernetes_version
        child = pulumi.ResourceOptions(parent=self)

        if args.vpc_id is None:
            vpc = awsx.ec2.Vpc(
                f"{resource_name}-vpc",
                cidr_block=args.vpc_cidr,
                availability_zone_names=list(args.availability_zones) or None,
                nat_gateways=awsx.ec2.NatGatewayConfigurationArgs(
                    strategy=awsx.ec2.NatGatewayStrategy(args.nat_gateways)),
                enable_dns_hostnames=True,
                # Tags EKS and the AWS Load Balancer Controller use to find subnets.
                subnet_specs=[
                    awsx.ec2.SubnetSpecArgs(type=awsx.ec2.SubnetType.PRIVATE,
                                            tags={"kubernetes.io/role/internal-elb": "1"}),
                    awsx.ec2.SubnetSpecArgs(type=awsx.ec2.SubnetType.PUBLIC, tags={"kubernetes.io/role/elb": "1"}),
                ],
                tags=dict(args.tags),
                opts=child,
            )
            vpc_id: pulumi.Input[str] = vpc.vpc_id
            private: pulumi.Input[Sequence[str]] = vpc.private_subnet_ids
            public: pulumi.Input[Sequence[str]] = vpc.public_subnet_ids
        else:
            vpc_id, private, public = args.vpc_id, list(args.private_subnet_ids), list(args.public_subnet_ids)

        self.eks_cluster = eks.Cluster(
            f"{resource_name}-eks",
            name=args.name,
            version=args.kubernetes_version,
            vpc_id=vpc_id,
            private_subnet_ids=private,
            public_subnet_ids=public or None,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=_access_entries(args.admin_principal_arns),
            create_oidc_provider=True,
            skip_default_node_group=True,
            skip_default_security_groups=True,
            endpoint_private_access=True,
            endpoint_public_access=args.endpoint_public_access,
            public_access_cidrs=list(args.public_access_cidrs) or None,
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            vpc_cni_options=eks.VpcCniOptionsArgs(addon_version=args.vpc_cni_version),
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(enabled=True, version=args.kube_proxy_version),
            tags=dict(args.tags),
            opts=child,
        )
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.eks_cluster])
        self.pod_identity_agent = aws.eks.Addon(
            f"{resource_name}-pod-identity-agent",
            cluster_name=args.name,
            addon_name="eks-pod-identity-agent",
            addon_version=args.pod_identity_agent_version,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=dict(args.tags),
            opts=after_cluster,
        )
        self.vpc_cni_role: aws.iam.Role | None = None
        self.vpc_cni_association: aws.eks.PodIdentityAssociation | None = None
        self.node_group_dependencies: list[pulumi.Resource] = [self.eks_cluster]
        if args.vpc_cni_identity == "podIdentity":
            self.vpc_cni_role = aws.iam.Role(
                f"{resource_name}-vpc-cni",
                assume_role_policy=json.dumps(POD_IDENTITY_TRUST),
                description=f"VPC CNI (kube-system/aws-node) of EKS cluster {args.name}",
                tags=dict(args.tags),
                opts=child,
            )
            cni_policy = aws.iam.RolePolicyAttachment(
                f"{resource_name}-vpc-cni-policy", role=self.vpc_cni_role.name, policy_arn=CNI_POLICY_ARN,
                opts=child)
            namespace, service_account = VPC_CNI_SERVICE_ACCOUNT
            self.vpc_cni_association = aws.eks.PodIdentityAssociation(
                f"{resource_name}-vpc-cni",
                cluster_name=args.name,
                namespace=namespace,
                service_account=service_account,
                role_arn=self.vpc_cni_role.arn,
                tags=dict(args.tags),
                opts=pulumi.ResourceOptions(parent=self,
                                            depends_on=[self.eks_cluster, self.pod_identity_agent, cni_policy]),
            )
            self.node_group_dependencies.append(self.vpc_cni_association)
        self.kubeconfig = pulumi.Output.secret(self.eks_cluster.kubeconfig_json)
        self.provider = k8s.Provider(f"{resource_name}-k8s", kubeconfig=self.kubeconfig, opts=child)
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        self.private_subnet_ids = pulumi.Output.from_input(private).apply(list)
        self.cluster_security_group_id = self.eks_cluster.cluster_security_group_id.apply(
            _require("clusterSecurityGroupId"))
        self.oidc_provider_arn = self.eks_cluster.oidc_provider_arn
        self._resource_name = resource_name
        self.coredns: aws.eks.Addon | None = None
        self.register_outputs({
            "name": args.name,
            "kubeconfig": self.kubeconfig,
            "vpcId": self.vpc_id,
            "privateSubnetIds": self.private_subnet_ids,
            "clusterSecurityGroupId": self.cluster_security_group_id,
        })

    def install_coredns(self, after: Sequence[pulumi.Resource]) -> aws.eks.Addon:
        """Create the CoreDNS add-on once `after` (the node groups) exist, tolerating the Neuron taint."""
        if self.coredns is not None:
            raise RuntimeError(f"{self._resource_name}: CoreDNS is already installed")
        self.coredns = aws.eks.Addon(
            f"{self._resource_name}-coredns",
            cluster_name=self.name,
            addon_name="coredns",
            addon_version=self.args.coredns_version,
            configuration_values=pulumi.Output.json_dumps({"tolerations": [dict(t) for t in COREDNS_TOLERATIONS]}),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=dict(self.args.tags),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.eks_cluster, *after]),
        )
        return self.coredns


def _access_entries(principals: Sequence[str]) -> dict[str, eks.AccessEntryArgs]:
    return {
        f"admin-{i}": eks.AccessEntryArgs(
            principal_arn=arn,
            type=eks.AccessEntryType.STANDARD,
            access_policies={
                "cluster-admin": eks.AccessPolicyAssociationArgs(
                    policy_arn=ADMIN_POLICY_ARN,
                    access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                ),
            },
        )
        for i, arn in enumerate(principals)
    }


def _require(output: str) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            raise ValueError(f"pulumi-eks returned no {output}")
        return value

    return check
