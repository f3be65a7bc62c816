"""`TrainiumNodePool`: a Karpenter NodePool and its EC2NodeClass for Neuron instances (docs/karpenter.md).

The node settings are those of `TrainiumNodeGroup`, in Karpenter's spelling: the EKS AL2023 AMI (Karpenter's
`al2023` alias picks its Neuron variant for Neuron instance types), EFA interfaces per network card from the
hardware catalog (`components.efa.karpenter_interfaces`), IMDSv2 required with hop limit 1, an encrypted gp3 root
volume, the Neuron taint, the pool's labels (plus `neuron-dra/node-pool` and, on a reservation, the Capacity Block
label the driver publishes), and the node's LNC when set (user data writes the Neuron runtime's config file).

Static pool (`replicas`): one instance type, `karpenter.sh/capacity-type: reserved` and the reservation selected by
id for a Capacity Block or UltraServer; nodes never expire (the reservation's end does it). Dynamic pool: node
counts follow pending pods (e.g. pods asking for `aws.amazon.com/neuron`, which the driver serves through DRA on
1.36+), with requirements on instance type, family and capacity type, consolidated only when empty.
The manifests are plain dicts (`node_pool_manifest`, `node_class_manifest`); the component applies them as
`CustomResource`s once Karpenter's CRDs exist (`TrainiumKarpenter`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, SkipValidation, model_validator

from neuron_dra.components.efa import karpenter_interfaces
from neuron_dra.components.inputs import component_args, on_cluster
from neuron_dra.components.nodegroup import ROOT_DEVICE
from neuron_dra.components.settings import NodePoolSettings, SettingError
from neuron_dra.driver.deploy import CAPACITY_BLOCK_LABEL, INSTANCE_TYPE_LABEL, NODE_POOL_LABEL
from neuron_dra.driver.model.k8s_names import neuron_taint
from neuron_dra.driver.model.partitions import LNC_FILE

NODE_POOL_API = "karpenter.sh/v1"
NODE_CLASS_GROUP = "karpenter.k8s.aws"
NODE_CLASS_API = f"{NODE_CLASS_GROUP}/v1"
LNC_LABEL = "neuron-dra/lnc"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_FAMILY_LABEL = "karpenter.k8s.aws/instance-family"
ZONE_LABEL = "topology.kubernetes.io/zone"
DYNAMIC_EXPIRE_AFTER = "720h"  # Karpenter's own default: nodes are replaced after 30 days
# A dynamic pool's nodes go only when empty, and not before this: a training job between steps is not "empty".
DYNAMIC_CONSOLIDATE_AFTER = "10m"
USER_DATA_BOUNDARY = "//"


def lnc_user_data(lnc: int) -> str:
    """A MIME multi-part user data (Karpenter merges it with its own nodeadm part) that sets the node's LNC,
    as docs/neuron-cores.md §2 describes (NEURON_LOGICAL_NC_CONFIG in the Neuron runtime's config file)."""
    return "\n".join([
        "MIME-Version: 1.0",
        f'Content-Type: multipart/mixed; boundary="{USER_DATA_BOUNDARY}"',
        "",
        f"--{USER_DATA_BOUNDARY}",
        'Content-Type: text/x-shellscript; charset="us-ascii"',
        "",
        "#!/bin/bash",
        f"mkdir -p /{LNC_FILE.rsplit('/', 1)[0]}",
        f"echo NEURON_LOGICAL_NC_CONFIG={lnc} > /{LNC_FILE}",
        f"--{USER_DATA_BOUNDARY}--",
        "",
    ])


def node_pool_manifest(pool: NodePoolSettings) -> dict[str, Any]:
    """The `karpenter.sh/v1` NodePool of `pool` (its EC2NodeClass has the same name)."""
    labels = {**pool.labels, NODE_POOL_LABEL: pool.name}
    if pool.capacity_reservation_id:
        labels[CAPACITY_BLOCK_LABEL] = pool.capacity_reservation_id
    if pool.lnc is not None:
        labels[LNC_LABEL] = str(pool.lnc)
    families = sorted({pool.hardware.spec(t).family.name for t in pool.types})
    requirements: list[dict[str, Any]] = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(pool.types)},
        {"key": INSTANCE_FAMILY_LABEL, "operator": "In", "values": families},
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(pool.capacity_kinds)},
    ]
    if pool.availability_zone:
        requirements.append({"key": ZONE_LABEL, "operator": "In", "values": [pool.availability_zone]})
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": "EC2NodeClass", "name": pool.name},
        "requirements": requirements,
        "taints": [neuron_taint()],
        # A reservation ends the nodes itself; replacing them earlier would cut running jobs for nothing.
        "expireAfter": "Never" if pool.static else DYNAMIC_EXPIRE_AFTER,
    }
    spec: dict[str, Any] = {
        "template": {"metadata": {"labels": labels}, "spec": template_spec},
        "limits": {"nodes": pool.node_limit},
    }
    if pool.static:
        spec["replicas"] = pool.replicas
    else:
        spec["disruption"] = {"consolidationPolicy": "WhenEmpty", "consolidateAfter": DYNAMIC_CONSOLIDATE_AFTER}
    return {"apiVersion": NODE_POOL_API, "kind": "NodePool",
            "metadata": {"name": pool.name, "labels": {NODE_POOL_LABEL: pool.name}}, "spec": spec}


def node_class_manifest(pool: NodePoolSettings, *, role: str, subnet_ids: Sequence[str],
                        security_group_ids: Sequence[str], imds_hop_limit: int = 1,
                        tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `karpenter.k8s.aws/v1` EC2NodeClass of `pool`: the node role, subnets and security groups by id."""
    if not subnet_ids:
        raise SettingError(pool._at("subnetIds"), [], "the cluster's private subnets (none were given)")
    ebs: dict[str, Any] = {"volumeSize": f"{pool.root_volume_size_gib}Gi", "volumeType": "gp3", "encrypted": True,
                           "deleteOnTermination": True}
    if pool.root_volume_kms_key_id:
        ebs["kmsKeyID"] = pool.root_volume_kms_key_id
    spec: dict[str, Any] = {
        "role": role,
        "amiSelectorTerms": [{"alias": f"al2023@{pool.ami_version}"}],
        "subnetSelectorTerms": [{"id": s} for s in subnet_ids],
        "securityGroupSelectorTerms": [{"id": g} for g in security_group_ids],
        "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                            "httpPutResponseHopLimit": imds_hop_limit, "httpTokens": "required"},
        "blockDeviceMappings": [{"deviceName": ROOT_DEVICE, "rootVolume": True, "ebs": ebs}],
        "tags": {**(tags or {}), NODE_POOL_LABEL: pool.name},
    }
    efa = pool.efa_count
    if efa:
        spec["networkInterfaces"] = [
            {"networkCardIndex": i.network_card_index, "deviceIndex": i.device_index, "interfaceType": i.interface_type}
            for i in karpenter_interfaces(pool.hardware.spec(pool.types[0]))
        ]
    if pool.capacity_reservation_id:
        spec["capacityReservationSelectorTerms"] = [{"id": pool.capacity_reservation_id}]
    if pool.lnc is not None:
        spec["userData"] = lnc_user_data(pool.lnc)
    return {"apiVersion": NODE_CLASS_API, "kind": "EC2NodeClass", "metadata": {"name": pool.name}, "spec": spec}


class TrainiumNodePoolArgs(NodePoolSettings):
    """Inputs of `TrainiumNodePool`: the pool's own plain fields (as in `NodePoolSettings`, validated the same
    way) and where its nodes go: `karpenter` (TrainiumKarpenter: the node role it gives them, and its chart,
    which installs the CRDs, to wait for) and `cluster` (TrainiumCluster: its private subnets, security group and
    provider), or else node_role_name, subnet_ids and security_group_ids and the provider as `opts.provider`."""

    if TYPE_CHECKING:  # what callers are checked against; pydantic cannot resolve pulumi.Input, so Any at runtime
        node_role_name: pulumi.Input[str] | None = None
        subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]] | None = None
        security_group_ids: pulumi.Input[Sequence[pulumi.Input[str]]] | None = None
    else:
        node_role_name: Any = None
        subnet_ids: Any = None
        security_group_ids: Any = None
    imds_hop_limit: int = 1  # 2 lets every pod reach IMDS and so the node role
    tags: Mapping[str, str] = Field(default_factory=dict)
    depends_on: SkipValidation[Sequence[pulumi.Resource]] = ()  # e.g. Karpenter's chart, which installs the CRDs
    cluster: Any = None  # TrainiumCluster (typed Any: NodePoolSettings' module stays free of Pulumi)
    karpenter: Any = None  # TrainiumKarpenter

    @model_validator(mode="after")
    def _place(self) -> TrainiumNodePoolArgs:
        derived: dict[str, Any] = {}
        if self.karpenter is not None:
            derived["node_role_name"] = self.karpenter.node_role.name
            object.__setattr__(self, "depends_on", (self.karpenter.release, *self.depends_on))
        if self.cluster is not None:
            derived["subnet_ids"] = self.cluster.private_subnet_ids
            derived["security_group_ids"] = self.cluster.cluster_security_group_id.apply(lambda sg: [sg])
        for key, value in derived.items():
            if getattr(self, key) is not None:
                raise SettingError(f"{type(self).__name__}.{key}", getattr(self, key),
                                   "unset when cluster and karpenter are given (it comes from them)")
            object.__setattr__(self, key, value)
        for key, source in (("node_role_name", "karpenter=<TrainiumKarpenter>"),
                            ("subnet_ids", "cluster=<TrainiumCluster>"),
                            ("security_group_ids", "cluster=<TrainiumCluster>")):
            if getattr(self, key) is None:
                raise SettingError(f"{type(self).__name__}.{key}", None, f"a value, or {source}")
        hop = self.imds_hop_limit
        if isinstance(hop, bool) or not isinstance(hop, int) or not 1 <= hop <= 64:
            raise SettingError(f"{type(self).__name__}.imds_hop_limit", hop, "1 to 64")
        return self

    @classmethod
    def from_settings(cls, pool: NodePoolSettings, **placement: Any) -> TrainiumNodePoolArgs:
        """A pool of the stack's settings, placed by `placement` (node_role_name, subnet_ids, ...)."""
        plain = {name: getattr(pool, name) for name in NodePoolSettings.model_fields}
        return cls(**plain, **placement)


class TrainiumNodePool(pulumi.ComponentResource):
    """A Karpenter NodePool and its EC2NodeClass.

    `TrainiumNodePool(name, args, opts)` or `TrainiumNodePool(name, cluster=..., karpenter=..., name=...,
    instance_types=[...], ...)`. The Kubernetes provider is the cluster's, or `opts.provider`. Outputs: name,
    instance_types, check_targets (what `ClaimTemplates(node_pools=[...])` checks templates against), efa_count,
    node_pool, node_class."""

    name: str
    instance_types: tuple[str, ...]
    node_pool: k8s.apiextensions.CustomResource
    node_class: k8s.apiextensions.CustomResource

    def __init__(self, resource_name: str, args: TrainiumNodePoolArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("TrainiumNodePool", functools.partial(TrainiumNodePoolArgs, name=resource_name), args,
                              kwargs)
        if args.cluster is not None and args.cluster.coredns is None:
            raise SettingError(
                f"{type(args).__name__}.cluster", resource_name,
                "a cluster with CoreDNS before its first Karpenter pool (its nodes' pods need DNS): give "
                "karpenter=TrainiumKarpenter(cluster=...) (its controller nodes run CoreDNS), or create a "
                "TrainiumNodeGroup with nodes (desired_size > 0) first, or call "
                "cluster.install_coredns(after=[...]) for nodes made otherwise")
        opts = on_cluster(args.cluster, opts)
        super().__init__("neuron-dra:index:TrainiumNodePool", resource_name, None, opts)
        self.name = args.name
        if args.cluster is not None:
            args.cluster.node_pools.append(self)  # EfaDraDriver(cluster=...) checks pool names against these
        self.instance_types = args.types
        self.check_targets = args.check_targets  # what ClaimTemplates(node_pools=[...]) checks against
        self.efa_count = args.efa_count
        self.node_limit = args.node_limit  # its most nodes (limits.nodes)
        after = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        spec = pulumi.Output.all(args.node_role_name, args.subnet_ids, args.security_group_ids).apply(
            lambda known: node_class_manifest(args, role=known[0], subnet_ids=list(known[1]),
                                              security_group_ids=list(known[2]), imds_hop_limit=args.imds_hop_limit,
                                              tags=args.tags)["spec"])
        self.node_class = k8s.apiextensions.CustomResource(
            f"{resource_name}-nodeclass", api_version=NODE_CLASS_API, kind="EC2NodeClass",
            metadata={"name": args.name}, spec=spec, opts=after)
        pool = node_pool_manifest(args)
        self.node_pool = k8s.apiextensions.CustomResource(
            f"{resource_name}-nodepool", api_version=NODE_POOL_API, kind="NodePool", metadata=pool["metadata"],
            spec=pool["spec"], opts=pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, self.node_class]))
        self.register_outputs({"name": args.name, "instanceTypes": list(args.types)})
