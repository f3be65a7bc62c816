"""`TrainiumCluster`: an EKS control plane for Neuron node groups.

pulumi_eks.Cluster with a pinned Kubernetes version (a minor EKS offers: components/eks_versions.py), API
authentication with access entries, an OIDC provider, no default node group and no pulumi-eks security groups (so
`cluster_security_group_id` is the EKS-created cluster security group that managed nodes use), the vpc-cni,
kube-proxy and eks-pod-identity-agent add-ons, and a Kubernetes provider from its kubeconfig. The VPC CNI (service
account kube-system/aws-node) gets its own IAM role with AmazonEKS_CNI_Policy through an EKS Pod Identity
association (`vpc_cni_identity="podIdentity"`, the default; docs/eks-trainium.md §5), so the node role does not need
that policy; node groups wait for `node_group_dependencies` (pods get their credentials only if the association
exists when they are created). CoreDNS is created after the first nodes of the cluster's components: the first node
group with nodes (`TrainiumNodeGroup(cluster=...)`), or Karpenter's controller nodes
(`TrainiumKarpenter(cluster=...)`) when no group has nodes; a Karpenter pool of a cluster without CoreDNS is
refused. An add-on without nodes stays DEGRADED and its creation times out (pulumi-eks creates it before any node
group). Its pods tolerate the Neuron taint, so a cluster whose only nodes are Neuron nodes still resolves names. The
vpc-cni add-on enforces NetworkPolicies (`network_policy`, default on; docs/eks-trainium.md §6), so the driver's
NetworkPolicy is in force.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_awsx as awsx
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from neuron_dra.components.inputs import checked, component_args, is_known, keyword_hints
from neuron_dra.components.settings import (
    DEFAULT_KUBERNETES_VERSION,
    DEFAULT_VPC_CIDR,
    MIN_VPC_CNI_FOR_EFA_ONLY,
    MIN_VPC_CNI_FOR_NETWORK_POLICY,
    ClusterName,
    NatGateways,
    SettingError,
    VpcCniIdentity,
    VpcId,
    check_as,
    check_eks_version,
    check_ids,
    kubernetes_version_warnings,
    parse_addon_version,
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


@keyword_hints
@dataclass(frozen=True, kw_only=True)
class TrainiumClusterArgs:
    """Inputs of `TrainiumCluster`. Fields marked Input also take a `pulumi.Output` (another resource's or a
    StackReference's): known values are checked here, the others once they resolve (the preview fails with the
    same message). Without `vpc_id` a new VPC with private and public subnets is created (awsx).

    cluster_name: Input[str] | None -- EKS cluster name (default: the component's resource name).
    kubernetes_version: str -- Kubernetes minor EKS offers, "1.34" to "1.36" (default 1.36; a minor past standard
        support gets a preview warning); node groups and the driver derive theirs from it.
    vpc_id: Input[str] | None -- an existing VPC (with private_subnet_ids); None: a new VPC.
    private_subnet_ids: Input[list[Input[str]]] -- private subnets of vpc_id, at least two AZs (control plane,
        nodes' candidate subnets).
    public_subnet_ids: Input[list[Input[str]]] -- public subnets of vpc_id (load balancers).
    vpc_cidr: str -- CIDR of a new VPC (default 10.0.0.0/16).
    availability_zones: list[str] -- AZs of a new VPC (default: awsx's choice); put the node groups' AZs first.
    nat_gateways: str -- NAT gateways of a new VPC: Single (default) or OnePerAz.
    admin_principal_arns: Input[list[Input[str]]] -- IAM roles/users given cluster-admin access entries.
    endpoint_public_access: bool -- whether the API endpoint is reachable from the internet (default True).
    public_access_cidrs: Input[list[Input[str]]] -- CIDRs allowed to the public endpoint (default: any).
    vpc_cni_version, coredns_version, kube_proxy_version, pod_identity_agent_version: Input[str] | None --
        EKS add-on versions such as v1.20.4-eksbuild.1 (default: EKS's default for the Kubernetes version).
    efa_only_interfaces: bool -- some node group uses EFA-only interfaces (vpc-cni v1.18.4+ is then required).
    vpc_cni_identity: str -- podIdentity (default: the VPC CNI's own IAM role through EKS Pod Identity) or
        nodeRole (node groups carry AmazonEKS_CNI_Policy).
    network_policy: bool -- the VPC CNI enforces NetworkPolicies (add-on setting enableNetworkPolicy; default
        True; vpc-cni v1.14+). False leaves every NetworkPolicy, the driver's included, unenforced.
    tags: dict[str, str] -- AWS tags on everything created.
    """

    cluster_name: pulumi.Input[str] | None = None
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
    vpc_id: pulumi.Input[str] | None = None
    private_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
    public_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
    vpc_cidr: str = DEFAULT_VPC_CIDR
    availability_zones: Sequence[str] = ()
    nat_gateways: str = "Single"
    admin_principal_arns: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
    endpoint_public_access: bool = True
    public_access_cidrs: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
    vpc_cni_version: pulumi.Input[str] | None = None
    coredns_version: pulumi.Input[str] | None = None
    kube_proxy_version: pulumi.Input[str] | None = None
    pod_identity_agent_version: pulumi.Input[str] | None = None
    efa_only_interfaces: bool = False
    vpc_cni_identity: str = "podIdentity"
    network_policy: bool = True
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        at = "TrainiumClusterArgs."
        check_eks_version(f"{at}kubernetes_version", self.kubernetes_version)  # EKS offers only some minors
        if self.cluster_name is not None:
            self._check("cluster_name", lambda v: check_as(f"{at}cluster_name", ClusterName, v))
        if self.vpc_id is not None:
            self._check("vpc_id", lambda v: check_as(f"{at}vpc_id", VpcId, v))
            self._check("private_subnet_ids", _private_subnets)
            self._check("public_subnet_ids", lambda v: check_ids(f"{at}public_subnet_ids", "subnet", list(v)))
        else:
            for key in ("private_subnet_ids", "public_subnet_ids"):
                value = getattr(self, key)
                if not is_known(value) or value:
                    raise SettingError(f"{at}{key}", _shown(value), "unset unless vpc_id is set")
        self._check("admin_principal_arns", lambda v: check_ids(f"{at}admin_principal_arns", "arn", list(v)))
        self._check("public_access_cidrs", lambda v: check_ids(f"{at}public_access_cidrs", "cidr", list(v)))
        check_as(f"{at}vpc_cni_identity", VpcCniIdentity, self.vpc_cni_identity)  # StackSettings' types
        check_as(f"{at}nat_gateways", NatGateways, self.nat_gateways)
        for key in ("coredns_version", "kube_proxy_version", "pod_identity_agent_version"):
            if getattr(self, key) is not None:
                self._check(key, functools.partial(parse_addon_version, f"{at}{key}"))
        if self.vpc_cni_version is not None:
            self._check("vpc_cni_version", self._check_vpc_cni)

    def _check(self, key: str, check: Callable[[Any], object]) -> None:
        """Check field `key` now if known, else once it resolves (the field then holds the checked Output)."""
        object.__setattr__(self, key, checked(getattr(self, key), check))

    def _check_vpc_cni(self, version: str) -> None:
        setting = "TrainiumClusterArgs.vpc_cni_version"
        cni = parse_addon_version(setting, version)
        if self.efa_only_interfaces and cni < MIN_VPC_CNI_FOR_EFA_ONLY:
            raise SettingError(setting, version, "v1.18.4 or newer (EFA-only interfaces are used)")
        if self.network_policy and cni < MIN_VPC_CNI_FOR_NETWORK_POLICY:
            raise SettingError(setting, version, "v1.14.0 or newer: the VPC CNI enforces NetworkPolicies "
                               "(TrainiumClusterArgs.network_policy; or set it to False)")


def _private_subnets(value: Sequence[str]) -> None:
    setting = "TrainiumClusterArgs.private_subnet_ids"
    if isinstance(value, str) or not isinstance(value, list | tuple) or len(value) < 2:
        raise SettingError(setting, _shown(value), "at least two subnets of vpc_id in different AZs")
    check_ids(setting, "subnet", list(value))


def _shown(value: object) -> object:
    """A value for an error message (a list for sequences, '<an Output>' for values not known yet)."""
    if not is_known(value):
        return "<a pulumi Output>"
    return list(value) if isinstance(value, tuple) else value


class TrainiumCluster(pulumi.ComponentResource):
    """An EKS cluster ready for Neuron node groups and the DRA driver.

    `TrainiumCluster(name, args, opts)` or `TrainiumCluster(name, vpc_id=..., ...)` with the fields of
    `TrainiumClusterArgs` as keyword arguments. Node groups made with `TrainiumNodeGroup(cluster=this)` take
    their placement from it and wait for `node_group_dependencies`; the first one with nodes (desired_size > 0)
    installs CoreDNS, which needs nodes to become ready.

    Outputs: cluster_name, kubeconfig (secret), provider (a Kubernetes provider for it), vpc_id,
    private_subnet_ids, public_subnet_ids, cluster_security_group_id, oidc_provider_arn; coredns (the add-on, once
    installed); node_groups (the groups made with cluster=this).
    """

    cluster_name: pulumi.Output[str]
    kubernetes_version: str
    eks_cluster: eks.Cluster
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]
    cluster_security_group_id: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]

    def __init__(self, resource_name: str, args: TrainiumClusterArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("TrainiumCluster", TrainiumClusterArgs, args, kwargs)
        super().__init__("neuron-dra:index:TrainiumCluster", resource_name, None, opts)
        for warning in kubernetes_version_warnings(args.kubernetes_version):  # e.g. past standard support
            pulumi.log.warn(f"{resource_name}: {warning}", resource=self)
        self.args = args
        self.kubernetes_version = args.kubernetes_version
        self.vpc_cni_identity = args.vpc_cni_identity
        name: pulumi.Input[str] = args.cluster_name if args.cluster_name is not None else resource_name
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
            vpc_id: Any = vpc.vpc_id  # Input[str]; Any: the union of Input types is too wide for mypy
            private: Any = vpc.private_subnet_ids
            public: Any = vpc.public_subnet_ids
        else:
            vpc_id, private, public = args.vpc_id, _listed(args.private_subnet_ids), _listed(args.public_subnet_ids)

        self.eks_cluster = eks.Cluster(
            f"{resource_name}-eks",
            name=name,
            version=args.kubernetes_version,
            vpc_id=vpc_id,
            private_subnet_ids=private,
            public_subnet_ids=public,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=(_access_entries(list(args.admin_principal_arns))  # type: ignore[arg-type]
                            if is_known(args.admin_principal_arns)
                            else pulumi.Output.from_input(args.admin_principal_arns).apply(_access_entries)),
            create_oidc_provider=True,
            skip_default_node_group=True,
            skip_default_security_groups=True,
            endpoint_private_access=True,
            endpoint_public_access=args.endpoint_public_access,
            public_access_cidrs=_listed(args.public_access_cidrs),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            # enableNetworkPolicy: the vpc-cni add-on runs its network policy agent (docs/eks-trainium.md §6).
            vpc_cni_options=eks.VpcCniOptionsArgs(addon_version=args.vpc_cni_version,
                                                  enable_network_policy=args.network_policy),
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(enabled=True, version=args.kube_proxy_version),
            tags=dict(args.tags),
            opts=child,
        )
        # The name as an Output of the cluster: whatever uses it waits for the cluster.
        self.cluster_name = pulumi.Output.all(name, self.eks_cluster.kubeconfig_json).apply(lambda v: str(v[0]))
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.eks_cluster])
        self.pod_identity_agent = aws.eks.Addon(
            f"{resource_name}-pod-identity-agent",
            cluster_name=self.cluster_name,
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
                description=pulumi.Output.concat("VPC CNI (kube-system/aws-node) of EKS cluster ", self.cluster_name),
                tags=dict(args.tags),
                opts=child,
            )
            cni_policy = aws.iam.RolePolicyAttachment(
                f"{resource_name}-vpc-cni-policy", role=self.vpc_cni_role.name, policy_arn=CNI_POLICY_ARN,
                opts=child)
            namespace, service_account = VPC_CNI_SERVICE_ACCOUNT
            self.vpc_cni_association = aws.eks.PodIdentityAssociation(
                f"{resource_name}-vpc-cni",
                cluster_name=self.cluster_name,
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
        self.public_subnet_ids = pulumi.Output.from_input(public).apply(lambda ids: list(ids or []))
        self.cluster_security_group_id = self.eks_cluster.cluster_security_group_id.apply(
            _require("clusterSecurityGroupId"))
        self.oidc_provider_arn = self.eks_cluster.oidc_provider_arn
        self._resource_name = resource_name
        self.coredns: aws.eks.Addon | None = None
        self.node_groups: list[pulumi.ComponentResource] = []
        self.node_pools: list[pulumi.ComponentResource] = []  # TrainiumNodePool(cluster=this), in order
        self.register_outputs({
            "clusterName": self.cluster_name,
            "kubernetesVersion": self.kubernetes_version,
            "kubeconfig": self.kubeconfig,
            "vpcId": self.vpc_id,
            "privateSubnetIds": self.private_subnet_ids,
            "clusterSecurityGroupId": self.cluster_security_group_id,
        })

    def attach_node_group(self, group: pulumi.ComponentResource, node_group: aws.eks.NodeGroup,
                          has_nodes: bool) -> None:
        """Called by `TrainiumNodeGroup(cluster=this)`: remember the group, and install CoreDNS after the first
        group with nodes."""
        self.node_groups.append(group)
        if has_nodes and self.coredns is None:
            self.install_coredns(after=[node_group])

    def install_coredns(self, after: Sequence[pulumi.Resource]) -> aws.eks.Addon:
        """Create the CoreDNS add-on once `after` (node groups) exist, tolerating the Neuron taint. Node groups
        made with `TrainiumNodeGroup(cluster=...)` call this themselves; call it only for nodes made otherwise."""
        if self.coredns is not None:
            raise RuntimeError(f"{self._resource_name}: CoreDNS is already installed (node groups made with "
                               "TrainiumNodeGroup(cluster=...) install it once one of them has nodes)")
        self.coredns = coredns_addon(f"{self._resource_name}-coredns", self.cluster_name, self.args.coredns_version,
                                     self.args.tags, pulumi.ResourceOptions(parent=self,
                                                                            depends_on=[self.eks_cluster, *after]))
        return self.coredns


def coredns_addon(resource_name: str, cluster_name: pulumi.Input[str], version: pulumi.Input[str] | None,
                  tags: Mapping[str, str], opts: pulumi.ResourceOptions) -> aws.eks.Addon:
    """The CoreDNS add-on tolerating the Neuron taint (`TrainiumCluster.install_coredns`, and the node groups and
    Karpenter of other languages, which have the cluster's name but not the cluster object)."""
    return aws.eks.Addon(
        resource_name,
        cluster_name=cluster_name,
        addon_name="coredns",
        addon_version=version,
        configuration_values=pulumi.Output.json_dumps({"tolerations": [dict(t) for t in COREDNS_TOLERATIONS]}),
        resolve_conflicts_on_create="OVERWRITE",
        resolve_conflicts_on_update="OVERWRITE",
        tags=dict(tags),
        opts=opts,
    )


def _listed(value: pulumi.Input[Sequence[pulumi.Input[str]]]) -> pulumi.Input[Sequence[pulumi.Input[str]]] | None:
    """A list input as pulumi-eks takes it: a list (None when empty), or the Output as it is."""
    if is_known(value):
        return list(value) or None  # type: ignore[arg-type]
    return value


def _access_entries(principals: Sequence[Any]) -> dict[str, eks.AccessEntryArgs]:
    """Cluster-admin access entries; built once the ARNs are known (they may come from another stack)."""
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
