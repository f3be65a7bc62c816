"""`DriverDeployOptions`: everything that varies between installations of the driver, each value checked once.

A frozen pydantic model: the field types and their checks refuse a bad value, `_check` what depends on several
fields; every refusal is a DeployOptionError naming the field, the value and what is allowed (`errortext.restate`,
the wording of `_ALLOWED`). `deploy.manifests` renders the driver's objects from these options. No Pulumi import.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from neuron_dra.driver.errortext import checked, restate
from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, Catalog
from neuron_dra.driver.model.catalog_file import CatalogFileError, parse_catalog_text
from neuron_dra.driver.model.errors import NotAllowed
from neuron_dra.driver.model.k8s_names import (
    CORE_PARTITION_MODES,
    COUNTERS_PER_NODE_MINOR,
    DEFAULT_CDI_ROOT,
    DEFAULT_DRIVER_NAME,
    DEFAULT_HEALTHCHECK_PORT,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    DEFAULT_TAINT_EFFECT,
    LABEL_KEY_RULE,
    LABEL_VALUE_RULE,
    NEURON_CORE_RESOURCE,
    NEURON_DEVICE_RESOURCE,
    TAINT_EFFECTS,
    DeviceClassNames,
    check_dns_label,
    check_dns_subdomain,
    check_driver_name,
    device_class_names,
    is_label_key,
    is_label_value,
    ultraserver_class_name,
)
from neuron_dra.driver.model.version import VERSION

Manifest = dict[str, Any]

DEFAULT_NAMESPACE = "neuron-dra-driver"
DEFAULT_SERVICE_ACCOUNT = "neuron-dra-driver-sa"
DEFAULT_DAEMONSET = "neuron-dra-driver-kubelet-plugin"
DEFAULT_HOST_ROOT = "/host"
# The UltraServer group controller's Deployment, ServiceAccount and Lease (deploy/ultraserver.py DEFAULT_NAME).
ULTRASERVER_CONTROLLER_NAME = "neuron-dra-ultraserver"
# The image this repository's release workflow publishes (.github/workflows/release-image.yml; multi-arch, SBOM,
# cosign keyless signature), tagged with the package version: the default of renders outside Pulumi. The Pulumi
# components build and push their own image unless given one (components/driver_image.py).
IMAGE_REPOSITORY = "ghcr.io/neuron-dra/neuron-dra-driver"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{VERSION}"
DEFAULT_EXTENDED_RESOURCE = NEURON_DEVICE_RESOURCE  # the Neuron device plugin's resource names
DEFAULT_CORE_EXTENDED_RESOURCE = NEURON_CORE_RESOURCE
DEFAULT_DASHBOARD_LABEL = "grafana_dashboard=1"  # the label kube-prometheus-stack's Grafana sidecar selects

_EXTENDED_RESOURCE = re.compile(r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
                                r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")
_MINOR = re.compile(r"^1\.(\d{2})$")
MIN_MINOR = 34  # resource.k8s.io/v1
MAX_ROLLOUT_PODS = 10_000  # maxSurge / maxUnavailable count nodes (each with at most two driver pods at once)
_PORT = "0 (off) or a TCP port 1-65535"
_ROLLOUT = f"a whole number of nodes from 0 to {MAX_ROLLOUT_PODS}"
_EXTENDED = "an extended resource name such as aws.amazon.com/neuron (domain/name, not in kubernetes.io), or None to " \
            "leave it out"
_PATH = "an absolute, normalised path other than /"
_FLAG = "true or false"
# What a field allows, for pydantic's own refusals (type, range, choice, the checks of `_must`).
_ALLOWED = {
    "image": "a container image reference without spaces",
    "image_pull_policy": "Always, IfNotPresent, Never",
    "extended_resource_name": _EXTENDED, "core_extended_resource_name": _EXTENDED,
    "plugins_dir": _PATH, "registry_dir": _PATH, "cdi_root": _PATH, "host_root": _PATH,
    "host_paths_root": "/ or an absolute, normalised directory path",
    "healthcheck_port": _PORT, "metrics_port": _PORT,
    "metrics_service": _FLAG, "pod_monitor": _FLAG, "grafana_dashboard": _FLAG, "neuron_monitor": _FLAG,
    "grafana_dashboard_label": f"KEY=VALUE with {LABEL_KEY_RULE} and {LABEL_VALUE_RULE}",
    "kubernetes_version": f"a Kubernetes minor such as 1.36, at least 1.{MIN_MINOR} (resource.k8s.io/v1), or None "
                          "for the newest",
    "kube_api_qps": "a number from 0.1 to 1000", "kube_api_burst": "a whole number from 1 to 1000",
    "kube_api_timeout": "a number from 0.5 to 40", "max_surge": _ROLLOUT, "max_unavailable": _ROLLOUT,
    "core_partitions": ", ".join(CORE_PARTITION_MODES), "unhealthy_taint_effect": ", ".join(TAINT_EFFECTS),
    "ultraserver_groups": _FLAG, "ultraserver_shared_counters": "auto, off",
}


def _must(test: Callable[[Any], bool]) -> AfterValidator:
    """A check pydantic has no constraint for; the refusal's wording is the field's in _ALLOWED."""

    def check(value: Any) -> Any:
        if not test(value):
            raise ValueError("not allowed")
        return value

    return AfterValidator(check)


def _labels_checked(option: str, labels: object) -> object:
    if not isinstance(labels, Mapping):
        raise DeployOptionError(option, labels, "a mapping of label keys to values")
    for k, v in labels.items():
        if not is_label_key(k):
            raise DeployOptionError(option, f"{k}={v}", f"KEY=VALUE labels, KEY {LABEL_KEY_RULE}")
        if not is_label_value(v):
            raise DeployOptionError(option, f"{k}={v}", f"KEY=VALUE labels, VALUE {LABEL_VALUE_RULE}")
    return labels


def _is_path(value: str) -> bool:
    return value.startswith("/") and value.rstrip("/") != "" and "//" not in value and "/../" not in f"{value}/"


def _is_node_root(value: str) -> bool:
    return value == "/" or (_is_path(value) and not value.endswith("/"))


def _is_minor(value: str) -> bool:
    m = _MINOR.match(value)
    return m is not None and int(m.group(1)) >= MIN_MINOR


def _is_dashboard_label(value: str) -> bool:
    key, eq, label = value.partition("=")
    return bool(eq) and is_label_key(key) and is_label_value(label)


_Str = Annotated[str, Field(strict=True)]
_Path = Annotated[str, Field(strict=True), _must(_is_path)]
_Port = Annotated[int, Field(strict=True, ge=0, le=65535)]
_Rollout = Annotated[int, Field(strict=True, ge=0, le=MAX_ROLLOUT_PODS)]
_Flag = Annotated[bool, Field(strict=True)]
_Subdomain = Annotated[str, checked(check_dns_subdomain)]
_Extended = Annotated[str | None, Field(strict=True),
                      _must(lambda v: v is None or (bool(_EXTENDED_RESOURCE.match(v))
                                                    and not v.startswith(("kubernetes.io/", "requests."))))]
_Labels = Annotated[Mapping[str, str], checked(_labels_checked)]
# A DRA driver name (k8s_names.check_driver_name): the one check of the driver name for every model that takes one
# (these options, the stack's driverName); the daemon's --driver-name runs the same check without pydantic.
DriverName = Annotated[str, checked(check_driver_name)]


# The first Kubernetes minor (1.N) that serves, on by default, what parts of the driver's objects use
# (docs/kubernetes-versions.md §2). The one place the version rule lives: the Pulumi components and the default
# stack render through it.
KUBERNETES_FEATURES: Mapping[str, int] = {
    # DeviceClass.extendedResourceName (DRAExtendedResource, beta on in 1.36)
    "extended_resource_name": 36,
    # the NeuronCore DeviceClass: cores are partitions of devices (DRAPartitionableDevices, beta on in 1.36)
    "core_device_class": 36,
    # the unhealthy-device taint setting: ResourceSlice device taints (DRADeviceTaints, beta on in 1.36)
    "device_taints": 36,
    # NeuronCores published without being asked (core_partitions auto): the scheduler keeps each node's counter
    # slices to that node (kubernetes#138917); before it every claim pod costs nodes squared (docs/scale.md §2)
    "core_partitions_by_default": COUNTERS_PER_NODE_MINOR,
}



def namespace_for(driver_name: str) -> str:
    """The default namespace of an installation: DEFAULT_NAMESPACE for the default driver name, else
    `neuron-dra-<driver name with dots as dashes>` (cut to a DNS label with a hash of the name when longer)."""
    if driver_name == DEFAULT_DRIVER_NAME:
        return DEFAULT_NAMESPACE
    name = f"neuron-dra-{driver_name.replace('.', '-')}"
    if len(name) <= 63:
        return name
    return f"{name[:54].rstrip('-')}-{hashlib.sha256(driver_name.encode()).hexdigest()[:8]}"


class DeployOptionError(NotAllowed):
    """A deployment option that cannot work; `field` is the DriverDeployOptions field."""

    @property
    def option(self) -> str:
        return self.field

    def where(self) -> str:
        return f"driver option {self.field}"



@dataclass(frozen=True)
class Resources:
    """Container resources. No CPU limit by default: CFS throttling of a Python daemon can push kubelet's
    1 s GetInfo deadline over the edge; the memory limit bounds the daemon (target RSS <= 64 MiB)."""

    cpu_request: str = "10m"
    memory_request: str = "128Mi"
    memory_limit: str | None = "256Mi"
    cpu_limit: str | None = None

    def to_api(self) -> Manifest:
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if v is not None}
        out: Manifest = {"requests": {"cpu": self.cpu_request, "memory": self.memory_request}}
        if limits:
            out["limits"] = limits
        return out


class DriverDeployOptions(BaseModel):
    """Everything that varies between installations of the driver; a refusal is a DeployOptionError naming the
    field, the value and what is allowed (pydantic checks each field, `_check` their combinations). Keyword
    arguments only; `replace(**changes)` is a checked copy.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    image: Annotated[str, Field(strict=True, min_length=1, pattern=r"^\S+$")] = DEFAULT_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    driver_name: DriverName = DEFAULT_DRIVER_NAME
    device_class_name: _Subdomain | None = None  # None: the driver name, as AWS's chart does
    # NeuronCores (docs/neuron-cores.md §4): their DeviceClass, and the extended resources that the two classes
    # serve to pods written for the Neuron device plugin (None: no extendedResourceName; Kubernetes < 1.36).
    core_device_class_name: str = ""  # "": derived from driver_name (device_class_names)
    extended_resource_name: _Extended = DEFAULT_EXTENDED_RESOURCE
    core_extended_resource_name: _Extended = DEFAULT_CORE_EXTENDED_RESOURCE
    namespace: str = ""  # "": derived from driver_name (namespace_for); it names the ClusterRole/Binding too
    service_account: _Subdomain = DEFAULT_SERVICE_ACCOUNT
    daemonset_name: _Subdomain = DEFAULT_DAEMONSET
    plugins_dir: _Path = DEFAULT_PLUGINS_DIR
    registry_dir: _Path = DEFAULT_REGISTRY_DIR
    cdi_root: _Path = DEFAULT_CDI_ROOT
    host_root: _Path = DEFAULT_HOST_ROOT  # inside the container; /sys and /dev are mounted below it
    # On the node: the directory holding the sys, dev and opt/aws/neuron trees the driver reads ("/" on a real
    # node; a local cluster's emulated host tree).
    host_paths_root: Annotated[str, Field(strict=True), _must(_is_node_root)] = "/"
    healthcheck_port: _Port = DEFAULT_HEALTHCHECK_PORT  # 0: no health server, no liveness probe
    metrics_port: _Port = 0  # 0: no metrics endpoint
    # Namespaces whose pods may scrape the metrics port (the NetworkPolicy admits nothing else; kubelet's probe
    # comes from the pod's own node, which a NetworkPolicy cannot block: docs/network-policy.md).
    metrics_scrape_namespaces: tuple[Annotated[str, checked(check_dns_label)], ...] = ("monitoring",)
    # ... and of those namespaces' pods only these (empty: every pod there), e.g. {"app.kubernetes.io/name":
    # "prometheus"}.
    metrics_scrape_pod_labels: _Labels = Field(default_factory=dict)
    # Discovery of the metrics port (docs/metrics.md): a headless Service over the driver pods, and a
    # prometheus-operator PodMonitor (the cluster must have its CRD) with the labels its Prometheus selects.
    metrics_service: _Flag = True
    pod_monitor: _Flag = False
    pod_monitor_labels: _Labels = Field(default_factory=dict)
    # The Grafana dashboard (deploy/dashboard.py) as a ConfigMap with the label the Grafana sidecar watches
    # (KEY=VALUE; kube-prometheus-stack's default), in this namespace ("": the driver's).
    grafana_dashboard: _Flag = False
    # AWS's neuron-monitor with its Prometheus exporter on every driver node (deploy/exporter.py): NeuronCore
    # utilisation and memory, joined with the driver's attribution per pod and claim (docs/utilisation.md). On by
    # default, opt-out: it gets the node's devices through a DRA claim with admin access, not privileged; left out
    # where the driver publishes NeuronCores (runs_neuron_monitor).
    neuron_monitor: _Flag = True
    grafana_dashboard_label: Annotated[str, Field(strict=True), _must(_is_dashboard_label)] = DEFAULT_DASHBOARD_LABEL
    grafana_dashboard_namespace: Annotated[str, checked(lambda f, v: v and check_dns_label(f, v))] = ""
    instance_types: tuple[str, ...] = tuple(CATALOG)  # node affinity: nodes of these types only
    resources: Resources = Field(default_factory=Resources)
    priority_class_name: str = "system-node-critical"
    labels: Mapping[str, str] = Field(default_factory=dict)  # added to every object
    # The taint on devices with hardware errors (taints.py).
    unhealthy_taint_effect: Annotated[str, _must(TAINT_EFFECTS.__contains__)] = DEFAULT_TAINT_EFFECT
    catalog_yaml: str | None = None  # a catalog file's text: more instance types without a new image
    # The cluster's Kubernetes minor ("1.34"): what that minor does not serve is left out (`serves`,
    # KUBERNETES_FEATURES); None: everything, as on the newest minor.
    kubernetes_version: Annotated[str | None, Field(strict=True), _must(lambda v: v is None or _is_minor(v))] = None
    # The daemon's API client: client-side rate limit (the daemon's defaults, kubelet's: kubeletplugin/_ratelimit.py)
    # and each request's deadline.
    kube_api_qps: Annotated[float, Field(strict=True, ge=0.1, le=1000)] = 50.0
    kube_api_burst: Annotated[int, Field(strict=True, ge=1, le=1000)] = 100
    kube_api_timeout: Annotated[float, Field(strict=True, ge=0.5, le=40)] = 10.0
    # The DaemonSet's rolling update (docs/upgrades.md), in nodes at a time: with max_surge a new pod starts
    # beside the old one on a node and both serve until the old one stops (kubelet 1.33+ registers both), so no
    # node is without the driver; max_unavailable stops the old pod first (a gap until the new one registers).
    max_surge: _Rollout = 1
    max_unavailable: _Rollout = 0
    # NeuronCores with counters beside whole devices (the daemon's --core-partitions): on, off, or auto (where
    # the cluster's minor has the scheduler's counter fix, 1.37+; `publishes_cores`). Without them there is no
    # NeuronCore DeviceClass: a pod asking for one could never be scheduled.
    core_partitions: Annotated[str, _must(CORE_PARTITION_MODES.__contains__)] = "auto"
    # The UltraServer group controller beside the driver (deploy/ultraserver.py, docs/ultraserver.md §3): its
    # Deployment (the driver's image), ServiceAccount, RBAC, Lease Role, the two admission policies that keep it
    # to group slices and its members' labels, and the group DeviceClass `ultraserver.<driver name>`. Off by
    # default: only a cluster with UltraServer capacity (trn2u, trn3p) has groups to publish. The Pulumi
    # components leave it off and create the controller with UltraServerGroups (components/ultraserver.py).
    ultraserver_groups: _Flag = False
    # The controller's --shared-counters (UltraServerControllerOptions.shared_counters): off by default, since on
    # 1.36 counter slices cost every DRA pod's scheduling (docs/ultraserver.md §2a).
    ultraserver_shared_counters: Literal["auto", "off"] = "off"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            error = restate(e, DeployOptionError, allowed=_ALLOWED)
            raise error from error.__cause__ or e

    def replace(self, **changes: Any) -> DriverDeployOptions:
        """A copy with `changes`, checked as a new one is (pydantic's `model_copy` checks nothing)."""
        return type(self)(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})

    @model_validator(mode="after")
    def _check(self) -> DriverDeployOptions:
        """What depends on more than one field, once pydantic has checked each."""
        # Names left empty derive from the driver name, so two installations with different driver names never
        # share a cluster-scoped object (namespace, ClusterRole/Binding, admission policy/binding, DeviceClasses).
        if self.namespace == "":
            object.__setattr__(self, "namespace", namespace_for(self.driver_name))
        if self.core_device_class_name == "":
            object.__setattr__(self, "core_device_class_name", self.class_names.core_device_class)
        check_dns_label("namespace", self.namespace, DeployOptionError)
        check_dns_subdomain("core_device_class_name", self.core_device_class_name, DeployOptionError)
        if self.core_device_class_name == self.device_class:
            raise DeployOptionError("core_device_class_name", self.core_device_class_name,
                                    f"a name other than the device class {self.device_class}")
        if self.extended_resource_name is not None and \
                self.extended_resource_name == self.core_extended_resource_name:
            raise DeployOptionError("core_extended_resource_name", self.core_extended_resource_name,
                                    "a name other than extended_resource_name")
        if self.pod_monitor and not self.metrics_port:
            raise DeployOptionError("pod_monitor", self.pod_monitor, "false while metrics_port is 0 (no metrics "
                                    "endpoint to scrape)")
        if self.healthcheck_port and self.healthcheck_port == self.metrics_port:
            raise DeployOptionError("metrics_port", self.metrics_port, "a port other than healthcheck_port")
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise DeployOptionError("max_unavailable", self.max_unavailable,
                                    "at least 1 when max_surge is 0 (the rollout could never start)")
        if self.ultraserver_groups:
            self._check_ultraserver_names()
        if not self.instance_types:
            raise DeployOptionError("instance_types", self.instance_types, "at least one Neuron instance type")
        hardware = self.hardware  # a bad catalog file is refused here, naming its key path
        for t in self.instance_types:
            if t not in hardware:
                raise DeployOptionError("instance_types", t, ", ".join(hardware.names))
        for opt in ("cpu_request", "memory_request", "memory_limit", "cpu_limit"):
            q = getattr(self.resources, opt)
            if q is not None and not _QUANTITY.match(q):
                raise DeployOptionError(f"resources.{opt}", q, "a Kubernetes quantity such as 10m or 128Mi")
        return self

    def _check_ultraserver_names(self) -> None:
        """The controller's objects (deploy/ultraserver.py) beside the driver's: no name in common."""
        if self.service_account == ULTRASERVER_CONTROLLER_NAME:
            raise DeployOptionError("service_account", self.service_account,
                                    f"a name other than the UltraServer controller's ({ULTRASERVER_CONTROLLER_NAME})"
                                    " with ultraserver_groups")
        group_class = ultraserver_class_name(self.driver_name)
        for option in ("device_class_name", "core_device_class_name"):
            if getattr(self, option) == group_class:
                raise DeployOptionError(option, group_class, "a name other than the UltraServer group DeviceClass "
                                        f"({group_class}) with ultraserver_groups")

    def serves(self, feature: str) -> bool:
        """Whether the cluster's Kubernetes minor serves `feature` (a KUBERNETES_FEATURES key)."""
        if self.kubernetes_version is None:
            return True
        return int(self.kubernetes_version.split(".")[1]) >= KUBERNETES_FEATURES[feature]

    @property
    def publishes_cores(self) -> bool:
        """Whether the daemon publishes NeuronCores (and so the NeuronCore DeviceClass exists): the minor serves
        partitionable devices, and core_partitions is on, or auto where counters stay per node."""
        if not self.serves("core_device_class") or self.core_partitions == "off":
            return False
        return self.core_partitions == "on" or self.serves("core_partitions_by_default")

    @property
    def runs_neuron_monitor(self) -> bool:
        """Whether deploy.manifests() includes neuron-monitor (deploy/exporter.py): asked for, and the driver
        publishes no NeuronCores. With cores, whole devices consume counters, and the scheduler checks them for an
        admin-access claim too: the monitor's pod could not be scheduled on a node with a device in use
        (docs/utilisation.md, "Least privilege")."""
        return bool(self.neuron_monitor) and not self.publishes_cores

    @cached_property
    def hardware(self) -> Catalog:
        """The built-in catalog, extended by `catalog_yaml`."""
        if self.catalog_yaml is None:
            return BUILTIN
        try:
            return parse_catalog_text(self.catalog_yaml, "catalog_yaml")
        except CatalogFileError as e:
            raise DeployOptionError("catalog_yaml", "...",
                                    f"a valid catalog file (docs/catalog-file.md): {e}") from e

    @property
    def node_instance_types(self) -> tuple[str, ...]:
        """Node affinity: the chosen types; with the default choice, every type of the catalog (file types too)."""
        return self.hardware.names if self.instance_types == BUILTIN.names else self.instance_types

    @property
    def catalog_config_map(self) -> str:
        return f"{self.daemonset_name}-catalog"

    @property
    def class_names(self) -> DeviceClassNames:
        """The driver name and both DeviceClass names (`device_class_names`)."""
        return device_class_names(self.driver_name, self.device_class_name, self.core_device_class_name)

    @property
    def device_class(self) -> str:
        return self.class_names.device_class

    @property
    def plugin_dir(self) -> str:
        """The driver's own directory below kubelet's plugins dir: its DRA socket and its checkpoint."""
        return f"{self.plugins_dir.rstrip('/')}/{self.driver_name}"

    @property
    def service_account_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def cluster_role_name(self) -> str:
        return f"{self.namespace}:{self.service_account}"

    @property
    def admission_policy_name(self) -> str:
        return f"{self.namespace}.{self.driver_name}-resourceslices"

