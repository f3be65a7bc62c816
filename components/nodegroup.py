"""`TrainiumNodeGroup`: an EKS managed node group of Neuron instances with its own launch template.

pulumi-eks cannot build this (its launch-template path rejects the AL2023_x86_64_NEURON AMI type, and
NodeGroupV2 has one network interface), so it is pulumi_aws.eks.NodeGroup plus pulumi_aws.ec2.LaunchTemplate:
- EFA interfaces per network card, counts from the hardware catalog (`components.efa`); a security group that
  allows all traffic to and from itself (EFA needs it); one subnet (one AZ) and a `cluster` placement group;
- Capacity Blocks: market type `capacity-block`, the reservation targeted, the instance type in the launch
  template, capacity type CAPACITY_BLOCK;
- IMDSv2 required with hop limit 1 by default (docs/eks-trainium.md §5): only the node's own processes and
  host-network pods (kubelet, the VPC CNI, the Pod Identity agent) reach IMDS, so ordinary pods cannot take the
  node role's credentials;
- an encrypted gp3 root volume;
- the taint `aws.amazon.com/neuron=true:NoSchedule`, labels, and a node role with only the managed policies a
  node needs (join the cluster, pull images). The VPC CNI's policy goes on the node role only when asked
  (`cni_policy_on_node_role`); by default the VPC CNI has its own identity (`TrainiumCluster`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import pulumi
import pulumi_aws as aws

from neuron_dra.components.efa import efa_interfaces
from neuron_dra.components.settings import NodeGroupSettings, SettingError
from neuron_dra.driver.deploy import CAPACITY_BLOCK_LABEL, NODE_GROUP_LABEL
from neuron_dra.driver.model.k8s_names import NEURON_TAINT_KEY, NEURON_TAINT_VALUE

AMI_TYPE = "AL2023_x86_64_NEURON"
ROOT_DEVICE = "/dev/xvda"  # AL2023 root device
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",  # join the cluster
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",  # pull images (the driver's too), no push
)
# Only with cni_policy_on_node_role: the vpc-cni add-on then runs with the node's role.
CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
NEURON_TAINT = {"key": NEURON_TAINT_KEY, "value": NEURON_TAINT_VALUE, "effect": "NO_SCHEDULE"}  # EKS API spelling


@dataclass(frozen=True, kw_only=True)
class TrainiumNodeGroupArgs(NodeGroupSettings):
    """Inputs of `TrainiumNodeGroup`: the node group's own plain fields (`name`, `instance_type`, `desired_size`,
    ... as in `NodeGroupSettings`, validated the same way) and where it goes in the cluster.

    Subnets: `subnet_ids` when given; otherwise the subnets among `candidate_subnet_ids` (the cluster's private
    subnets) that lie in `availability_zones` (where the instance type is offered), looked up at deploy time.
    An EFA group uses exactly one of them (the first by id), so it stays in one AZ.
    """

    cluster_name: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    kubernetes_version: str
    candidate_subnet_ids: pulumi.Input[Sequence[str]] = ()
    availability_zones: Sequence[str] = ()
    imds_hop_limit: int = 1  # 2 lets every pod reach IMDS and so the node role
    cni_policy_on_node_role: bool = False  # True when the VPC CNI has no identity of its own
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.subnet_ids and not self.availability_zone and not self.availability_zones:
            raise SettingError(self._at("availabilityZone"), None,
                               "an AZ offering the instance type, or subnetIds (none was found or given)")
        hop = self.imds_hop_limit
        if isinstance(hop, bool) or not isinstance(hop, int) or not 1 <= hop <= 64:
            raise SettingError(f"{type(self).__name__}.imds_hop_limit", hop, "1 to 64")

    @classmethod
    def from_settings(cls, group: NodeGroupSettings, **placement: object) -> TrainiumNodeGroupArgs:
        """A node group of the default stack's settings, placed by `placement` (cluster_name, vpc_id, ...)."""
        plain = {f.name: getattr(group, f.name) for f in fields(NodeGroupSettings)}
        return cls(**plain, **placement)  # type: ignore[arg-type]


class TrainiumNodeGroup(pulumi.ComponentResource):
    """A managed node group of one Neuron instance type."""

    name: str
    instance_type: str
    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate
    role: aws.iam.Role
    subnet_ids: pulumi.Output[list[str]]
    placement_group: aws.ec2.PlacementGroup | None
    efa_security_group: aws.ec2.SecurityGroup | None

    def __init__(self, resource_name: str, args: TrainiumNodeGroupArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("neuron-dra:index:TrainiumNodeGroup", resource_name, None, opts)
        s = args
        spec = s.spec
        self.name = s.name
        self.instance_type = s.instance_type
        child = pulumi.ResourceOptions(parent=self)
        tags = {**args.tags, "neuron-dra/node-group": s.name}

        self.role = aws.iam.Role(
            f"{resource_name}-node-role",
            assume_role_policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                               "Principal": {"Service": "ec2.amazonaws.com"}}],
            }),
            description=f"EKS nodes of node group {s.name}",
            tags=tags,
            opts=child,
        )
        policies = (*NODE_POLICIES, CNI_POLICY) if args.cni_policy_on_node_role else NODE_POLICIES
        attachments = [
            aws.iam.RolePolicyAttachment(f"{resource_name}-{arn.rsplit('/', 1)[1]}", role=self.role.name,
                                         policy_arn=arn, opts=child)
            for arn in policies
        ]

        self.subnet_ids = _subnets(args)
        security_groups: list[pulumi.Input[str]] = [args.cluster_security_group_id]
        self.efa_security_group = None
        efa_rules: list[pulumi.Resource] = []
        if s.is_efa:
            self.efa_security_group = aws.ec2.SecurityGroup(
                f"{resource_name}-efa",
                vpc_id=args.vpc_id,
                description=f"EFA traffic between the nodes of node group {s.name}",
                tags=tags,
                opts=child,
            )
            sg_id = self.efa_security_group.id
            efa_rules = [
                aws.vpc.SecurityGroupIngressRule(f"{resource_name}-efa-in", security_group_id=sg_id,
                                                 referenced_security_group_id=sg_id, ip_protocol="-1",
                                                 description="EFA: all traffic from this group", opts=child),
                aws.vpc.SecurityGroupEgressRule(f"{resource_name}-efa-out", security_group_id=sg_id,
                                                referenced_security_group_id=sg_id, ip_protocol="-1",
                                                description="EFA: all traffic to this group", opts=child),
            ]
            security_groups.append(sg_id)

        self.placement_group = None
        if s.wants_placement_group:
            self.placement_group = aws.ec2.PlacementGroup(f"{resource_name}-placement", strategy="cluster",
                                                          tags=tags, opts=child)

        self.launch_template = aws.ec2.LaunchTemplate(
            f"{resource_name}-lt",
            description=f"Neuron node group {s.name} ({s.instance_type})",
            update_default_version=True,
            instance_type=s.instance_type if s.capacity_block else None,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=args.imds_hop_limit,
                instance_metadata_tags="disabled"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=s.root_volume_size_gib, volume_type="gp3", encrypted="true",
                    kms_key_id=s.root_volume_kms_key_id, delete_on_termination="true"),
            )],
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=i.network_card_index, device_index=i.device_index,
                    interface_type=i.interface_type, security_groups=security_groups,
                    delete_on_termination="true")
                for i in efa_interfaces(spec, s.efa_interface_type)
            ] or None,
            placement=(aws.ec2.LaunchTemplatePlacementArgs(group_name=self.placement_group.name)
                       if self.placement_group else None),
            instance_market_options=(aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
                                     if s.capacity_block else None),
            capacity_reservation_specification=(
                aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                    capacity_reservation_target=aws.ec2.
                    LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                        capacity_reservation_id=s.capacity_reservation_id))
                if s.capacity_block else None),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            tags=tags,
            opts=child,
        )

        labels = {**s.labels, NODE_GROUP_LABEL: s.name}
        if s.capacity_reservation_id:
            labels[CAPACITY_BLOCK_LABEL] = s.capacity_reservation_id
        self.node_group = aws.eks.NodeGroup(
            f"{resource_name}-ng",
            cluster_name=args.cluster_name,
            node_group_name=s.name,
            node_role_arn=self.role.arn,
            subnet_ids=self.subnet_ids,
            ami_type=AMI_TYPE,
            capacity_type="CAPACITY_BLOCK" if s.capacity_block else "ON_DEMAND",
            # With a Capacity Block the instance type lives in the launch template only.
            instance_types=None if s.capacity_block else [s.instance_type],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=s.desired_size, min_size=s.min_size, max_size=s.maximum),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            version=s.version or args.kubernetes_version,
            labels=labels,
            taints=[aws.eks.NodeGroupTaintArgs(**NEURON_TAINT)],
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*attachments, *efa_rules]),
        )
        self.register_outputs({
            "name": s.name,
            "instanceType": s.instance_type,
            "nodeGroupArn": self.node_group.arn,
            "subnetIds": self.subnet_ids,
        })


def _subnets(args: TrainiumNodeGroupArgs) -> pulumi.Output[list[str]]:
    s = args
    if s.subnet_ids:
        return pulumi.Output.from_input(list(s.subnet_ids))
    zones = [s.availability_zone] if s.availability_zone else list(args.availability_zones)
    if s.is_efa:
        zones = zones[:1]
    filters = pulumi.Output.all(args.vpc_id, args.candidate_subnet_ids).apply(lambda known: [
        aws.ec2.GetSubnetsFilterArgs(name="vpc-id", values=[known[0]]),
        aws.ec2.GetSubnetsFilterArgs(name="subnet-id", values=list(known[1])),
        aws.ec2.GetSubnetsFilterArgs(name="availability-zone", values=zones),
    ])
    found = aws.ec2.get_subnets_output(filters=filters)
    def pick(ids: Sequence[str] | None) -> list[str]:
        chosen = sorted(ids or [])
        if not chosen:
            raise SettingError(s._at("availabilityZone"), ", ".join(zones),
                               "an AZ in which the cluster has a private subnet")
        return chosen[:1] if s.is_efa else chosen

    return found.ids.apply(pick)
