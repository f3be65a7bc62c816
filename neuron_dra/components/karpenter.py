"""`TrainiumKarpenter`: Karpenter installed into a `TrainiumCluster`, with its IAM, for Neuron node pools.

What it creates (docs/karpenter.md §2; the IAM follows Karpenter's getting-started CloudFormation template):
- the node role (the managed policies of `TrainiumNodeGroup`'s nodes) and its EKS access entry (type EC2_LINUX),
  so the nodes Karpenter launches join the cluster; Karpenter makes the instance profile itself;
- the interruption queue (SQS, SSE, messages kept 5 minutes, TLS only) and the EventBridge rules that feed it:
  AWS Health events, Spot interruption warnings, rebalance recommendations, instance state changes;
- the controller's role, bound to the chart's service account through EKS Pod Identity, with a policy scoped to
  this cluster's tagged resources, the queue and the node role;
- a small managed node group of ordinary instances for the controller (and CoreDNS): Karpenter must not run on
  the nodes it manages, and a cluster of Capacity Block pools has no node before Karpenter launches one; with
  `cluster=` it installs the cluster's CoreDNS add-on after these nodes unless a node group with nodes did already
  (`TrainiumCluster.install_coredns`), so a cluster composed of Karpenter pools alone resolves names;
- the Karpenter Helm chart, pinned, from its OCI registry, with `featureGates.staticCapacity` on (static
  NodePools, `replicas`, are alpha and off by default) and `reservedCapacity` on (capacity-type `reserved`).

DRA: Karpenter 1.15 ignores pods' DRA requests by default (`settings.ignoreDRARequests`); its DRA support
(`settings.enableDRA`, alpha) knows the NVIDIA and EFA drivers only. So pods with Neuron ResourceClaims go to
static pools (whose nodes exist regardless of pods), and dynamic pools serve pods that ask for the extended
resource `aws.amazon.com/neuron` (served through DRA on 1.36+).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from neuron_dra.components.cluster import POD_IDENTITY_TRUST, TrainiumCluster
from neuron_dra.components.inputs import component_args, keyword_hints, on_cluster
from neuron_dra.components.nodegroup import CNI_POLICY, NODE_POLICIES, ROOT_DEVICE
from neuron_dra.components.settings import SettingError

# The chart and controller release (the same version as tests/support/go/karpenter's pin; a test compares them).
KARPENTER_VERSION = "1.15.0"
CHART = "oci://public.ecr.aws/karpenter/karpenter"
NAMESPACE = "kube-system"  # where Karpenter's getting-started guide installs it
SERVICE_ACCOUNT = "karpenter"
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
DEFAULT_SYSTEM_INSTANCE_TYPE = "m7i.large"
SYSTEM_NODES = 2  # the chart runs two controller replicas on different nodes
# EventBridge rules of the interruption queue: (name, event source, detail type).
INTERRUPTION_EVENTS = (
    ("health", "aws.health", "AWS Health Event"),
    ("spot", "aws.ec2", "EC2 Spot Instance Interruption Warning"),
    ("rebalance", "aws.ec2", "EC2 Instance Rebalance Recommendation"),
    ("state", "aws.ec2", "EC2 Instance State-change Notification"),
)
QUEUE_RETENTION_SECONDS = 300


@keyword_hints
@dataclass(frozen=True)
class TrainiumKarpenterArgs:
    """Inputs of `TrainiumKarpenter`.

    cluster: TrainiumCluster | None -- the cluster: its name, private subnets, Kubernetes version, CNI-policy
        choice and provider, and its Pod Identity agent to wait for. Without it, give the next three fields.
    cluster_name: Input[str] | None -- the EKS cluster's name.
    subnet_ids: Input[list[str]] | None -- its private subnets (the controller's node group).
    kubernetes_version: str | None -- its Kubernetes minor (the controller's node group).
    chart_version: str -- the Karpenter chart release (default the pinned KARPENTER_VERSION).
    static_capacity: bool -- featureGates.staticCapacity: static NodePools (replicas) (default True).
    system_instance_type: str -- the controller nodes' instance type (default m7i.large).
    cni_policy_on_node_role: bool | None -- AmazonEKS_CNI_Policy on the node roles (default: the cluster's
        vpc_cni_identity is nodeRole; False without cluster).
    depends_on: list[pulumi.Resource] -- what must exist first (with cluster: its Pod Identity agent too).
    tags: dict[str, str] -- AWS tags.
    """

    cluster_name: pulumi.Input[str] | None = None
    subnet_ids: pulumi.Input[Sequence[str]] | None = None
    kubernetes_version: str | None = None
    chart_version: str = KARPENTER_VERSION
    static_capacity: bool = True  # featureGates.staticCapacity: static NodePools (replicas)
    system_instance_type: str = DEFAULT_SYSTEM_INSTANCE_TYPE
    cni_policy_on_node_role: bool | None = None
    depends_on: Sequence[pulumi.Resource] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    cluster: TrainiumCluster | None = None

    def __post_init__(self) -> None:
        if self.cluster is not None:
            c = self.cluster
            for key in ("cluster_name", "subnet_ids", "kubernetes_version"):
                if getattr(self, key) is not None:
                    raise SettingError(f"TrainiumKarpenterArgs.{key}", getattr(self, key),
                                       "unset when cluster is given (it comes from the cluster)")
            object.__setattr__(self, "cluster_name", c.cluster_name)
            object.__setattr__(self, "subnet_ids", c.private_subnet_ids)
            object.__setattr__(self, "kubernetes_version", c.kubernetes_version)
            if self.cni_policy_on_node_role is None:
                object.__setattr__(self, "cni_policy_on_node_role", c.vpc_cni_identity == "nodeRole")
            object.__setattr__(self, "depends_on", (*c.node_group_dependencies, c.pod_identity_agent,
                                                    *self.depends_on))
        for key in ("cluster_name", "subnet_ids", "kubernetes_version"):
            if getattr(self, key) is None:
                raise SettingError(f"TrainiumKarpenterArgs.{key}", None,
                                   "the cluster's value, or cluster=<TrainiumCluster>")
        if self.cni_policy_on_node_role is None:
            object.__setattr__(self, "cni_policy_on_node_role", False)
        parts = self.chart_version.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise SettingError("TrainiumKarpenterArgs.chart_version", self.chart_version,
                               f"a chart release such as {KARPENTER_VERSION}")
        if not isinstance(self.system_instance_type, str) or "." not in self.system_instance_type:
            raise SettingError("TrainiumKarpenterArgs.system_instance_type", self.system_instance_type,
                               f"an EC2 instance type such as {DEFAULT_SYSTEM_INSTANCE_TYPE}")


def controller_policy(*, cluster: str, region: str, account: str, partition: str, queue_arn: str,
                      node_role_arn: str) -> dict[str, Any]:
    """The controller's IAM policy: launch and end only this cluster's tagged nodes, manage the instance profiles
    of its EC2NodeClasses, read what instance selection needs, pass only the node role, read only its queue."""
    ec2 = f"arn:{partition}:ec2:{region}"
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}
    request_owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned",
                     "aws:RequestTag/eks:eks-cluster-name": cluster}
    launched = [f"{ec2}:*:{kind}/*" for kind in ("fleet", "instance", "volume", "network-interface",
                                                 "launch-template", "spot-instances-request")]
    profile = f"arn:{partition}:iam::{account}:instance-profile/*"
    region_tag = {"aws:RequestTag/topology.kubernetes.io/region": region}
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "LaunchFromSharedResources", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [f"{ec2}::image/*", f"{ec2}::snapshot/*", f"{ec2}:*:security-group/*", f"{ec2}:*:subnet/*",
                      f"{ec2}:*:capacity-reservation/*", f"{ec2}:*:placement-group/*"]},
        {"Sid": "LaunchFromOwnLaunchTemplates", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": f"{ec2}:*:launch-template/*",
         "Condition": {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "CreateTaggedNodes", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"], "Resource": launched,
         "Condition": {"StringEquals": request_owned, "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "TagOnCreate", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": launched,
         "Condition": {"StringEquals": {**request_owned,
                                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
                       "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "TagOwnInstances", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{ec2}:*:instance/*",
         "Condition": {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                       "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster},
                       "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim",
                                                                    "Name"]}}},
        {"Sid": "EndOwnNodes", "Effect": "Allow", "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
         "Condition": {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "ReadRegion", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates",
                    "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets"],
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "ReadAmiParameters", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:{partition}:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "ReadPrices", "Effect": "Allow", "Action": "pricing:GetProducts", "Resource": "*"},
        {"Sid": "ReadInterruptionQueue", "Effect": "Allow", "Resource": queue_arn,
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"]},
        {"Sid": "PassNodeRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": node_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}},
        {"Sid": "CreateInstanceProfiles", "Effect": "Allow", "Action": "iam:CreateInstanceProfile",
         "Resource": profile,
         "Condition": {"StringEquals": {**request_owned, **region_tag},
                       "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        {"Sid": "TagInstanceProfiles", "Effect": "Allow", "Action": "iam:TagInstanceProfile", "Resource": profile,
         "Condition": {"StringEquals": {**owned, "aws:ResourceTag/topology.kubernetes.io/region": region,
                                        **request_owned, **region_tag},
                       "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                                      "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        {"Sid": "ManageOwnInstanceProfiles", "Effect": "Allow", "Resource": profile,
         "Action": ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
         "Condition": {"StringEquals": {**owned, "aws:ResourceTag/topology.kubernetes.io/region": region},
                       "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        {"Sid": "ReadInstanceProfiles", "Effect": "Allow", "Action": "iam:GetInstanceProfile", "Resource": profile},
        {"Sid": "DiscoverApiServer", "Effect": "Allow", "Action": "eks:DescribeCluster",
         "Resource": f"arn:{partition}:eks:{region}:{account}:cluster/{cluster}"},
    ]}


def queue_policy(queue_arn: str) -> dict[str, Any]:
    """EventBridge (and SQS) may send to the queue; nothing may use it without TLS."""
    return {"Version": "2012-10-17", "Id": "EC2InterruptionPolicy", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
         "Action": "sqs:SendMessage", "Resource": queue_arn},
        {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    ]}


def chart_values(*, cluster_name: str, queue_name: str, static_capacity: bool) -> dict[str, Any]:
    """The chart's values: the cluster, the interruption queue, the feature gates, the Pod Identity service
    account name and the controller's resources (requests = limits for memory, as Karpenter's guide sets)."""
    return {
        "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
        "settings": {
            "clusterName": cluster_name,
            "interruptionQueue": queue_name,
            "featureGates": {"staticCapacity": static_capacity, "reservedCapacity": True},
        },
        "controller": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}},
    }


class TrainiumKarpenter(pulumi.ComponentResource):
    """Karpenter, its IAM and its controller nodes.

    `TrainiumKarpenter(name, args, opts)` or `TrainiumKarpenter(name, cluster=..., ...)` with the fields of
    `TrainiumKarpenterArgs` as keyword arguments. The Kubernetes provider is the cluster's, or `opts.provider`.
    Outputs: node_role, controller_role, queue, release (the chart; node pools wait for it), system_node_group.
    """

    node_role: aws.iam.Role
    controller_role: aws.iam.Role
    queue: aws.sqs.Queue
    release: k8s.helm.v3.Release
    system_node_group: aws.eks.NodeGroup

    def __init__(self, resource_name: str, args: TrainiumKarpenterArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("TrainiumKarpenter", TrainiumKarpenterArgs, args, kwargs)
        opts = on_cluster(args.cluster, opts)
        super().__init__("neuron-dra:index:TrainiumKarpenter", resource_name, None, opts)
        self.cluster = args.cluster
        child = pulumi.ResourceOptions(parent=self)
        after = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        tags = {**args.tags, "neuron-dra/karpenter": "true"}
        ec2_trust = json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}}]})

        self.node_role = aws.iam.Role(f"{resource_name}-node-role", assume_role_policy=ec2_trust,
                                      description="Nodes Karpenter launches", tags=tags, opts=child)
        policies = (*NODE_POLICIES, CNI_POLICY) if args.cni_policy_on_node_role else NODE_POLICIES
        for arn in policies:
            aws.iam.RolePolicyAttachment(f"{resource_name}-node-{arn.rsplit('/', 1)[1]}", role=self.node_role.name,
                                         policy_arn=arn, opts=child)
        self.access_entry = aws.eks.AccessEntry(f"{resource_name}-node-access", cluster_name=args.cluster_name,
                                                principal_arn=self.node_role.arn, type="EC2_LINUX", tags=tags,
                                                opts=after)

        self.queue = aws.sqs.Queue(f"{resource_name}-interruption", message_retention_seconds=QUEUE_RETENTION_SECONDS,
                                   sqs_managed_sse_enabled=True, tags=tags, opts=child)
        aws.sqs.QueuePolicy(f"{resource_name}-interruption", queue_url=self.queue.url,
                            policy=self.queue.arn.apply(lambda arn: json.dumps(queue_policy(arn))), opts=child)
        for name, source, detail in INTERRUPTION_EVENTS:
            rule = aws.cloudwatch.EventRule(f"{resource_name}-{name}", description=f"Karpenter: {detail}",
                                            event_pattern=json.dumps({"source": [source], "detail-type": [detail]}),
                                            tags=tags, opts=child)
            aws.cloudwatch.EventTarget(f"{resource_name}-{name}", rule=rule.name, arn=self.queue.arn,
                                       target_id="KarpenterInterruptionQueueTarget", opts=child)

        identity = aws.get_caller_identity_output()
        region = aws.get_region_output()
        partition = aws.get_partition_output()
        policy = pulumi.Output.all(args.cluster_name, region.region, identity.account_id, partition.partition,
                                   self.queue.arn, self.node_role.arn).apply(
            lambda v: json.dumps(controller_policy(cluster=v[0], region=v[1], account=v[2], partition=v[3],
                                                   queue_arn=v[4], node_role_arn=v[5])))
        self.controller_role = aws.iam.Role(f"{resource_name}-controller", assume_role_policy=json.dumps(
            POD_IDENTITY_TRUST), description=f"Karpenter controller ({NAMESPACE}/{SERVICE_ACCOUNT})", tags=tags,
            opts=child)
        controller_policy_ = aws.iam.RolePolicy(f"{resource_name}-controller", role=self.controller_role.id,
                                                policy=policy, opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{resource_name}-controller", cluster_name=args.cluster_name, namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT, role_arn=self.controller_role.arn, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, controller_policy_]))

        self.system_node_group = self._system_nodes(resource_name, args, tags)
        if args.cluster is not None and args.cluster.coredns is None:
            # These are the cluster's first nodes when no node group has any (a Karpenter-only cluster): CoreDNS
            # runs here, as EKS needs it wherever pods run.
            args.cluster.install_coredns(after=[self.system_node_group])
        values = pulumi.Output.all(args.cluster_name, self.queue.name).apply(
            lambda v: chart_values(cluster_name=v[0], queue_name=v[1], static_capacity=args.static_capacity))
        self.release = k8s.helm.v3.Release(
            f"{resource_name}-chart", name="karpenter", chart=CHART, version=args.chart_version, namespace=NAMESPACE,
            values=values, skip_await=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.association, self.system_node_group]))
        self.register_outputs({"nodeRoleName": self.node_role.name, "queueName": self.queue.name,
                               "chartVersion": args.chart_version})

    def _system_nodes(self, resource_name: str, args: TrainiumKarpenterArgs,
                      tags: Mapping[str, str]) -> aws.eks.NodeGroup:
        """Two ordinary nodes for the controller, IMDSv2 with hop limit 1 and an encrypted root volume."""
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(f"{resource_name}-system-role", assume_role_policy=self.node_role.assume_role_policy,
                            description="Nodes of Karpenter's controller", tags=tags, opts=child)
        policies = (*NODE_POLICIES, CNI_POLICY) if args.cni_policy_on_node_role else NODE_POLICIES
        attachments = [aws.iam.RolePolicyAttachment(f"{resource_name}-system-{arn.rsplit('/', 1)[1]}", role=role.name,
                                                    policy_arn=arn, opts=child) for arn in policies]
        template = aws.ec2.LaunchTemplate(
            f"{resource_name}-system-lt", description="Karpenter controller nodes", update_default_version=True,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE, ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=50, volume_type="gp3", encrypted="true", delete_on_termination="true"))],
            tags=dict(tags), opts=child)
        return aws.eks.NodeGroup(
            f"{resource_name}-system", cluster_name=args.cluster_name, node_group_name="karpenter-system",
            node_role_arn=role.arn, subnet_ids=args.subnet_ids, ami_type=SYSTEM_AMI_TYPE, capacity_type="ON_DEMAND",
            instance_types=[args.system_instance_type],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=template.id,
                                                                version=template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(desired_size=SYSTEM_NODES, min_size=SYSTEM_NODES,
                                                              max_size=SYSTEM_NODES),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1), version=args.kubernetes_version,
            labels={"neuron-dra/karpenter-system": "true"}, tags=dict(tags),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, *attachments]))
