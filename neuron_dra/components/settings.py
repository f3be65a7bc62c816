"""The default stack's validated settings: frozen values with their checks. Pure Python (no Pulumi import).

`StackSettings`, `NodeGroupSettings` and `NodePoolSettings` are frozen pydantic models: their fields are the table
of settings (config key = alias, default, description), checked by the field types and `rule`s (annotated types
such as DnsLabel, Az, Lnc, RootVolumeGiB, shared by groups, pools and the components' Args), then by a model
validator for what depends on several (one method per fact where groups and pools share it: labels, LNC,
instance type). `TrainiumNodeGroupArgs` and `TrainiumNodePoolArgs` extend them with Pulumi Inputs.
`neuron_dra.components.settings_schema` decodes raw Pulumi config into these values. Every error is a
SettingError naming the setting (`neuron-dra:nodeGroups[0].instanceType`, or the Python field when a value is
built in code), the value and what is allowed (`errortext.restate`, the restater of every model, words pydantic's
errors so).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic._internal._model_construction import ModelMetaclass  # BaseModel's metaclass (no public name)
from pydantic.alias_generators import to_camel

from neuron_dra.components.eks_versions import EksVersion, eks_version, offered, support_warning, today_utc
from neuron_dra.driver.deploy import (
    DEFAULT_CORE_EXTENDED_RESOURCE,
    DEFAULT_DASHBOARD_LABEL,
    DEFAULT_EXTENDED_RESOURCE,
    DeployOptionError,
    DriverDeployOptions,
    DriverName,
)
from neuron_dra.driver.errortext import checked, did_you_mean, restate, rule
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec
from neuron_dra.driver.model.config import LNC_VALUES
from neuron_dra.driver.model.errors import NotAllowed
from neuron_dra.driver.model.k8s_names import (
    DEFAULT_DRIVER_NAME,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    LABEL_KEY_RULE,
    LABEL_VALUE_RULE,
    is_label_key,
    is_label_value,
)

PROJECT = "neuron-dra"
AUTO = "auto"  # settings whose default the stack decides (corePartitions, coreExtendedResourceName)
# The Kubernetes minors the driver supports (docs/kubernetes-versions.md): DRA's resource.k8s.io/v1 is served from
# 1.34; 1.37 is the newest release. Of these, an EKS cluster takes only the minors EKS offers (eks_versions.py).
MIN_KUBERNETES_VERSION = (1, 34)
MAX_KUBERNETES_VERSION = (1, 37)
DEFAULT_KUBERNETES_VERSION = "1.36"
DEFAULT_VPC_CIDR = "10.0.0.0/16"
# What `pulumi up` waits for on the driver's DaemonSet: its rollout, up to this long (the Kubernetes provider's
# own default is 10 minutes); 0 skips the wait (annotation pulumi.com/skipAwait).
DEFAULT_ROLLOUT_TIMEOUT_SECONDS = 600
MAX_ROLLOUT_TIMEOUT_SECONDS = 3600
ROLLOUT_TIMEOUT_ALLOWED = f"0 (do not wait for the rollout) or 1-{MAX_ROLLOUT_TIMEOUT_SECONDS} seconds"
# EFA-only interfaces (no IP addresses) need this VPC CNI version or newer.
MIN_VPC_CNI_FOR_EFA_ONLY = (1, 18, 4)
# Who holds the VPC CNI's EC2 permissions (AmazonEKS_CNI_Policy): its own role through EKS Pod Identity (the
# aws-node service account), or the node role (any pod that reaches IMDS could then use them).
VPC_CNI_IDENTITIES = ("podIdentity", "nodeRole")
# efaDriver: auto installs AWS's EFA DRA driver on the EFA node groups of a new cluster (none on an existing one);
# install also installs it on an existing cluster's EFA instance types; external: the cluster already runs one.
EFA_DRIVER_MODES = ("auto", "install", "external")
# podMonitor: auto renders the PodMonitor when the existing cluster serves its CRD (components/monitoring.py asks
# it while the program runs); a cluster this stack creates has no prometheus-operator, so there auto is false.
POD_MONITOR_MODES = ("auto", "true", "false")
NAT_GATEWAY_STRATEGIES = ("Single", "OnePerAz")
# NetworkPolicy enforcement by the VPC CNI's network policy agent needs this version or newer (EKS user guide,
# "Restrict Pod network traffic with Kubernetes network policies"; docs/eks-trainium.md §6).
MIN_VPC_CNI_FOR_NETWORK_POLICY = (1, 14, 0)
# The project's examples that fit the default node group (trn2.48xlarge); `neuron_dra.claim_templates.examples`
# also holds UltraServer and inf2 templates, whose checks rightly fail a stack without such nodes.
DEFAULT_CLAIM_TEMPLATES_MODULE = "neuron_dra.claim_templates.stack_examples"
DEFAULT_ROOT_VOLUME_GIB = 500  # AWS's own trn2 sample
EFA_INTERFACE_TYPES = ("efa-only", "efa")
CAPACITY_TYPES = ("ON_DEMAND", "CAPACITY_BLOCK")

# What existing-cluster mode needs instead of a stack-owned ECR repository (it creates no AWS resource).
EXISTING_CLUSTER_IMAGE = (
    "an image to deploy when neuron-dra:kubeconfig selects an existing cluster, best by digest "
    "(registry.example.com/neuron-dra-driver@sha256:<digest>); or set neuron-dra:driverImageRegistry to a registry "
    "repository of yours that pulumi up builds the image into (this mode creates no AWS resource, so no ECR "
    "repository of its own)")


class SettingError(NotAllowed):
    """A setting that cannot work; `field` (also `setting`) is the setting's name as the user wrote it."""

    @property
    def setting(self) -> str:
        return self.field


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\Z")
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}\Z")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}\Z")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}\Z")
_SECURITY_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}\Z")
_VPC = re.compile(r"^vpc-[0-9a-f]{8,17}\Z")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9][a-z]\Z")
_CIDR_FORM = re.compile(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}\Z")
_ARN = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9+=,.@_/-]+\Z")
_ADDON_VERSION = re.compile(r"^v?([0-9]+)\.([0-9]+)\.([0-9]+)(-eksbuild\.[0-9]+)?\Z")
_K8S_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)\Z")
# A registry repository a built image is pushed to: a reference's [registry/]path, lower-case, no tag or digest.
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+\Z")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
# Every pattern ends with \Z (`$` also matches before a trailing line feed) and has ASCII digit classes (`\d` takes
# any Unicode digit, e.g. Arabic-Indic or full-width ones): a value AWS would refuse is refused here.


def _is_cidr(value: str) -> bool:
    """An IPv4 CIDR block as AWS takes it: four octets of 0-255 and a prefix of 0-32, ASCII digits only."""
    if not _CIDR_FORM.match(value):
        return False
    address, prefix = value.split("/")
    return all(int(octet) <= 255 for octet in address.split(".")) and int(prefix) <= 32


# What each kind of id looks like, for `check_id` (the default stack's settings and the components' Args).
_ID_RULES: Mapping[str, tuple[Callable[[str], object], str]] = {
    "cluster": (_CLUSTER_NAME.match, "1-100 letters, digits, '-' and '_', starting with a letter or digit"),
    "subnet": (_SUBNET.match, "subnet ids such as subnet-0123456789abcdef0"),
    "vpc": (_VPC.match, "a VPC id such as vpc-0123456789abcdef0"),
    "arn": (_ARN.match, "IAM role or user ARNs"),
    "cidr": (_is_cidr, "IPv4 CIDR blocks such as 203.0.113.0/24"),
    "reservation": (_RESERVATION.match, "a Capacity Block reservation id such as cr-0123456789abcdef0"),
    "security_group": (_SECURITY_GROUP.match, "security group ids such as sg-0123456789abcdef0"),
}


def check_id(setting: str, kind: str, value: object) -> None:
    """Raise SettingError unless `value` is an id of `kind` (cluster, subnet, vpc, arn, cidr, reservation)."""
    matches, allowed = _ID_RULES[kind]
    if not isinstance(value, str) or not matches(value):
        raise SettingError(setting, value, allowed)


def check_ids(setting: str, kind: str, values: object) -> None:
    """Each of `values` (a list) is an id of `kind`."""
    if isinstance(values, str) or not isinstance(values, list | tuple):
        raise SettingError(setting, values, f"a list of {_ID_RULES[kind][1]}")
    for value in values:
        check_id(setting, kind, value)


_ADAPTERS: dict[int, tuple[object, TypeAdapter[Any]]] = {}


def check_as(setting: str, kind: Any, value: object) -> None:
    """`value` checked by the annotated type `kind` (a StackSettings field's: ClusterName, VpcCniIdentity, ...)
    outside a model (the components' Args, whose fields may be Outputs), refused under `setting`."""
    if id(kind) not in _ADAPTERS:
        _ADAPTERS[id(kind)] = (kind, TypeAdapter(kind))
    try:
        _ADAPTERS[id(kind)][1].validate_python(value)
    except ValidationError as e:
        raise restate(e, SettingError, name=lambda _key: setting) from e


def _is_rollout_timeout(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ROLLOUT_TIMEOUT_SECONDS


def check_rollout_timeout(setting: str, value: object) -> None:
    """How long `pulumi up` waits for a rollout (the driver's DaemonSet, the UltraServer controller's Deployment):
    0 (not at all) to MAX_ROLLOUT_TIMEOUT_SECONDS, whole seconds."""
    if not _is_rollout_timeout(value):
        raise SettingError(setting, value, ROLLOUT_TIMEOUT_ALLOWED)


def setting_name(key: str) -> str:
    return f"{PROJECT}:{key}"


def parse_kubernetes_version(setting: str, value: str) -> tuple[int, int]:
    m = _K8S_VERSION.match(value) if isinstance(value, str) else None
    if not m:
        raise SettingError(setting, value, "a Kubernetes minor version such as 1.36")
    version = (int(m.group(1)), int(m.group(2)))
    if not MIN_KUBERNETES_VERSION <= version <= MAX_KUBERNETES_VERSION:
        raise SettingError(setting, value, "1.34 to 1.37 (DRA resource.k8s.io/v1 is served from 1.34; "
                           "1.37 is the newest Kubernetes release)")
    return version


def check_eks_version(setting: str, value: str, today: date | None = None) -> EksVersion:
    """`value` as EKS offers it on `today` (default: today, UTC); else SettingError stating the minors EKS offers
    ("1.34 to 1.36"), not the wider range the driver supports (a local cluster may run those)."""
    today = today or today_utc()
    minors = offered(today)
    allowed = f"{minors[0]} to {minors[-1]}" if minors else "none (the table lists no minor EKS offers today)"
    if not isinstance(value, str) or not _K8S_VERSION.match(value):
        raise SettingError(setting, value, f"{allowed}, a Kubernetes minor version EKS offers, such as "
                           f"{DEFAULT_KUBERNETES_VERSION}")
    version = eks_version(value)
    if version is None or today > version.end_of_extended_support:
        why = (f"EKS does not offer {value}" if version is None else
               f"EKS ended extended support of {value} on {version.end_of_extended_support.isoformat()}")
        raise SettingError(setting, value, f"{allowed}, the minors EKS offers ({why}; "
                           "docs/kubernetes-versions.md §1; a local cluster may run 1.34-1.37)")
    return version


def kubernetes_version_warnings(version: str, today: date | None = None) -> list[str]:
    """What a user of this EKS minor should be told: that it is past, or near, the end of standard support (with
    the date, and that extended support costs extra)."""
    found = eks_version(version)
    warning = support_warning(found, today or today_utc()) if found else None
    return [warning] if warning else []


def parse_addon_version(setting: str, value: str) -> tuple[int, int, int]:
    m = _ADDON_VERSION.match(value) if isinstance(value, str) else None
    if not m:
        raise SettingError(setting, value, "an EKS add-on version such as v1.20.4-eksbuild.1")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))




def _setting(default: Any, description: str, *, new_cluster_only: bool = False, option: str | None = None) -> Any:
    """A StackSettings field: its default, its description (Pulumi.yaml's), whether only a new cluster uses it
    (refused when `kubeconfig` selects an existing cluster) and the DriverDeployOptions field it feeds."""
    extra: dict[str, Any] = {"new_cluster_only": new_cluster_only, **({"option": option} if option else {})}
    return Field(default, description=description, json_schema_extra=extra)


def _alias(name: str) -> str:
    """A field's config key: camelCase (`root_volume_size_gib` -> `rootVolumeSizeGiB`)."""
    return to_camel(name).replace("Gib", "GiB")


def unknown_key(setting: str, value: object, keys: Sequence[str], noun: str) -> SettingError:
    """A key no setting has: the closest known one, then all of them (`noun`: "the settings", ...)."""
    key = setting.rpartition(".")[2].rpartition(":")[2]
    match = difflib.get_close_matches(key, keys, n=1)
    closest = f"did you mean {match[0]!r}? " if match else ""
    return SettingError(setting, value, f"{closest}{noun}: {', '.join(keys)}")


class _OwnDir(ModelMetaclass):
    """`dir()` of a settings class without pydantic's inherited model API (model_dump, model_copy, ...), so
    `help()` shows the settings' own fields and properties in a few pages instead of BaseModel's reference
    (tests/components/test_components_nodegroup.py bounds it). Access is unchanged; pydantic documents the API."""

    def __dir__(cls) -> list[str]:
        own = {name for klass in cls.__mro__ if klass not in BaseModel.__mro__ for name in vars(klass)}
        return [name for name in super().__dir__() if name in own or name not in dir(BaseModel)]


class _Settings(BaseModel, metaclass=_OwnDir):
    """Settings as a pydantic model: frozen, no unknown keys, config keys as aliases (`_alias`); a refusal is a
    SettingError naming the setting as `_at_key` does."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=_alias, populate_by_name=True,
                              arbitrary_types_allowed=True)
    _noun: ClassVar[str] = "the settings"
    _allowed: ClassVar[Mapping[str, str]] = {}  # what a config key allows, where its type's own words say less

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            keys = [f.alias or n for n, f in type(self).model_fields.items() if not f.exclude]
            error = restate(e, SettingError, name=lambda key: self._at_key(data, key), allowed=self._allowed,
                            unknown=lambda setting, value: unknown_key(setting, value, keys, self._noun))
            raise error from error.__cause__ or e

    @classmethod
    def _at_key(cls, data: Mapping[str, Any], key: str) -> str:
        return setting_name(key)


class _Entry(_Settings):
    """A node group or pool: `where` is the config setting it came from (`neuron-dra:nodePools[0]`), for error
    messages; "" when built in code: errors then name the Python field (`NodePoolSettings('p').max_nodes`)."""

    where: str = Field(default="", exclude=True)
    # The instance types it may use: the built-in catalog, or one extended by the stack's catalogFile.
    hardware: Catalog = Field(default=BUILTIN, exclude=True, repr=False)

    @classmethod
    def _at_key(cls, data: Mapping[str, Any], key: str) -> str:
        if data.get("where"):
            return f"{data['where']}.{key}"
        fields = {f.alias: n for n, f in cls.model_fields.items()}
        return f"{cls.__name__}({data.get('name')!r}).{fields.get(key, key)}"

    def _at(self, key: str) -> str:
        """The name of config key `key` of this entry in an error message."""
        return self._at_key({"where": self.where, "name": getattr(self, "name", None)}, key)

    def _check_labels(self, reserved: tuple[str, ...] = ()) -> None:
        """Node labels: keys and values as Kubernetes allows, no key in a `reserved` domain (Karpenter's own)."""
        labels = getattr(self, "labels", {})
        for label, text in labels.items():
            if not is_label_key(label):
                raise SettingError(self._at("labels"), label, LABEL_KEY_RULE)
            if reserved and label.split("/", 1)[0].endswith(reserved) and "/" in label:
                raise SettingError(self._at("labels"), label,
                                   f"a key outside {' and '.join(reserved)} (Karpenter's own)")
            if not is_label_value(text):
                raise SettingError(f"{self._at('labels')}[{label}]", text, LABEL_VALUE_RULE)

    def _check_lnc(self, types: Sequence[str]) -> None:
        """An LNC (1 or 2, the field's type) only where every instance type has one (Trainium2 and Trainium3)."""
        lnc = getattr(self, "lnc", None)
        without = [t for t in types if not self.hardware.spec(t).family.lnc_supported]
        if lnc is not None and without:
            devices = sorted({self.hardware.spec(t).family.device_name for t in without})
            raise SettingError(self._at("lnc"), lnc,
                               f"unset: {', '.join(without)} ({', '.join(devices)}) "
                               f"{'has' if len(without) == 1 else 'have'} no Logical NeuronCore config (LNC exists on "
                               "Trainium2 and Trainium3 only); drop lnc")

    def _check_instance_type(self, key: str, instance_type: str) -> None:
        if instance_type not in self.hardware:
            raise SettingError(self._at(key), instance_type,
                               f"{', '.join(self.hardware.names)} (or one added by a catalog file: catalogFile)"
                               f"{did_you_mean(str(instance_type), self.hardware.names)}")


def _lnc(field: str, value: object) -> object:
    """A Logical NeuronCore config: 1 or 2 (a bool is not a number here)."""
    if isinstance(value, bool) or value not in LNC_VALUES:
        raise SettingError(field, value, f"{' or '.join(map(str, LNC_VALUES))} (unset: the family's default, 2)")
    return value


DnsLabel = Annotated[str, rule(_NAME.match, "a DNS label of at most 40 characters")]
Az = Annotated[str, rule(_AZ.match, "an AZ name such as us-east-2b")]
Reservation = Annotated[str, rule(_RESERVATION.match, _ID_RULES["reservation"][1])]
SubnetId = Annotated[str, rule(_SUBNET.match, "subnet ids such as subnet-0123456789abcdef0")]
Subnets = tuple[SubnetId, ...]
Lnc = Annotated[int, checked(_lnc)]
RootVolumeGiB = Annotated[StrictInt, rule(lambda size: size >= 50, "a whole number of at least 50 (the Neuron AMI, "
                                          "container images and Neuron compiler caches)")]
Count = Annotated[StrictInt, rule(lambda n: n >= 0, "a whole number >= 0")]


class NodeGroupSettings(_Entry):
    """One managed node group of Neuron instances (a nodeGroups entry; `TrainiumNodeGroupArgs` adds where it
    goes)."""

    _noun: ClassVar[str] = "the node group keys"
    _allowed: ClassVar[Mapping[str, str]] = {"subnetIds": "a list of subnet ids",
                                             "labels": "an object of label key -> value"}

    name: DnsLabel
    instance_type: StrictStr = "trn2.48xlarge"
    desired_size: Count = 1
    min_size: Count = 0
    max_size: Annotated[Count, rule(lambda n: n >= 1, "at least 1")] | None = None  # None: desired_size (>= 1)
    # None: CAPACITY_BLOCK with a reservation id, else ON_DEMAND
    capacity_type: Annotated[StrictStr, rule(CAPACITY_TYPES.__contains__, " or ".join(CAPACITY_TYPES))] | None = None
    capacity_reservation_id: Reservation | None = None
    availability_zone: Az | None = None
    subnet_ids: tuple[StrictStr, ...] = ()  # ids checked by `_check_subnets` (also once an Output resolves)
    labels: Mapping[StrictStr, StrictStr] = Field(default_factory=dict)
    root_volume_size_gib: RootVolumeGiB = DEFAULT_ROOT_VOLUME_GIB
    root_volume_kms_key_id: StrictStr | None = None
    # For network cards 1..n-1 (card 0 is always `efa`).
    efa_interface_type: Annotated[StrictStr, rule(EFA_INTERFACE_TYPES.__contains__,
                                                  " or ".join(EFA_INTERFACE_TYPES))] = "efa-only"
    placement_group: StrictBool | None = None  # None: for EFA groups not on a Capacity Block
    version: StrictStr | None = None  # None: the cluster's version
    # Logical NeuronCore config of the nodes (Trainium2/3: 1 or 2); None: the family's default (2).
    lnc: Lnc | None = None

    @model_validator(mode="after")
    def _check(self) -> NodeGroupSettings:
        self._check_instance_type("instanceType", self.instance_type)
        if not self.min_size <= self.desired_size <= self.maximum:
            raise SettingError(self._at("desiredSize"), self.desired_size,
                               f"between minSize ({self.min_size}) and maxSize ({self.maximum})")
        if self._known(self.subnet_ids):
            self._check_subnets(self.subnet_ids)
        if self.subnet_ids and self.availability_zone:
            raise SettingError(self._at("availabilityZone"), self.availability_zone,
                               "unset when subnetIds is given (the subnets decide the AZ)")
        self._check_labels()
        if self.version is not None:
            check_eks_version(self._at("version"), self.version)
        self._check_lnc([self.instance_type])
        self._check_capacity_block()
        return self

    def _known(self, value: object) -> bool:
        """Whether `value` is known now (Args that take Pulumi Outputs check the others once they resolve)."""
        return True

    def _check_subnets(self, subnet_ids: Sequence[str]) -> None:
        """The subnets (known now, or an Output's value once it resolves): ids, and one for an EFA group."""
        if isinstance(subnet_ids, str) or not isinstance(subnet_ids, list | tuple):
            raise SettingError(self._at("subnetIds"), subnet_ids, "a list of subnet ids")
        check_ids(self._at("subnetIds"), "subnet", list(subnet_ids))
        if self.is_efa and len(subnet_ids) > 1:
            raise SettingError(
                self._at("subnetIds"), list(subnet_ids),
                f"exactly one subnet: {self.instance_type} uses EFA, and an EFA node group must stay in one AZ "
                "and one cluster placement group")

    def check_reservation_id(self, reservation_id: str) -> None:
        check_id(self._at("capacityReservationId"), "reservation", reservation_id)

    @property
    def node_lnc(self) -> int | None:
        """The LNC the nodes run at (the setting, else the family's default); None where LNC does not apply."""
        if not self.spec.lnc_supported:
            return None
        return self.lnc if self.lnc is not None else self.spec.family.default_lnc

    @property
    def check_target(self) -> str:
        """How claim checks name this group's nodes: the instance type, with `:lnc=N` when the nodes run at an
        LNC other than the family's default."""
        if self.lnc is None or self.lnc == self.spec.family.default_lnc:
            return self.instance_type
        return f"{self.instance_type}:lnc={self.lnc}"

    def _check_capacity_block(self) -> None:
        if self.capacity_type == "CAPACITY_BLOCK" and self.capacity_reservation_id is None:
            raise SettingError(self._at("capacityReservationId"), None,
                               "the Capacity Block's reservation id (cr-...) with capacityType CAPACITY_BLOCK")
        if self.capacity_type == "ON_DEMAND" and self.capacity_reservation_id is not None:
            raise SettingError(self._at("capacityType"), self.capacity_type,
                               "CAPACITY_BLOCK (or unset) with capacityReservationId")
        if self.capacity_reservation_id is None:
            return
        if self._known(self.capacity_reservation_id):
            self.check_reservation_id(self.capacity_reservation_id)
        if not self.spec.capacity_blocks:
            sold = ", ".join(t for t, s in self.hardware.types.items() if s.capacity_blocks)
            raise SettingError(self._at("instanceType"), self.instance_type,
                               f"an instance type sold as Capacity Blocks ({sold}) with capacityReservationId")
        if not self.availability_zone and not self.subnet_ids:
            raise SettingError(self._at("availabilityZone"), None,
                               "the Capacity Block's AZ (or subnetIds in it): its instances launch only there")
        if self.min_size != 0:
            raise SettingError(self._at("minSize"), self.min_size,
                               "0 on a Capacity Block (its instances end with the reservation)")
        if self.placement_group:
            raise SettingError(self._at("placementGroup"), True,
                               "false on a Capacity Block (its capacity is already placed; a placement group "
                               "can keep instances from launching into the reservation)")

    @property
    def spec(self) -> InstanceSpec:
        return self.hardware.spec(self.instance_type)

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


# Config key -> field of a node group, from the fields' aliases (one source for decoding and errors).
NODE_GROUP_FIELD_OF_KEY: Mapping[str, str] = {
    f.alias or n: n for n, f in NodeGroupSettings.model_fields.items() if not f.exclude
}


# Karpenter NodePools (docs/karpenter.md): capacity types as Karpenter spells them (karpenter.sh/capacity-type).
POOL_CAPACITY_TYPES = ("on-demand", "spot", "reserved")
MAX_POOL_NODES = 1000  # limits.nodes of one pool: a bound on what a typo in the settings can launch
DEFAULT_DYNAMIC_POOL_NODES = 4
# Label domains Karpenter reserves for itself (its NodePool CRD refuses them in template labels).
KARPENTER_LABEL_DOMAINS = ("karpenter.sh", "karpenter.k8s.aws")
_AMI_VERSION = re.compile(r"^(latest|v[0-9]{8})\Z")
PoolNodes = Annotated[StrictInt, rule(lambda n: 0 <= n <= MAX_POOL_NODES,
                                       f"a whole number from 0 to {MAX_POOL_NODES}")]


class NodePoolSettings(_Entry):
    """One Karpenter NodePool (with its EC2NodeClass) of Neuron instances.

    Static (`replicas` set): Karpenter keeps that many nodes of one instance type, e.g. a Capacity Block or an
    UltraServer reservation selected by `capacity_reservation_id` (capacity type `reserved`). Dynamic (`replicas`
    unset): Karpenter launches nodes for pending pods, up to `max_nodes`, from `instance_types` and/or every type
    of `instance_families`, with `capacity_types` on-demand and/or spot.
    """

    _noun: ClassVar[str] = "the node pool keys"

    name: DnsLabel
    instance_types: tuple[str, ...] = ()
    instance_families: tuple[str, ...] = ()
    # None: reserved with a reservation id, else on-demand
    capacity_types: tuple[Annotated[str, rule(POOL_CAPACITY_TYPES.__contains__, ", ".join(POOL_CAPACITY_TYPES))],
                          ...] | None = None
    replicas: PoolNodes | None = None  # None: a dynamic pool
    capacity_reservation_id: Reservation | None = None
    # None: the replicas of a static pool, DEFAULT_DYNAMIC_POOL_NODES for a dynamic one
    max_nodes: PoolNodes | None = None
    availability_zone: Az | None = None
    labels: Mapping[str, str] = Field(default_factory=dict)
    root_volume_size_gib: RootVolumeGiB = DEFAULT_ROOT_VOLUME_GIB
    root_volume_kms_key_id: str | None = None
    lnc: Lnc | None = None  # None: the AMI's default (2 on Trainium2)
    ami_version: Annotated[str, rule(_AMI_VERSION.match, "latest or an EKS AMI release such as v20261120 (Karpenter "
                                      "alias al2023@<version>)")] = "latest"  # al2023@<this>

    @model_validator(mode="after")
    def _check(self) -> NodePoolSettings:
        for t in self.instance_types:
            self._check_instance_type("instanceTypes", t)
        families = sorted({spec.family.name for spec in self.hardware.types.values()})
        for f in self.instance_families:
            if f not in families:
                raise SettingError(self._at("instanceFamilies"), f, ", ".join(families))
        if not self.types:
            raise SettingError(self._at("instanceTypes"), [], "at least one instance type (instanceTypes or "
                               "instanceFamilies)")
        self._check_labels(KARPENTER_LABEL_DOMAINS)
        self._check_lnc(self.types)
        self._check_capacity()
        return self

    def _check_capacity(self) -> None:
        if self.capacity_types == ():
            raise SettingError(self._at("capacityTypes"), [], " and/or ".join(POOL_CAPACITY_TYPES))
        reservation = self.capacity_reservation_id
        ultra = [t for t in self.types if self.hardware.spec(t).ultraserver is not None]
        if self.static:
            self._check_static(ultra)
            return
        if reservation is not None:
            raise SettingError(self._at("capacityReservationId"), reservation,
                               "unset on a dynamic pool (a reservation is for a static pool: set replicas)")
        if "reserved" in self.capacity_kinds:
            raise SettingError(self._at("capacityTypes"), "reserved",
                               "on-demand and/or spot on a dynamic pool (reserved needs a static pool with "
                               "capacityReservationId)")
        if ultra:
            raise SettingError(self._at("instanceTypes"), ultra[0],
                               "a non-UltraServer type on a dynamic pool (UltraServers come as Capacity Blocks: "
                               "use a static pool with replicas and capacityReservationId)")

    def _check_static(self, ultra: list[str]) -> None:
        assert self.replicas is not None
        if self.instance_families or len(self.instance_types) != 1:
            raise SettingError(self._at("instanceTypes"), list(self.instance_types),
                               "exactly one instance type, and no instanceFamilies, on a static pool (replicas)")
        if self.max_nodes is not None and self.max_nodes < self.replicas:
            raise SettingError(self._at("maxNodes"), self.max_nodes, f"at least replicas ({self.replicas})")
        if "spot" in self.capacity_kinds:
            raise SettingError(self._at("capacityTypes"), "spot",
                               "on-demand or reserved on a static pool (spot nodes can be taken back at any time)")
        reservation = self.capacity_reservation_id
        if reservation is None:
            if "reserved" in self.capacity_kinds:
                raise SettingError(self._at("capacityReservationId"), None,
                                   "the reservation id (cr-...) with capacityTypes reserved")
            if ultra:
                raise SettingError(self._at("capacityReservationId"), None,
                                   f"the UltraServer reservation id (cr-...): {ultra[0]} comes as Capacity Blocks")
            return
        if self.capacity_kinds != ("reserved",):
            raise SettingError(self._at("capacityTypes"), list(self.capacity_kinds),
                               "[reserved] (or unset) with capacityReservationId")

        spec = self.hardware.spec(self.instance_types[0])
        if not spec.capacity_blocks:
            sold = ", ".join(t for t, s in self.hardware.types.items() if s.capacity_blocks)
            raise SettingError(self._at("instanceTypes"), spec.instance_type,
                               f"an instance type sold as Capacity Blocks ({sold}) with capacityReservationId")
        if not self.availability_zone:
            raise SettingError(self._at("availabilityZone"), None,
                               "the reservation's AZ: its instances launch only there (a new VPC gets a subnet in it)")

    @property
    def static(self) -> bool:
        return self.replicas is not None

    @property
    def types(self) -> tuple[str, ...]:
        """Every instance type the pool may launch: `instance_types`, then those of `instance_families`."""
        family = [t for t, s in self.hardware.types.items() if s.family.name in self.instance_families]
        return tuple(dict.fromkeys((*self.instance_types, *family)))

    @property
    def capacity_kinds(self) -> tuple[str, ...]:
        if self.capacity_types is not None:
            return tuple(self.capacity_types)
        return ("reserved",) if self.capacity_reservation_id else ("on-demand",)

    @property
    def node_limit(self) -> int:
        if self.max_nodes is not None:
            return self.max_nodes
        return self.replicas if self.replicas is not None else DEFAULT_DYNAMIC_POOL_NODES

    @property
    def check_targets(self) -> tuple[str, ...]:
        """How claim checks name the pool's nodes: each instance type, with `:lnc=N` when the nodes run at an
        LNC other than the family's default (as `NodeGroupSettings.check_target`)."""
        return tuple(t if self.lnc is None or self.lnc == self.hardware.spec(t).family.default_lnc
                     else f"{t}:lnc={self.lnc}" for t in self.types)

    @property
    def efa_count(self) -> int | None:
        """The EFA count all the pool's types share, or None when they differ (Karpenter then sizes EFA per pod
        request of vpc.amazonaws.com/efa instead of a fixed interface list)."""
        counts = {self.hardware.spec(t).efa_count for t in self.types}
        return counts.pop() if len(counts) == 1 else None


NODE_POOL_FIELD_OF_KEY: Mapping[str, str] = {
    f.alias or n: n for n, f in NodePoolSettings.model_fields.items() if not f.exclude
}


AddonVersion = Annotated[str, rule(_ADDON_VERSION.match, "an EKS add-on version such as v1.20.4-eksbuild.1")]
ClusterName = Annotated[str, rule(_CLUSTER_NAME.match, _ID_RULES["cluster"][1])]
VpcId = Annotated[str, rule(_VPC.match, _ID_RULES["vpc"][1])]
NatGateways = Annotated[str, rule(NAT_GATEWAY_STRATEGIES.__contains__, " or ".join(NAT_GATEWAY_STRATEGIES))]
VpcCniIdentity = Annotated[str, rule(VPC_CNI_IDENTITIES.__contains__, " or ".join(VPC_CNI_IDENTITIES))]
PodMonitorMode = Annotated[str, rule(POD_MONITOR_MODES.__contains__, ", ".join(POD_MONITOR_MODES))]
EfaDriverMode = Annotated[str, rule(EFA_DRIVER_MODES.__contains__, " or ".join(EFA_DRIVER_MODES))]
ImageRegistry = Annotated[str, rule(_REPOSITORY.match, "a registry repository such as "
                                    "123456789012.dkr.ecr.us-east-2.amazonaws.com/neuron-dra-driver (lower-case, no "
                                    "tag or digest: each build is tagged <version>-<content hash>)")]


class StackSettings(_Settings):
    """The whole stack: either a new EKS cluster (`kubeconfig` unset) or an existing cluster.

    A pydantic model: the field types and `rule`s check each value, `_check` what depends on several; the
    config key of a field is its alias (`_alias`), its description is Pulumi.yaml's.
    """

    kubeconfig: str | None = _setting(None, "Existing-cluster mode: a kubeconfig (contents or path). When set, the "
                                      "stack installs only the driver and the claim templates; no AWS resources "
                                      "are created.")
    kubernetes_version: str = _setting(
        DEFAULT_KUBERNETES_VERSION, "EKS Kubernetes version: a minor EKS offers, of 1.34 to 1.36 (DRA "
        "resource.k8s.io/v1 is served from 1.34; EKS does not offer 1.37 yet). A minor past EKS standard support "
        "gets a preview warning with its date: extended support costs extra per cluster-hour "
        "(docs/kubernetes-versions.md §1 has the dates).", new_cluster_only=True)
    cluster_name: ClusterName | None = _setting(
        None, "EKS cluster name (default: neuron-dra-<stack>).", new_cluster_only=True)
    vpc_id: VpcId | None = _setting(
        None, "Use this VPC instead of creating one (needs privateSubnetIds).", new_cluster_only=True)
    private_subnet_ids: Subnets = _setting((), "Private subnets of vpcId for the control plane and the nodes.",
                                           new_cluster_only=True)
    public_subnet_ids: Subnets = _setting((), "Public subnets of vpcId (for load balancers).", new_cluster_only=True)
    vpc_cidr: Annotated[str, rule(_is_cidr, "an IPv4 CIDR block such as 10.0.0.0/16")] = _setting(
        DEFAULT_VPC_CIDR, "CIDR block of the new VPC.", new_cluster_only=True)
    availability_zones: tuple[Annotated[str, rule(_AZ.match, "AZ names such as us-east-2b")], ...] = _setting(
        (), "AZs of the new VPC (default: the AZs offering the node groups' instance types, plus one more for the "
        "control plane).", new_cluster_only=True)
    nat_gateways: NatGateways = _setting("Single", "NAT gateways of the new VPC: Single or OnePerAz.",
                                         new_cluster_only=True)
    admin_principal_arns: tuple[Annotated[str, rule(_ARN.match, _ID_RULES["arn"][1])], ...] = _setting(
        (), "IAM principals given cluster-admin access entries.", new_cluster_only=True)
    endpoint_public_access: StrictBool = _setting(
        True, "Whether the Kubernetes API endpoint is reachable from the internet (pulumi needs to reach it to "
        "install the driver).", new_cluster_only=True)
    public_access_cidrs: tuple[Annotated[str, rule(_is_cidr, _ID_RULES["cidr"][1])], ...] = _setting(
        (), "CIDRs allowed to reach the public API endpoint (default: any).", new_cluster_only=True)
    vpc_cni_version: AddonVersion | None = _setting(
        None, "vpc-cni add-on version (default: EKS's default; at least v1.18.4 when EFA-only interfaces are "
        "used).", new_cluster_only=True)
    vpc_cni_identity: VpcCniIdentity = _setting(
        "podIdentity", "Who holds the VPC CNI's EC2 permissions (AmazonEKS_CNI_Policy): podIdentity (its own IAM "
        "role for the aws-node service account, through EKS Pod Identity) or nodeRole (the node role, as EKS's "
        "defaults do; any pod that reaches IMDS can then use them).", new_cluster_only=True)
    vpc_cni_network_policy: StrictBool = _setting(
        True, "Whether the VPC CNI enforces Kubernetes NetworkPolicies (its network policy agent, add-on setting "
        "enableNetworkPolicy; vpc-cni v1.14+). Without an enforcing CNI the driver's NetworkPolicy protects "
        "nothing.", new_cluster_only=True)
    imds_hop_limit: Annotated[StrictInt, rule(lambda hop: 1 <= hop <= 64, "1 (only the node's own processes and "
                                               "host-network pods reach IMDS) to 64")] = _setting(
        1, "IMDSv2 response hop limit of the nodes: 1 keeps pods (other than host-network pods) from the node "
        "role's credentials; 2 lets every pod reach IMDS.", new_cluster_only=True)
    coredns_version: AddonVersion | None = _setting(None, "coredns add-on version (default: EKS's default).",
                                                    new_cluster_only=True)
    kube_proxy_version: AddonVersion | None = _setting(None, "kube-proxy add-on version (default: EKS's default).",
                                                       new_cluster_only=True)
    pod_identity_agent_version: AddonVersion | None = _setting(
        None, "eks-pod-identity-agent add-on version (default: EKS's default).", new_cluster_only=True)
    node_groups: tuple[InstanceOf[NodeGroupSettings], ...] = _setting(
        (), "Trainium/Inferentia managed node groups: " + ", ".join(NODE_GROUP_FIELD_OF_KEY) + ". capacityType is "
        "ON_DEMAND or CAPACITY_BLOCK, efaInterfaceType efa-only or efa, lnc 1 or 2 (Trainium2/Trainium3 only: the "
        "nodes' Logical NeuronCore config, default 2; also the node label neuron-dra/lnc).", new_cluster_only=True)
    node_pools: tuple[InstanceOf[NodePoolSettings], ...] = _setting(
        (), "Karpenter NodePools of Neuron instances, instead of or next to nodeGroups (docs/karpenter.md); "
        "Karpenter is installed when there is one: " + ", ".join(NODE_POOL_FIELD_OF_KEY) + ". With replicas a "
        "static pool (one instance type; a Capacity Block or UltraServer with capacityReservationId), without a "
        "dynamic pool up to maxNodes; capacityTypes: " + ", ".join(POOL_CAPACITY_TYPES) + ".",
        new_cluster_only=True)
    driver_image: str | None = _setting(
        None, "Driver image to deploy, repo@sha256:<digest> (pinned) or repo:tag (follows the tag). Default: `pulumi "
        "up` builds neuron_dra/driver/Dockerfile of the installed package (Docker with BuildKit where it runs; "
        "preview needs none) and pushes it to driverImageRegistry, else (new cluster only) to an ECR repository of "
        "the stack, pinned by digest. An existing cluster (kubeconfig) needs this or driverImageRegistry.",
        option="image")
    driver_image_registry: ImageRegistry | None = _setting(
        None, "Without driverImage: a registry repository of yours to push the built driver image to, e.g. "
        "123456789012.dkr.ecr.us-east-2.amazonaws.com/neuron-dra-driver, tagged <version>-<content hash>, with the "
        "Docker credentials of the machine running pulumi up (docker login or a credential helper); the stack then "
        "creates no ECR repository.")
    driver_repository_force_delete: StrictBool = _setting(
        False, "Let pulumi destroy delete the driver's ECR repository with its images (without driverImage; "
        "default false: ECR refuses while it holds images).")
    driver_name: DriverName = _setting(
        DEFAULT_DRIVER_NAME, "DRA driver name. Its DeviceClasses are named after it (neuron.aws.com: neuron.aws.com "
        "and neuroncore.aws.com; another name N: N and cores.N) and the claim templates name them.",
        option="driver_name")
    driver_namespace: str = _setting(
        "", "Namespace of the driver (default: neuron-dra-driver for the default driverName, else "
        "neuron-dra-<driverName with dots as dashes>; it also names the ClusterRole).", option="namespace")
    driver_metrics_port: StrictInt = _setting(0, "Prometheus metrics port of the driver (0: off).",
                                              option="metrics_port")
    metrics_scrape_namespaces: tuple[str, ...] = _setting(
        ("monitoring",), "Namespaces whose pods the driver's NetworkPolicy lets scrape the metrics port.",
        option="metrics_scrape_namespaces")
    metrics_scrape_pod_labels: tuple[str, ...] = _setting(
        (), "KEY=VALUE labels: of the scrape namespaces' pods only those with all of them may scrape (default: "
        "every pod there), e.g. app.kubernetes.io/name=prometheus.", option="metrics_scrape_pod_labels")
    pod_monitor: PodMonitorMode = _setting(
        "auto", "A prometheus-operator PodMonitor for the driver pods (with driverMetricsPort): true, false, or "
        "auto: on an existing cluster when it serves the PodMonitor CRD (asked while the program runs), off on a "
        "new cluster (nothing here installs prometheus-operator). docs/metrics.md.", option="pod_monitor")
    pod_monitor_labels: tuple[str, ...] = _setting(
        (), "KEY=VALUE labels of the PodMonitor (what the Prometheus's podMonitorSelector selects, e.g. "
        "release=kube-prometheus-stack).", option="pod_monitor_labels")
    grafana_dashboard: StrictBool = _setting(
        True, "Install the driver's Grafana dashboard (`neuron-dra dashboard`) as a ConfigMap for the Grafana "
        "sidecar (with driverMetricsPort).", option="grafana_dashboard")
    grafana_dashboard_label: str = _setting(
        DEFAULT_DASHBOARD_LABEL, "KEY=VALUE label the Grafana sidecar selects dashboards by (kube-prometheus-stack's "
        "default grafana_dashboard=1).", option="grafana_dashboard_label")
    grafana_dashboard_namespace: str = _setting(
        "", "Namespace of the dashboard ConfigMap (default: the driver's; the sidecar must search it).",
        option="grafana_dashboard_namespace")
    neuron_monitor: StrictBool = _setting(
        True, "Run AWS's neuron-monitor with its Prometheus exporter on the Neuron nodes, for the dashboard's "
        "NeuronCore utilisation per pod and per claim; false opts out. Not privileged: it gets the node's devices "
        "through a DRA claim with admin access. Left out where the driver publishes NeuronCores (counters). "
        "docs/utilisation.md.", option="neuron_monitor")
    driver_rollout_timeout_seconds: Annotated[StrictInt, rule(_is_rollout_timeout, ROLLOUT_TIMEOUT_ALLOWED)] = _setting(
        DEFAULT_ROLLOUT_TIMEOUT_SECONDS, "How long `pulumi up` waits for the driver's DaemonSet to roll out (every "
        "scheduled pod updated and ready) before it fails; 0: do not wait (the DaemonSet is created and the update "
        "goes on).")
    driver_max_surge: StrictInt = _setting(
        1, "Nodes at a time whose driver pod gets its replacement started beside it during a rollout (both serve "
        "until the old one stops; docs/upgrades.md).", option="max_surge")
    driver_max_unavailable: StrictInt = _setting(
        0, "Nodes at a time whose driver pod is stopped before its replacement starts during a rollout (0 with "
        "driverMaxSurge 1: no node is ever without the driver).", option="max_unavailable")
    neuron_core_device_class: str = _setting(
        "", "DeviceClass of NeuronCores (Kubernetes 1.36+; docs/neuron-cores.md; default: neuroncore.aws.com for "
        "the default driverName, else cores.<driverName>).", option="core_device_class_name")
    extended_resource_name: str = _setting(
        DEFAULT_EXTENDED_RESOURCE, "Extended resource the whole-device DeviceClass serves to pods written for the "
        "Neuron device plugin ('' for none; left out before Kubernetes 1.36).", option="extended_resource_name")
    core_extended_resource_name: str = _setting(
        AUTO, "Extended resource the NeuronCore DeviceClass serves (logical cores at the node's LNC): auto "
        "(aws.amazon.com/neuroncore where the driver publishes NeuronCores), a name (on Kubernetes 1.36 it also "
        "turns NeuronCores on), or '' for none; left out before Kubernetes 1.36.",
        option="core_extended_resource_name")
    core_partitions: str = _setting(
        AUTO, "NeuronCores with shared counters beside whole devices (the daemon's --core-partitions): auto (on "
        "Kubernetes 1.37+; on 1.36 only when a claim template requests NeuronCores or coreExtendedResourceName "
        "names a resource, since the 1.36 scheduler's cost per claim pod grows with nodes squared: docs/scale.md), "
        "on, or off.", option="core_partitions")
    allow_slow_claim_scheduling: StrictBool = _setting(
        False, "Deploy NeuronCores on Kubernetes 1.36 even where the predicted scheduler time per claim pod at the "
        "node groups' and pools' maximum size passes the scheduler's 10 s DRA filter limit (preview refuses it "
        "otherwise).")
    kubelet_plugins_dir: str = _setting(DEFAULT_PLUGINS_DIR, "kubelet's plugins directory on the nodes.",
                                        option="plugins_dir")
    kubelet_registry_dir: str = _setting(DEFAULT_REGISTRY_DIR, "kubelet's plugin registry directory on the nodes.",
                                         option="registry_dir")
    driver_host_paths_root: str = _setting(
        "/", "Directory on the nodes holding the sys, dev and opt/aws/neuron trees the driver reads: / on real "
        "Neuron nodes; /run/neuron-dra-host on `neuron-dra cluster up`'s nodes, whose emulated Neuron host tree is "
        "there.", option="host_paths_root")
    efa_driver: EfaDriverMode = _setting(
        "auto", "AWS's EFA DRA driver (DRANET, Helm chart aws-dranet; docs/efa-dra-driver.md): auto installs it on "
        "the node groups with EFA interfaces (none on an existing cluster), install also on an existing cluster's "
        "EFA instance types (clusterInstanceTypes), external when the cluster already runs one. Claim templates "
        "that request EFA devices need one of them.")
    claim_templates_module: Annotated[str, rule(lambda m: not m or _MODULE.match(m),
                                                 "a dotted Python module name, or '' for none")] = _setting(
        DEFAULT_CLAIM_TEMPLATES_MODULE, "Python module whose module-level claim templates are deployed and checked "
        "against the node groups ('' for none).")
    cluster_instance_types: tuple[str, ...] = _setting(
        (), "Existing-cluster mode: the Neuron instance types of its nodes; claim templates are checked against them "
        "(default: every catalog type).")
    catalog_file: str | None = _setting(
        None, "A catalog file (YAML, docs/catalog-file.md) that adds or overrides instance types: node groups may use "
        "them, claim templates are checked against them, and the driver pods get the file (a ConfigMap), so a new "
        "instance type needs no new release.")
    # The catalog of instance types: BUILTIN, extended by catalog_file (the decoder loads the file once).
    hardware: Catalog = Field(default=BUILTIN, exclude=True, repr=False)

    @model_validator(mode="after")
    def _check(self) -> StackSettings:
        n = setting_name
        for t in self.cluster_instance_types:
            if t not in self.hardware:
                raise SettingError(n("clusterInstanceTypes"), t, ", ".join(self.hardware.names))
        if not self.existing_cluster:  # before the driver's own range (1.34-1.37): EKS's, in its words
            check_eks_version(n("kubernetesVersion"), self.kubernetes_version)
        self.driver_options()  # the driver settings, checked where they are used
        if self.driver_image is not None and self.driver_image_registry is not None:
            raise SettingError(n("driverImageRegistry"), self.driver_image_registry,
                               "unset when driverImage is given (the registry is where a built image goes)")
        if self.existing_cluster:
            if self.driver_image is None and self.driver_image_registry is None:
                raise SettingError(n("driverImage"), None, EXISTING_CLUSTER_IMAGE)
            return self
        if not self.node_groups and not self.node_pools:
            raise SettingError(n("nodeGroups"), [], "at least one node group or Karpenter node pool (nodePools)")
        pools: set[str] = set()
        for p in self.node_pools:
            if p.name in pools:
                raise SettingError(p._at("name"), p.name, "a name no other node pool has")
            pools.add(p.name)
        seen: set[str] = set()
        for g in self.node_groups:
            if g.name in seen:
                raise SettingError(g._at("name"), g.name, "a name no other node group has")
            seen.add(g.name)
            if g.version is not None and parse_kubernetes_version(g._at("version"), g.version) > \
                    parse_kubernetes_version(n("kubernetesVersion"), self.kubernetes_version):
                raise SettingError(g._at("version"), g.version,
                                   f"at most the control plane's version {self.kubernetes_version}")
            if g.capacity_block and g.version not in (None, self.kubernetes_version) and g.desired_size != 0:
                raise SettingError(g._at("desiredSize"), g.desired_size,
                                   "0 while a Capacity Block node group is upgraded (EKS requires it)")
        self._check_network()
        if self.vpc_cni_version is not None:
            cni = parse_addon_version(n("vpcCniVersion"), self.vpc_cni_version)
            if self.vpc_cni_network_policy and cni < MIN_VPC_CNI_FOR_NETWORK_POLICY:
                raise SettingError(n("vpcCniVersion"), self.vpc_cni_version,
                                   "v1.14.0 or newer: the VPC CNI enforces NetworkPolicies "
                                   f"({n('vpcCniNetworkPolicy')}; or set it to false)")
            efa_only = [g.name for g in self.node_groups if g.uses_efa_only] + [
                p.name for p in self.node_pools if p.efa_count]
            if efa_only and cni < MIN_VPC_CNI_FOR_EFA_ONLY:
                raise SettingError(n("vpcCniVersion"), self.vpc_cni_version,
                                   f"v1.18.4 or newer: node groups {', '.join(efa_only)} use EFA-only interfaces "
                                   "(or set their efaInterfaceType to efa)")
        return self

    def _check_network(self) -> None:
        n = setting_name
        if self.vpc_id is None:
            for key in ("private_subnet_ids", "public_subnet_ids"):
                if getattr(self, key):
                    raise SettingError(n(key_of(key)), list(getattr(self, key)), "unset unless vpcId is set")
            for g in self.node_groups:
                if g.subnet_ids:
                    raise SettingError(g._at("subnetIds"), list(g.subnet_ids),
                                       "unset unless vpcId is set (use availabilityZone with a new VPC)")
            return
        if len(self.private_subnet_ids) < 2:
            raise SettingError(n("privateSubnetIds"), list(self.private_subnet_ids),
                               "at least two subnets of vpcId in different AZs (EKS requires two AZs)")
        if self.availability_zones:
            raise SettingError(n("availabilityZones"), list(self.availability_zones),
                               "unset with vpcId (the given subnets decide the AZs)")


    @property
    def existing_cluster(self) -> bool:
        return self.kubeconfig is not None

    def driver_options(self) -> DriverDeployOptions:
        """The driver's deployment options; a bad value is reported under its setting's name."""
        try:
            # What the cluster's minor does not serve is left out by the driver's manifests (KUBERNETES_FEATURES).
            parse_kubernetes_version(setting_name("kubernetesVersion"), self.kubernetes_version)
            options = DriverDeployOptions(
                driver_name=self.driver_name, namespace=self.driver_namespace, metrics_port=self.driver_metrics_port,
                plugins_dir=self.kubelet_plugins_dir, registry_dir=self.kubelet_registry_dir,
                host_paths_root=self.driver_host_paths_root,
                core_device_class_name=self.neuron_core_device_class,
                extended_resource_name=self.extended_resource_name or None,
                core_extended_resource_name=(DEFAULT_CORE_EXTENDED_RESOURCE if self.core_extended_resource_name == AUTO
                                             else self.core_extended_resource_name or None),
                core_partitions=self.core_partitions,
                kubernetes_version=self.kubernetes_version, max_surge=self.driver_max_surge,
                max_unavailable=self.driver_max_unavailable,
                metrics_scrape_namespaces=self.metrics_scrape_namespaces,
                metrics_scrape_pod_labels=_key_values(setting_name(key_of("metrics_scrape_pod_labels")),
                                                      self.metrics_scrape_pod_labels),
                # auto: decided against the cluster by the stack (components/monitoring.py)
                pod_monitor=self.pod_monitor == "true",
                pod_monitor_labels=_key_values(setting_name(key_of("pod_monitor_labels")), self.pod_monitor_labels),
                # The dashboard shows the metrics: none without them.
                grafana_dashboard=self.grafana_dashboard is True and self.driver_metrics_port != 0,
                grafana_dashboard_label=self.grafana_dashboard_label,
                grafana_dashboard_namespace=self.grafana_dashboard_namespace,
                neuron_monitor=self.neuron_monitor,
            )
            if self.grafana_dashboard is not True and self.grafana_dashboard is not False:
                raise SettingError(setting_name(key_of("grafana_dashboard")), self.grafana_dashboard,
                                   "true or false")
            if self.catalog_file is not None:
                # The file's text goes into a ConfigMap the driver pods mount (DriverDeployOptions.catalog_yaml).
                options = options.replace(catalog_yaml=Path(self.catalog_file).expanduser().read_text())
            if self.driver_image is not None:
                DriverDeployOptions(image=self.driver_image)
        except DeployOptionError as e:
            raise e.restated(SettingError, setting_name(key_of_option(e.option))) from e
        return options

    def resolved_cluster_name(self, stack: str) -> str:
        return self.cluster_name or f"{PROJECT}-{stack}"[:100]

    @property
    def node_instance_types(self) -> tuple[str, ...]:
        """The instance types claim templates are checked against."""
        if self.existing_cluster:
            return self.cluster_instance_types or self.hardware.names
        return tuple(dict.fromkeys((*(g.instance_type for g in self.node_groups),
                                    *(t for p in self.node_pools for t in p.types))))

    @property
    def check_targets(self) -> tuple[str, ...]:
        """What claim templates are checked against: the node groups' and pools' instance types at their LNC
        (`trn2.48xlarge:lnc=1` for a group with lnc 1), or the existing cluster's instance types."""
        if self.existing_cluster:
            return self.node_instance_types
        return tuple(dict.fromkeys((*(g.check_target for g in self.node_groups),
                                    *(t for p in self.node_pools for t in p.check_targets))))

    @property
    def efa_check_targets(self) -> tuple[str, ...]:
        """Where the EFA DRA driver runs (new cluster): the node groups with EFA interfaces and the pools whose
        nodes get them (one EFA count for all the pool's types: `NodePoolSettings.efa_count`)."""
        return tuple(dict.fromkeys((*(g.check_target for g in self.node_groups if g.is_efa),
                                    *(t for p in self.node_pools if p.efa_count for t in p.check_targets))))

    @property
    def asks_for_core_extended_resource(self) -> bool:
        """coreExtendedResourceName names a resource (not auto, not ''): pods for it need NeuronCores."""
        return self.core_extended_resource_name not in (AUTO, "")

    @property
    def max_nodes(self) -> int | None:
        """The most nodes the stack's node groups and pools can have at once (None: an existing cluster)."""
        if self.existing_cluster:
            return None
        return sum(g.maximum for g in self.node_groups) + sum(p.node_limit for p in self.node_pools)

    @property
    def uses_efa_only(self) -> bool:
        """Some node group or pool has EFA-only interfaces (they need VPC CNI 1.18.4+)."""
        return any(g.uses_efa_only for g in self.node_groups) or any(p.efa_count for p in self.node_pools)


def _key_values(setting: str, items: tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` strings as a mapping (the values are checked as labels by DriverDeployOptions)."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = str(item).partition("=")
        if not eq or not key:
            raise SettingError(setting, item, "KEY=VALUE strings such as app.kubernetes.io/name=prometheus")
        out[key] = value
    return out



# Field -> config key and driver option -> config key of the stack's settings, from the fields' aliases.
STACK_KEY_OF_FIELD: Mapping[str, str] = {
    name: _alias(name) for name, f in StackSettings.model_fields.items() if not f.exclude
}
STACK_FIELD_OF_KEY: Mapping[str, str] = {key: name for name, key in STACK_KEY_OF_FIELD.items()}
STACK_KEY_OF_OPTION: Mapping[str, str] = {
    str(f.json_schema_extra["option"]): _alias(name) for name, f in StackSettings.model_fields.items()
    if isinstance(f.json_schema_extra, dict) and "option" in f.json_schema_extra
}


def key_of(field_name: str) -> str:
    return STACK_KEY_OF_FIELD[field_name]


def key_of_option(option: str) -> str:
    return STACK_KEY_OF_OPTION.get(option, option)
