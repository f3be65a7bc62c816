"""The default stack's settings: schema, defaults, strict decoding. Pure Python (no Pulumi import).

`SCHEMA` is the single description of every setting: `Pulumi.yaml` declares the same keys, descriptions and
defaults (a test compares them), `Pulumi.example.yaml` shows every one, and `decode_settings` turns raw
Pulumi config values (strings, JSON for lists and objects) into frozen, validated `StackSettings`.
Every error names the setting (`neuron-dra:nodeGroups[0].instanceType`), the value and what is allowed.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from neuron_dra.driver.catalog import CATALOG, InstanceSpec, get_instance_spec
from neuron_dra.driver.deploy import (
    DEFAULT_CORE_DEVICE_CLASS,
    DEFAULT_CORE_EXTENDED_RESOURCE,
    DEFAULT_EXTENDED_RESOURCE,
    DEFAULT_NAMESPACE,
    DeployOptionError,
    DriverDeployOptions,
)
from neuron_dra.driver.errors import NotAllowed
from neuron_dra.driver.k8s_names import (
    DEFAULT_DRIVER_NAME,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    LABEL_KEY_RULE,
    LABEL_VALUE_RULE,
    is_label_key,
    is_label_value,
)

PROJECT = "neuron-dra"
MIN_KUBERNETES_VERSION = (1, 34)
DEFAULT_KUBERNETES_VERSION = "1.34"
# EFA-only interfaces (no IP addresses) need this VPC CNI version or newer.
MIN_VPC_CNI_FOR_EFA_ONLY = (1, 18, 4)
# The project's examples that fit the default node group (trn2.48xlarge); `neuron_dra.claim_templates.examples`
# also holds UltraServer and inf2 templates, whose checks rightly fail a stack without such nodes.
DEFAULT_CLAIM_TEMPLATES_MODULE = "neuron_dra.claim_templates.stack_examples"
DEFAULT_ROOT_VOLUME_GIB = 500  # AWS's own trn2 sample
EFA_INTERFACE_TYPES = ("efa-only", "efa")
CAPACITY_TYPES = ("ON_DEMAND", "CAPACITY_BLOCK")
NAT_GATEWAY_STRATEGIES = ("Single", "OnePerAz")

Kind = Literal["string", "integer", "boolean", "strings", "objects"]


class SettingError(NotAllowed):
    """A setting that cannot work; `field` (also `setting`) is the setting's name as the user wrote it."""

    @property
    def setting(self) -> str:
        return self.field


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    description: str
    default: object = None  # None: unset unless configured
    new_cluster_only: bool = False  # meaningless (and refused) when `kubeconfig` selects an existing cluster


DEFAULT_NODE_GROUPS: tuple[Mapping[str, object], ...] = (
    {"name": "trn2", "instanceType": "trn2.48xlarge", "desiredSize": 1, "minSize": 0, "maxSize": 1},
)

SCHEMA: tuple[Setting, ...] = (
    Setting("kubeconfig", "string",
            "Existing-cluster mode: a kubeconfig (contents or path). When set, the stack installs only the driver "
            "and the claim templates; no AWS resources are created."),
    Setting("kubernetesVersion", "string", "EKS Kubernetes version (1.34 or newer; DRA resource.k8s.io/v1 is GA "
            "from 1.34).", DEFAULT_KUBERNETES_VERSION, new_cluster_only=True),
    Setting("clusterName", "string", "EKS cluster name (default: neuron-dra-<stack>).", new_cluster_only=True),
    Setting("vpcId", "string", "Use this VPC instead of creating one (needs privateSubnetIds).",
            new_cluster_only=True),
    Setting("privateSubnetIds", "strings", "Private subnets of vpcId for the control plane and the nodes.",
            new_cluster_only=True),
    Setting("publicSubnetIds", "strings", "Public subnets of vpcId (for load balancers).", new_cluster_only=True),
    Setting("vpcCidr", "string", "CIDR block of the new VPC.", "10.0.0.0/16", new_cluster_only=True),
    Setting("availabilityZones", "strings", "AZs of the new VPC (default: the AZs offering the node groups' "
            "instance types, plus one more for the control plane).", new_cluster_only=True),
    Setting("natGateways", "string", "NAT gateways of the new VPC: Single or OnePerAz.", "Single",
            new_cluster_only=True),
    Setting("adminPrincipalArns", "strings", "IAM principals given cluster-admin access entries.",
            new_cluster_only=True),
    Setting("endpointPublicAccess", "boolean", "Whether the Kubernetes API endpoint is reachable from the "
            "internet (pulumi needs to reach it to install the driver).", True, new_cluster_only=True),
    Setting("publicAccessCidrs", "strings", "CIDRs allowed to reach the public API endpoint (default: any).",
            new_cluster_only=True),
    Setting("vpcCniVersion", "string", "vpc-cni add-on version (default: EKS's default; at least v1.18.4 when "
            "EFA-only interfaces are used).", new_cluster_only=True),
    Setting("corednsVersion", "string", "coredns add-on version (default: EKS's default).", new_cluster_only=True),
    Setting("kubeProxyVersion", "string", "kube-proxy add-on version (default: EKS's default).",
            new_cluster_only=True),
    Setting("podIdentityAgentVersion", "string", "eks-pod-identity-agent add-on version (default: EKS's "
            "default).", new_cluster_only=True),
    Setting("nodeGroups", "objects", "Trainium/Inferentia managed node groups: name, instanceType, desiredSize, "
            "minSize, maxSize, capacityType (ON_DEMAND|CAPACITY_BLOCK), capacityReservationId, availabilityZone, "
            "subnetIds, labels, rootVolumeSizeGiB, "
            "rootVolumeKmsKeyId, efaInterfaceType (efa-only|efa), placementGroup, version.",
            [dict(g) for g in DEFAULT_NODE_GROUPS], new_cluster_only=True),
    Setting("driverImage", "string", "Driver image to deploy (default: build driver/Dockerfile and push it to "
            "a new ECR repository)."),
    Setting("driverName", "string", "DRA driver name and DeviceClass name.", DEFAULT_DRIVER_NAME),
    Setting("driverNamespace", "string", "Namespace of the driver.", DEFAULT_NAMESPACE),
    Setting("driverMetricsPort", "integer", "Prometheus metrics port of the driver (0: off).", 0),
    Setting("neuronCoreDeviceClass", "string", "DeviceClass of NeuronCores (Kubernetes 1.36+; "
            "docs/neuron-cores.md).", DEFAULT_CORE_DEVICE_CLASS),
    Setting("extendedResourceName", "string", "Extended resource the whole-device DeviceClass serves to pods "
            "written for the Neuron device plugin ('' for none; left out before Kubernetes 1.36).",
            DEFAULT_EXTENDED_RESOURCE),
    Setting("coreExtendedResourceName", "string", "Extended resource the NeuronCore DeviceClass serves (logical "
            "cores at the node's LNC; '' for none; left out before Kubernetes 1.36).", DEFAULT_CORE_EXTENDED_RESOURCE),
    Setting("kubeletPluginsDir", "string", "kubelet's plugins directory on the nodes.", DEFAULT_PLUGINS_DIR),
    Setting("kubeletRegistryDir", "string", "kubelet's plugin registry directory on the nodes.",
            DEFAULT_REGISTRY_DIR),
    Setting("claimTemplatesModule", "string", "Python module whose module-level claim templates are deployed "
            "and checked against the node groups ('' for none).", DEFAULT_CLAIM_TEMPLATES_MODULE),
    Setting("clusterInstanceTypes", "strings", "Existing-cluster mode: the Neuron instance types of its nodes; "
            "claim templates are checked against them (default: every catalog type)."),
)

SCHEMA_BY_KEY: Mapping[str, Setting] = {s.key: s for s in SCHEMA}

NODE_GROUP_KEYS = (
    "name", "instanceType", "desiredSize", "minSize", "maxSize", "capacityType", "capacityReservationId",
    "availabilityZone",
    "subnetIds", "labels", "rootVolumeSizeGiB", "rootVolumeKmsKeyId", "efaInterfaceType", "placementGroup",
    "version",
)

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_VPC = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_CIDR = re.compile(r"^(\d{1,3}\.){3}\d{1,3}/\d{1,2}$")
_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/\S+$")
_ADDON_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(-eksbuild\.\d+)?$")
_K8S_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def setting_name(key: str) -> str:
    return f"{PROJECT}:{key}"


def parse_kubernetes_version(setting: str, value: str) -> tuple[int, int]:
    m = _K8S_VERSION.match(value) if isinstance(value, str) else None
    if not m:
        raise SettingError(setting, value, "a Kubernetes minor version such as 1.34")
    version = (int(m.group(1)), int(m.group(2)))
    if version < MIN_KUBERNETES_VERSION:
        raise SettingError(setting, value, "1.34 or newer (DRA resource.k8s.io/v1 and kubelet 1.34.2+ fixes)")
    return version


def parse_addon_version(setting: str, value: str) -> tuple[int, int, int]:
    m = _ADDON_VERSION.match(value) if isinstance(value, str) else None
    if not m:
        raise SettingError(setting, value, "an EKS add-on version such as v1.20.4-eksbuild.1")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@dataclass(frozen=True)
class NodeGroupSettings:
    """One managed node group of Neuron instances."""

    name: str
    instance_type: str = "trn2.48xlarge"
    desired_size: int = 1
    min_size: int = 0
    max_size: int | None = None  # None: desired_size (at least 1, as EKS requires)
    capacity_type: str | None = None  # None: CAPACITY_BLOCK with a reservation id, else ON_DEMAND
    capacity_reservation_id: str | None = None
    availability_zone: str | None = None
    subnet_ids: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    root_volume_size_gib: int = DEFAULT_ROOT_VOLUME_GIB
    root_volume_kms_key_id: str | None = None
    efa_interface_type: str = "efa-only"  # for network cards 1..n-1 (card 0 is always `efa`)
    placement_group: bool | None = None  # None: for EFA groups not on a Capacity Block
    version: str | None = None  # None: the cluster's version
    where: str = ""  # the setting this came from, for error messages

    def __post_init__(self) -> None:
        w = self.where or f"nodeGroup {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SettingError(f"{w}.name", self.name, "a DNS label of at most 40 characters")
        if self.instance_type not in CATALOG:
            raise SettingError(f"{w}.instanceType", self.instance_type, ", ".join(CATALOG))
        for key, v in (("desiredSize", self.desired_size), ("minSize", self.min_size),
                       ("maxSize", self.max_size), ("rootVolumeSizeGiB", self.root_volume_size_gib)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SettingError(f"{w}.{key}", v, "a whole number >= 0")
        if self.max_size is not None and self.max_size < 1:
            raise SettingError(f"{w}.maxSize", self.max_size, "at least 1")
        if not self.min_size <= self.desired_size <= self.maximum:
            raise SettingError(f"{w}.desiredSize", self.desired_size,
                               f"between minSize ({self.min_size}) and maxSize ({self.maximum})")
        if self.root_volume_size_gib < 50:
            raise SettingError(f"{w}.rootVolumeSizeGiB", self.root_volume_size_gib,
                               "at least 50 (the Neuron AMI, container images and Neuron compiler caches)")
        if self.efa_interface_type not in EFA_INTERFACE_TYPES:
            raise SettingError(f"{w}.efaInterfaceType", self.efa_interface_type, " or ".join(EFA_INTERFACE_TYPES))
        if self.availability_zone is not None and not _AZ.match(self.availability_zone):
            raise SettingError(f"{w}.availabilityZone", self.availability_zone, "an AZ name such as us-east-2b")
        for s in self.subnet_ids:
            if not _SUBNET.match(s):
                raise SettingError(f"{w}.subnetIds", s, "subnet ids such as subnet-0123456789abcdef0")
        if self.is_efa and len(self.subnet_ids) > 1:
            raise SettingError(
                f"{w}.subnetIds", list(self.subnet_ids),
                f"exactly one subnet: {self.instance_type} uses EFA, and an EFA node group must stay in one AZ "
                "and one cluster placement group")
        if self.subnet_ids and self.availability_zone:
            raise SettingError(f"{w}.availabilityZone", self.availability_zone,
                               "unset when subnetIds is given (the subnets decide the AZ)")
        for label, text in self.labels.items():
            if not is_label_key(label):
                raise SettingError(f"{w}.labels", label, LABEL_KEY_RULE)
            if not is_label_value(text):
                raise SettingError(f"{w}.labels[{label}]", text, LABEL_VALUE_RULE)
        if self.version is not None:
            parse_kubernetes_version(f"{w}.version", self.version)
        self._check_capacity_block(w)

    def _check_capacity_block(self, w: str) -> None:
        if self.capacity_type is not None and self.capacity_type not in CAPACITY_TYPES:
            raise SettingError(f"{w}.capacityType", self.capacity_type, " or ".join(CAPACITY_TYPES))
        if self.capacity_type == "CAPACITY_BLOCK" and self.capacity_reservation_id is None:
            raise SettingError(f"{w}.capacityReservationId", None,
                               "the Capacity Block's reservation id (cr-...) with capacityType CAPACITY_BLOCK")
        if self.capacity_type == "ON_DEMAND" and self.capacity_reservation_id is not None:
            raise SettingError(f"{w}.capacityType", self.capacity_type,
                               "CAPACITY_BLOCK (or unset) with capacityReservationId")
        if self.capacity_reservation_id is None:
            return
        if not isinstance(self.capacity_reservation_id, str) or not _RESERVATION.match(self.capacity_reservation_id):
            raise SettingError(f"{w}.capacityReservationId", self.capacity_reservation_id,
                               "a Capacity Block reservation id such as cr-0123456789abcdef0")
        if not self.spec.capacity_blocks:
            sold = ", ".join(t for t, s in CATALOG.items() if s.capacity_blocks)
            raise SettingError(f"{w}.instanceType", self.instance_type,
                               f"an instance type sold as Capacity Blocks ({sold}) with capacityReservationId")
        if not self.availability_zone and not self.subnet_ids:
            raise SettingError(f"{w}.availabilityZone", None,
                               "the Capacity Block's AZ (or subnetIds in it): its instances launch only there")
        if self.min_size != 0:
            raise SettingError(f"{w}.minSize", self.min_size,
                               "0 on a Capacity Block (its instances end with the reservation)")
        if self.placement_group:
            raise SettingError(f"{w}.placementGroup", True,
                               "false on a Capacity Block (its capacity is already placed; a placement group "
                               "can keep instances from launching into the reservation)")

    @property
    def spec(self) -> InstanceSpec:
        return get_instance_spec(self.instance_type)

    @property
    def maximum(self) -> int:
        return max(self.desired_size, 1) if self.max_size is None else self.max_size

    @property
    def is_efa(self) -> bool:
        return self.spec.efa_count > 0

    @property
    def capacity_block(self) -> bool:
        return self.capacity_reservation_id is not None

    @property
    def uses_efa_only(self) -> bool:
        return self.spec.efa_count > 1 and self.efa_interface_type == "efa-only"

    @property
    def wants_placement_group(self) -> bool:
        if self.placement_group is not None:
            return self.placement_group
        return self.is_efa and not self.capacity_block


@dataclass(frozen=True)
class StackSettings:
    """The whole stack: either a new EKS cluster (`kubeconfig` unset) or an existing cluster."""

    kubeconfig: str | None = None
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
    cluster_name: str | None = None
    vpc_id: str | None = None
    private_subnet_ids: tuple[str, ...] = ()
    public_subnet_ids: tuple[str, ...] = ()
    vpc_cidr: str = "10.0.0.0/16"
    availability_zones: tuple[str, ...] = ()
    nat_gateways: str = "Single"
    admin_principal_arns: tuple[str, ...] = ()
    endpoint_public_access: bool = True
    public_access_cidrs: tuple[str, ...] = ()
    vpc_cni_version: str | None = None
    coredns_version: str | None = None
    kube_proxy_version: str | None = None
    pod_identity_agent_version: str | None = None
    node_groups: tuple[NodeGroupSettings, ...] = ()
    driver_image: str | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    driver_namespace: str = DEFAULT_NAMESPACE
    driver_metrics_port: int = 0
    neuron_core_device_class: str = DEFAULT_CORE_DEVICE_CLASS
    extended_resource_name: str = DEFAULT_EXTENDED_RESOURCE
    core_extended_resource_name: str = DEFAULT_CORE_EXTENDED_RESOURCE
    kubelet_plugins_dir: str = DEFAULT_PLUGINS_DIR
    kubelet_registry_dir: str = DEFAULT_REGISTRY_DIR
    claim_templates_module: str = DEFAULT_CLAIM_TEMPLATES_MODULE
    cluster_instance_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = setting_name
        for t in self.cluster_instance_types:
            if t not in CATALOG:
                raise SettingError(n("clusterInstanceTypes"), t, ", ".join(CATALOG))
        if self.claim_templates_module and not _MODULE.match(self.claim_templates_module):
            raise SettingError(n("claimTemplatesModule"), self.claim_templates_module,
                               "a dotted Python module name, or '' for none")
        self.driver_options()  # the driver settings, checked where they are used
        if self.existing_cluster:
            return
        parse_kubernetes_version(n("kubernetesVersion"), self.kubernetes_version)
        if self.cluster_name is not None and not _CLUSTER_NAME.match(self.cluster_name):
            raise SettingError(n("clusterName"), self.cluster_name,
                               "1-100 letters, digits, '-' and '_', starting with a letter or digit")
        if not self.node_groups:
            raise SettingError(n("nodeGroups"), [], "at least one node group")
        seen: set[str] = set()
        for g in self.node_groups:
            if g.name in seen:
                raise SettingError(f"{g.where}.name", g.name, "a name no other node group has")
            seen.add(g.name)
            if g.version is not None and parse_kubernetes_version(f"{g.where}.version", g.version) > \
                    parse_kubernetes_version(n("kubernetesVersion"), self.kubernetes_version):
                raise SettingError(f"{g.where}.version", g.version,
                                   f"at most the control plane's version {self.kubernetes_version}")
            if g.capacity_block and g.version not in (None, self.kubernetes_version) and g.desired_size != 0:
                raise SettingError(f"{g.where}.desiredSize", g.desired_size,
                                   "0 while a Capacity Block node group is upgraded (EKS requires it)")
        self._check_network()
        if self.nat_gateways not in NAT_GATEWAY_STRATEGIES:
            raise SettingError(n("natGateways"), self.nat_gateways, " or ".join(NAT_GATEWAY_STRATEGIES))
        for arn in self.admin_principal_arns:
            if not _ARN.match(arn):
                raise SettingError(n("adminPrincipalArns"), arn, "IAM role or user ARNs")
        for cidr in self.public_access_cidrs:
            if not _CIDR.match(cidr):
                raise SettingError(n("publicAccessCidrs"), cidr, "IPv4 CIDR blocks such as 203.0.113.0/24")
        for key in ("coredns_version", "kube_proxy_version", "pod_identity_agent_version"):
            value = getattr(self, key)
            if value is not None:
                parse_addon_version(n(_KEY_OF_FIELD[key]), value)
        if self.vpc_cni_version is not None:
            cni = parse_addon_version(n("vpcCniVersion"), self.vpc_cni_version)
            efa_only = [g.name for g in self.node_groups if g.uses_efa_only]
            if efa_only and cni < MIN_VPC_CNI_FOR_EFA_ONLY:
                raise SettingError(n("vpcCniVersion"), self.vpc_cni_version,
                                   f"v1.18.4 or newer: node groups {', '.join(efa_only)} use EFA-only interfaces "
                                   "(or set their efaInterfaceType to efa)")

    def _check_network(self) -> None:
        n = setting_name
        if self.vpc_id is None:
            for key in ("private_subnet_ids", "public_subnet_ids"):
                if getattr(self, key):
                    raise SettingError(n(_KEY_OF_FIELD[key]), list(getattr(self, key)), "unset unless vpcId is set")
            for g in self.node_groups:
                if g.subnet_ids:
                    raise SettingError(f"{g.where}.subnetIds", list(g.subnet_ids),
                                       "unset unless vpcId is set (use availabilityZone with a new VPC)")
            if not _CIDR.match(self.vpc_cidr):
                raise SettingError(n("vpcCidr"), self.vpc_cidr, "an IPv4 CIDR block such as 10.0.0.0/16")
            for az in self.availability_zones:
                if not _AZ.match(az):
                    raise SettingError(n("availabilityZones"), az, "AZ names such as us-east-2b")
            return
        if not _VPC.match(self.vpc_id):
            raise SettingError(n("vpcId"), self.vpc_id, "a VPC id such as vpc-0123456789abcdef0")
        if len(self.private_subnet_ids) < 2:
            raise SettingError(n("privateSubnetIds"), list(self.private_subnet_ids),
                               "at least two subnets of vpcId in different AZs (EKS requires two AZs)")
        for s in (*self.private_subnet_ids, *self.public_subnet_ids):
            if not _SUBNET.match(s):
                raise SettingError(n("privateSubnetIds"), s, "subnet ids such as subnet-0123456789abcdef0")
        if self.availability_zones:
            raise SettingError(n("availabilityZones"), list(self.availability_zones),
                               "unset with vpcId (the given subnets decide the AZs)")

    @property
    def existing_cluster(self) -> bool:
        return self.kubeconfig is not None

    def driver_options(self) -> DriverDeployOptions:
        """The driver's deployment options; a bad value is reported under its setting's name."""
        try:
            # DeviceClass.extendedResourceName exists from 1.36 (DRAExtendedResource beta, on): left out before.
            mapped = parse_kubernetes_version(setting_name("kubernetesVersion"), self.kubernetes_version) >= (1, 36)
            options = DriverDeployOptions(
                driver_name=self.driver_name, namespace=self.driver_namespace, metrics_port=self.driver_metrics_port,
                plugins_dir=self.kubelet_plugins_dir, registry_dir=self.kubelet_registry_dir,
                core_device_class_name=self.neuron_core_device_class,
                extended_resource_name=(self.extended_resource_name or None) if mapped else None,
                core_extended_resource_name=(self.core_extended_resource_name or None) if mapped else None,
            )
            if self.driver_image is not None:
                DriverDeployOptions(image=self.driver_image)
        except DeployOptionError as e:
            key = _SETTING_OF_OPTION.get(e.option, e.option)
            raise e.restated(SettingError, setting_name(key)) from e
        return options

    def resolved_cluster_name(self, stack: str) -> str:
        return self.cluster_name or f"{PROJECT}-{stack}"[:100]

    @property
    def node_instance_types(self) -> tuple[str, ...]:
        """The instance types claim templates are checked against."""
        if self.existing_cluster:
            return self.cluster_instance_types or tuple(CATALOG)
        return tuple(dict.fromkeys(g.instance_type for g in self.node_groups))

    @property
    def uses_efa_only(self) -> bool:
        return any(g.uses_efa_only for g in self.node_groups)


_FIELD_OF_KEY = {
    "kubernetesVersion": "kubernetes_version", "clusterName": "cluster_name", "vpcId": "vpc_id",
    "privateSubnetIds": "private_subnet_ids", "publicSubnetIds": "public_subnet_ids", "vpcCidr": "vpc_cidr",
    "availabilityZones": "availability_zones", "natGateways": "nat_gateways",
    "adminPrincipalArns": "admin_principal_arns", "endpointPublicAccess": "endpoint_public_access",
    "publicAccessCidrs": "public_access_cidrs", "vpcCniVersion": "vpc_cni_version",
    "corednsVersion": "coredns_version", "kubeProxyVersion": "kube_proxy_version",
    "podIdentityAgentVersion": "pod_identity_agent_version", "nodeGroups": "node_groups",
    "driverImage": "driver_image", "driverName": "driver_name", "driverNamespace": "driver_namespace",
    "driverMetricsPort": "driver_metrics_port", "kubeletPluginsDir": "kubelet_plugins_dir",
    "neuronCoreDeviceClass": "neuron_core_device_class", "extendedResourceName": "extended_resource_name",
    "coreExtendedResourceName": "core_extended_resource_name",
    "kubeletRegistryDir": "kubelet_registry_dir", "claimTemplatesModule": "claim_templates_module",
    "clusterInstanceTypes": "cluster_instance_types", "kubeconfig": "kubeconfig",
}
_KEY_OF_FIELD = {f: k for k, f in _FIELD_OF_KEY.items()}
_SETTING_OF_OPTION = {
    "driver_name": "driverName", "namespace": "driverNamespace", "metrics_port": "driverMetricsPort",
    "plugins_dir": "kubeletPluginsDir", "registry_dir": "kubeletRegistryDir", "image": "driverImage",
    "core_device_class_name": "neuronCoreDeviceClass", "extended_resource_name": "extendedResourceName",
    "core_extended_resource_name": "coreExtendedResourceName",
}

_NODE_GROUP_FIELD = {
    "name": "name", "instanceType": "instance_type", "desiredSize": "desired_size", "minSize": "min_size",
    "maxSize": "max_size", "capacityType": "capacity_type", "capacityReservationId": "capacity_reservation_id",
    "availabilityZone": "availability_zone", "subnetIds": "subnet_ids", "labels": "labels",
    "rootVolumeSizeGiB": "root_volume_size_gib", "rootVolumeKmsKeyId": "root_volume_kms_key_id",
    "efaInterfaceType": "efa_interface_type", "placementGroup": "placement_group", "version": "version",
}


def _closest(word: str, choices: Sequence[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean {match[0]!r}? " if match else ""


def _decode_scalar(setting: str, kind: Kind, raw: object) -> object:
    """Pulumi passes every config value as a string; JSON carries lists, objects, numbers and booleans."""
    value = raw
    if isinstance(raw, str) and kind != "string":
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
    if kind == "string":
        if not isinstance(value, str):
            raise SettingError(setting, value, "a string")
        return value
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(setting, raw, "a whole number")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise SettingError(setting, raw, "true or false")
        return value
    if not isinstance(value, list):
        raise SettingError(setting, raw, "a list" + (" of strings" if kind == "strings" else " of objects"))
    if kind == "strings":
        for item in value:
            if not isinstance(item, str):
                raise SettingError(setting, item, "strings")
        return tuple(value)
    for item in value:
        if not isinstance(item, dict):
            raise SettingError(setting, item, "objects")
    return value


def _decode_node_group(index: int, raw: Mapping[str, Any]) -> NodeGroupSettings:
    where = f"{setting_name('nodeGroups')}[{index}]"
    kwargs: dict[str, Any] = {"where": where}
    for key, value in raw.items():
        if key not in _NODE_GROUP_FIELD:
            raise SettingError(f"{where}.{key}", value,
                               f"{_closest(key, NODE_GROUP_KEYS)}the node group keys: {', '.join(NODE_GROUP_KEYS)}")
        if key == "subnetIds":
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise SettingError(f"{where}.subnetIds", value, "a list of subnet ids")
            value = tuple(value)
        elif key == "labels":
            if not isinstance(value, dict):
                raise SettingError(f"{where}.labels", value, "an object of label key -> value")
            value = dict(value)
        elif key in ("name", "instanceType", "capacityType", "capacityReservationId", "availabilityZone",
                     "rootVolumeKmsKeyId", "efaInterfaceType", "version"):
            if not isinstance(value, str):
                raise SettingError(f"{where}.{key}", value, "a string")
        elif key == "placementGroup" and not isinstance(value, bool):
            raise SettingError(f"{where}.{key}", value, "true or false")
        kwargs[_NODE_GROUP_FIELD[key]] = value
    if "name" not in kwargs:
        raise SettingError(f"{where}.name", None, "a DNS label naming the node group")
    return NodeGroupSettings(**kwargs)


def _is_default(setting: Setting, raw: object) -> bool:
    if setting.default is None:
        return False
    decoded = _decode_scalar(setting_name(setting.key), setting.kind, raw)
    default = _decode_scalar(setting_name(setting.key), setting.kind, setting.default)
    return bool(decoded == default)


def decode_settings(raw: Mapping[str, object]) -> StackSettings:
    """Decode raw config (keys without or with the `neuron-dra:` prefix) into validated settings.

    Unknown keys in the project's namespace are errors (with the closest known key), so a typo cannot
    silently fall back to a default. Keys of other namespaces (aws:region, ...) are ignored.
    """
    values: dict[str, object] = {}
    for full_key, value in raw.items():
        ns, _, key = full_key.rpartition(":")
        if ns not in ("", PROJECT):
            continue
        if key not in SCHEMA_BY_KEY:
            raise SettingError(setting_name(key), value,
                               f"{_closest(key, list(SCHEMA_BY_KEY))}the settings: {', '.join(SCHEMA_BY_KEY)}")
        values[key] = value
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        setting = SCHEMA_BY_KEY[key]
        decoded = _decode_scalar(setting_name(key), setting.kind, value)
        if key == "nodeGroups":
            assert isinstance(decoded, list)
            decoded = tuple(_decode_node_group(i, g) for i, g in enumerate(decoded))
        kwargs[_FIELD_OF_KEY[key]] = decoded
    if kwargs.get("kubeconfig") is not None:
        for key in values:
            setting = SCHEMA_BY_KEY[key]
            # The engine passes Pulumi.yaml's defaults as values: only a value other than the default is refused.
            if setting.new_cluster_only and not _is_default(setting, values[key]):
                raise SettingError(setting_name(key), values[key],
                                   "unset when neuron-dra:kubeconfig selects an existing cluster (the stack then "
                                   "installs only the driver and the claim templates)")
    elif "node_groups" not in kwargs:
        kwargs["node_groups"] = tuple(_decode_node_group(i, g) for i, g in enumerate(DEFAULT_NODE_GROUPS))
    return StackSettings(**kwargs)


def settings_from_lookup(lookup: Callable[[str], str | None]) -> StackSettings:
    """Decode settings from a `key -> raw string` lookup (e.g. pulumi.Config().get) over every known key."""
    raw = {key: value for key in SCHEMA_BY_KEY if (value := lookup(key)) is not None}
    return decode_settings(raw)


def pulumi_project_config() -> dict[str, dict[str, Any]]:
    """The `config:` section of Pulumi.yaml that declares `SCHEMA` (types, descriptions, defaults).

    Pulumi's project config types are string, integer, boolean and array; `nodeGroups` (a list of objects)
    is declared by description and default only, which Pulumi accepts untyped.
    """
    out: dict[str, dict[str, Any]] = {}
    for s in SCHEMA:
        entry: dict[str, Any] = {}
        if s.kind in ("string", "integer", "boolean"):
            entry["type"] = s.kind
        elif s.kind == "strings":
            entry["type"] = "array"
            entry["items"] = {"type": "string"}
        entry["description"] = s.description
        if s.default is not None:
            entry["default"] = s.default
        out[s.key] = entry
    return out
