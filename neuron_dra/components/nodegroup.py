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

import base64
import functools
import json
from collections.abc import Mapping, Sequence
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws
from pydantic import Field, SkipValidation, model_validator

from neuron_dra.components.cluster import TrainiumCluster
from neuron_dra.components.efa import efa_interfaces
from neuron_dra.components.inputs import checked, component_args, is_known
from neuron_dra.components.settings import NodeGroupSettings, SettingError, check_ids, parse_kubernetes_version
from neuron_dra.driver.deploy import CAPACITY_BLOCK_LABEL, LNC_CONFIG_DIR, LNC_LABEL, NODE_GROUP_LABEL
from neuron_dra.driver.model.k8s_names import NEURON_TAINT_KEY, NEURON_TAINT_VALUE
from neuron_dra.driver.model.partitions import LNC_FILE

AMI_TYPE = "AL2023_x86_64_NEURON"
ROOT_DEVICE = "/dev/xvda"  # AL2023 root device
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",  # join the cluster
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",  # pull images (the driver's too), no push
)
# Only with cni_policy_on_node_role: the vpc-cni add-on then runs with the node's role.
CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
NEURON_TAINT = {"key": NEURON_TAINT_KEY, "value": NEURON_TAINT_VALUE, "effect": "NO_SCHEDULE"}  # EKS API spelling


class TrainiumNodeGroupArgs(NodeGroupSettings):
    """Inputs of `TrainiumNodeGroup`: the node group's own fields and where it goes. Fields marked Input also
    take a `pulumi.Output`: known values are checked here, the others once they resolve (same message).

    The node group (as in the default stack's nodeGroups entries):
    name: str -- node group name, a DNS label of at most 40 characters.
    instance_type: str -- a Neuron instance type of the hardware catalog (default trn2.48xlarge).
    desired_size, min_size: int -- nodes (default 1 and 0); max_size: int | None (default: desired_size).
    capacity_type: str | None -- ON_DEMAND or CAPACITY_BLOCK (default: CAPACITY_BLOCK with a reservation id).
    capacity_reservation_id: Input[str] | None -- a Capacity Block for ML (cr-...); needs availability_zone or
        subnet_ids in its AZ, min_size 0, no placement group.
    availability_zone: str | None -- the group's AZ (default: availability_zones).
    subnet_ids: Input[list[Input[str]]] -- the group's subnets (EFA groups: exactly one).
    labels: dict[str, str] -- node labels (neuron-dra/node-group, neuron-dra/lnc and, on a Capacity Block,
        its reservation id are added).
    root_volume_size_gib: int -- encrypted gp3 root volume (default 500); root_volume_kms_key_id: str | None.
    efa_interface_type: str -- efa-only (default) or efa for network cards 1..n (card 0 is always efa).
    placement_group: bool | None -- a cluster placement group (default: for EFA groups not on a Capacity Block).
    version: str | None -- the nodes' Kubernetes minor (default: the cluster's).
    lnc: int | None -- Logical NeuronCore config of the nodes: 1 or 2 on Trainium2/Trainium3 (default: 2, the
        AMI's default); refused on other families. Written to /opt/aws/neuron/logical_nc_config at boot.

    Where it goes:
    cluster: TrainiumCluster | None -- the cluster component; cluster_name, vpc_id, cluster_security_group_id,
        kubernetes_version, candidate_subnet_ids and cni_policy_on_node_role come from it, the group waits for
        its node_group_dependencies (the VPC CNI's Pod Identity association), and the cluster installs CoreDNS
        after its first group with nodes. Without it, give those fields.
    cluster_name, vpc_id, cluster_security_group_id: Input[str] | None -- without cluster.
    kubernetes_version: str | None -- without cluster: the cluster's Kubernetes minor.
    candidate_subnet_ids: Input[list[Input[str]]] | None -- subnets to choose from (default: the cluster's
        private subnets); the ones in availability_zones are used, an EFA group takes the first by id.
    availability_zones: list[str] -- AZs offering the instance type (needed unless availability_zone or
        subnet_ids is given).
    security_group_ids: Input[list[Input[str]]] -- more security groups on the nodes' interfaces.
    imds_hop_limit: int -- IMDSv2 hop limit (default 1: only host-network pods reach IMDS).
    cni_policy_on_node_role: bool | None -- AmazonEKS_CNI_Policy on the node role (default: when the cluster's
        vpc_cni_identity is nodeRole).
    tags: dict[str, str] -- AWS tags.
    depends_on: list[pulumi.Resource] -- what the node group waits for besides (with cluster) the cluster's
        node_group_dependencies, e.g. the VPC CNI's Pod Identity association when placed without cluster.
    """

    if TYPE_CHECKING:  # what callers are checked against; pydantic cannot resolve pulumi.Input, so Any at runtime
        subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]] = ()  # type: ignore[assignment]
        capacity_reservation_id: pulumi.Input[str] | None = None  # type: ignore[assignment]
        cluster_name: pulumi.Input[str] | None = None
        vpc_id: pulumi.Input[str] | None = None
        cluster_security_group_id: pulumi.Input[str] | None = None
        candidate_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]] | None = None
        security_group_ids: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
        cluster: TrainiumCluster | None = None
    else:
        subnet_ids: Any = ()
        capacity_reservation_id: Any = None
        cluster_name: Any = None
        vpc_id: Any = None
        cluster_security_group_id: Any = None
        candidate_subnet_ids: Any = None
        security_group_ids: Any = ()
        cluster: Any = None
    kubernetes_version: str | None = None
    availability_zones: Sequence[str] = ()
    imds_hop_limit: SkipValidation[int] = 1  # 2 lets every pod reach IMDS and so the node role
    cni_policy_on_node_role: bool | None = None
    tags: Mapping[str, str] = Field(default_factory=dict)
    depends_on: SkipValidation[Sequence[pulumi.Resource]] = ()

    @model_validator(mode="after")
    def _place(self) -> TrainiumNodeGroupArgs:
        at = f"{type(self).__name__}({self.name!r})."
        if not is_known(self.subnet_ids):
            object.__setattr__(self, "subnet_ids", checked(self.subnet_ids, self._check_subnets))
        if self.capacity_reservation_id is not None and not is_known(self.capacity_reservation_id):
            object.__setattr__(self, "capacity_reservation_id",
                               checked(self.capacity_reservation_id, self.check_reservation_id))
        derived = {"cluster_name": None, "vpc_id": None, "cluster_security_group_id": None,
                   "kubernetes_version": None, "candidate_subnet_ids": None, "cni_policy_on_node_role": None}
        if self.cluster is not None:
            given = [k for k in derived if getattr(self, k) is not None]
            if given:
                raise SettingError(f"{at}{given[0]}", _shown(getattr(self, given[0])),
                                   "unset when cluster is given (it comes from the cluster)")
            c = self.cluster
            for key, value in (("cluster_name", c.cluster_name), ("vpc_id", c.vpc_id),
                               ("cluster_security_group_id", c.cluster_security_group_id),
                               ("kubernetes_version", c.kubernetes_version),
                               ("candidate_subnet_ids", c.private_subnet_ids),
                               ("cni_policy_on_node_role", c.vpc_cni_identity == "nodeRole")):
                object.__setattr__(self, key, value)
        else:
            for key in ("cluster_name", "vpc_id", "cluster_security_group_id", "kubernetes_version"):
                if getattr(self, key) is None:
                    raise SettingError(f"{at}{key}", None, "the cluster's value, or cluster=<TrainiumCluster>")
        assert self.kubernetes_version is not None
        parse_kubernetes_version(f"{at}kubernetes_version", self.kubernetes_version)
        if self.version is not None and parse_kubernetes_version(self._at("version"), self.version) > \
                parse_kubernetes_version(f"{at}kubernetes_version", self.kubernetes_version):
            raise SettingError(self._at("version"), self.version,
                               f"at most the cluster's version {self.kubernetes_version}")
        if not self.subnet_ids and not self.availability_zone and not self.availability_zones:
            raise SettingError(self._at("availabilityZone"), None,
                               "an AZ offering the instance type, or subnetIds (none was found or given)")
        hop = self.imds_hop_limit
        if isinstance(hop, bool) or not isinstance(hop, int) or not 1 <= hop <= 64:
            raise SettingError(f"{type(self).__name__}.imds_hop_limit", hop, "1 to 64")
        object.__setattr__(self, "security_group_ids", checked(
            self.security_group_ids, lambda v: check_ids(f"{at}security_group_ids", "security_group", list(v))))
        return self

    def _known(self, value: object) -> bool:
        return is_known(value)

    @classmethod
    def from_settings(cls, group: NodeGroupSettings, **placement: Any) -> TrainiumNodeGroupArgs:
        """A node group of the default stack's settings, placed by `placement` (cluster=..., or cluster_name,
        vpc_id, ...)."""
        plain = {name: getattr(group, name) for name in NodeGroupSettings.model_fields}
        return cls(**plain, **placement)


def _shown(value: object) -> object:
    return value if is_known(value) else "<a pulumi Output>"


class TrainiumNodeGroup(pulumi.ComponentResource):
    """A managed node group of one Neuron instance type.

    `TrainiumNodeGroup(name, args, opts)`, or `TrainiumNodeGroup(name, cluster=..., instance_type=..., ...)`
    with the fields of `TrainiumNodeGroupArgs` as keyword arguments (`name` defaults to the resource name).

    Outputs: name, instance_type, lnc (the nodes' LNC; None where LNC does not apply), node_group, launch_template,
    role, subnet_ids, placement_group, efa_security_group.
    """

    name: str
    instance_type: str
    lnc: int | None
    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate
    role: aws.iam.Role
    subnet_ids: pulumi.Output[list[str]]
    placement_group: aws.ec2.PlacementGroup | None
    efa_security_group: aws.ec2.SecurityGroup | None

    def __init__(self, resource_name: str, args: TrainiumNodeGroupArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("TrainiumNodeGroup", functools.partial(TrainiumNodeGroupArgs, name=resource_name),
                              args, kwargs)
        super().__init__("neuron-dra:index:TrainiumNodeGroup", resource_name, None, opts)
        s = args
        spec = s.spec
        self.args = args
        self.name = s.name
        self.instance_type = s.instance_type
        self.lnc = s.node_lnc
        self.cluster = args.cluster
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
        assert args.cluster_security_group_id is not None and args.cluster_name is not None
        own_groups: list[pulumi.Input[str]] = [args.cluster_security_group_id]
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
            own_groups.append(sg_id)
        # The cluster security group (which managed nodes get when a launch template names none), the EFA
        # group, and the user's.
        security_groups = pulumi.Output.all(pulumi.Output.all(*own_groups), args.security_group_ids).apply(
            lambda v: [*v[0], *v[1]])
        interfaces = efa_interfaces(spec, s.efa_interface_type)

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
                for i in interfaces
            ] or None,
            # Without EFA interfaces the template names security groups only when more were asked for.
            vpc_security_group_ids=(security_groups if not interfaces and not _empty(args.security_group_ids)
                                    else None),
            user_data=_user_data(s.lnc) if s.lnc is not None else None,
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

        labels: dict[str, pulumi.Input[str]] = {**s.labels, NODE_GROUP_LABEL: s.name}
        if self.lnc is not None:
            labels[LNC_LABEL] = str(self.lnc)
        if s.capacity_reservation_id is not None:
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
            # The cluster's node_group_dependencies: the VPC CNI's identity must exist before the nodes' pods.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                *attachments, *efa_rules, *(self.cluster.node_group_dependencies if self.cluster else ()),
                *args.depends_on]),
        )
        if self.cluster is not None:
            self.cluster.attach_node_group(self, self.node_group, has_nodes=s.desired_size > 0)
        self.register_outputs({
            "name": s.name,
            "instanceType": s.instance_type,
            "lnc": self.lnc,
            "nodeGroupArn": self.node_group.arn,
            "subnetIds": self.subnet_ids,
        })


def _empty(value: pulumi.Input[Sequence[pulumi.Input[str]]]) -> bool:
    return is_known(value) and not value


def _user_data(lnc: int) -> str:
    """Launch-template user data (base64 MIME multi-part, which EKS merges with its own node bootstrap) that
    writes the node's LNC where the Neuron runtime and the driver read it: `NEURON_LOGICAL_NC_CONFIG=<lnc>` in
    /opt/aws/neuron/logical_nc_config, as the Neuron SDK's EKS prerequisites do (docs/neuron-cores.md §2)."""
    script = (
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        f"mkdir -p /{LNC_CONFIG_DIR.strip('/')}\n"
        f"printf 'NEURON_LOGICAL_NC_CONFIG={lnc}\\n' > /{LNC_FILE}\n"
    )
    message = MIMEMultipart(boundary="==NEURON-DRA-BOUNDARY==")
    message.attach(MIMEText(script, "x-shellscript", "us-ascii"))
    return base64.b64encode(message.as_bytes()).decode("ascii")


def _subnets(args: TrainiumNodeGroupArgs) -> pulumi.Output[list[str]]:
    s = args
    if not _empty(s.subnet_ids):
        return pulumi.Output.from_input(s.subnet_ids).apply(lambda ids: [str(i) for i in ids])
    zones = [s.availability_zone] if s.availability_zone else list(args.availability_zones)
    if s.is_efa:
        zones = zones[:1]
    candidates = args.candidate_subnet_ids if args.candidate_subnet_ids is not None else []
    filters = pulumi.Output.all(args.vpc_id, candidates).apply(lambda known: [
        aws.ec2.GetSubnetsFilterArgs(name="vpc-id", values=[known[0]]),
        aws.ec2.GetSubnetsFilterArgs(name="subnet-id", values=list(known[1])),
        aws.ec2.GetSubnetsFilterArgs(name="availability-zone", values=zones),
    ])
    found = aws.ec2.get_subnets_output(filters=filters)

    def pick(ids: Sequence[str] | None, subnets: Sequence[str]) -> list[str]:
        chosen = sorted(ids or [])
        if not chosen:
            raise SettingError(s._at("availabilityZone"), ", ".join(zones),
                               f"an AZ in which the cluster has a private subnet ({subnet_zones(subnets)})")
        return chosen[:1] if s.is_efa else chosen

    return pulumi.Output.all(found.ids, candidates).apply(lambda known: pick(known[0], list(known[1])))


MAX_SUBNETS_NAMED = 16  # an error names at most this many subnets' AZs (one lookup each)


def subnet_zones(subnets: Sequence[str]) -> str:
    """`us-east-2a (subnet-1), us-east-2b (subnet-2)`: the AZs of the cluster's subnets, for an error message;
    looked up only on that error's path."""
    if not subnets:
        return "the cluster has none"
    shown = sorted(subnets)[:MAX_SUBNETS_NAMED]
    by_zone: dict[str, list[str]] = {}
    for subnet in shown:
        by_zone.setdefault(aws.ec2.get_subnet(id=subnet).availability_zone, []).append(subnet)
    more = f", and {len(subnets) - len(shown)} more" if len(subnets) > len(shown) else ""
    return "its private subnets are in " + ", ".join(
        f"{zone} ({', '.join(ids)})" for zone, ids in sorted(by_zone.items())) + more
