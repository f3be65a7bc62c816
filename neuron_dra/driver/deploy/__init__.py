"""The driver's Kubernetes objects as plain dicts (`manifests()`): the one source of truth for every way of
installing it.

The Pulumi `NeuronDraDriver` component applies exactly these dicts, `neuron-dra plan -o yaml` prints them and
the local cluster applies them, so RBAC, the node-restricting admission policy and the DaemonSet are the same
everywhere. No Pulumi import here: the driver image must not need it.

Security choices (each one is what the daemon needs, nothing more):
- RBAC is the kubelet-plugin minimum (docs/dra-api.md §4): GET the claim being prepared, GET its
  own Node (owner reference, labels), full control of ResourceSlices. A ValidatingAdmissionPolicy narrows the
  latter to slices of the node the driver's pod runs on, using the node name the API server puts in pod-bound
  service-account tokens.
- The container is not privileged, drops every capability and adds none, has a read-only root filesystem and
  the runtime's default seccomp profile. It runs as uid 0 because kubelet's plugin and registry directories and
  the CDI directory are root-owned (0750/0700/0755): creating sockets and spec files there needs the owner's
  permission bits; without capabilities, uid 0 cannot bypass permissions anywhere else (no CAP_DAC_OVERRIDE).
- Host paths: only the driver's own subdirectory of the kubelet plugins dir (sockets and checkpoint), the
  registry dir, and the CDI dir are writable, each mounted at the same path as on the host because kubelet and
  the container runtime resolve those paths on the host. /sys and /dev are mounted read-only under the host
  root the daemon discovers devices from.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, ValidationInfo
from pydantic.dataclasses import dataclass as pydantic_dataclass

from neuron_dra.driver.deploy import monitoring
from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, Catalog
from neuron_dra.driver.model.catalog_file import CatalogFileError, parse_catalog_text
from neuron_dra.driver.model.errors import NotAllowed
from neuron_dra.driver.model.k8s_names import (
    CATALOG_ENV,
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
    LIVENESS_SERVICE,
    NEURON_CORE_RESOURCE,
    NEURON_DEVICE_RESOURCE,
    READINESS_SERVICE,
    TAINT_EFFECTS,
    DeviceClassNames,
    check_dns_label,
    check_dns_subdomain,
    check_driver_name,
    device_class_manifest,
    device_class_names,
    device_class_selector,
    is_label_key,
    is_label_value,
    neuron_toleration,
)
from neuron_dra.driver.model.slices import CAPACITY_BLOCK_LABEL as CAPACITY_BLOCK_LABEL  # re-exported for components
from neuron_dra.driver.model.version import VERSION

Manifest = dict[str, Any]

DEFAULT_NAMESPACE = "neuron-dra-driver"
DEFAULT_SERVICE_ACCOUNT = "neuron-dra-driver-sa"
DEFAULT_DAEMONSET = "neuron-dra-driver-kubelet-plugin"
DEFAULT_HOST_ROOT = "/host"
# A catalog file (docs/catalog-file.md) travels as a ConfigMap mounted here; NEURON_DRA_CATALOG points to it.
CATALOG_DIR = "/etc/neuron-dra"
CATALOG_KEY = "catalog.yaml"
# The image this repository's release workflow publishes (.github/workflows/release-image.yml; multi-arch, SBOM,
# cosign keyless signature), tagged with the package version: the default of renders outside Pulumi. The Pulumi
# components build and push their own image unless given one (components/driver_image.py).
IMAGE_REPOSITORY = "ghcr.io/neuron-dra/neuron-dra-driver"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{VERSION}"
DEFAULT_EXTENDED_RESOURCE = NEURON_DEVICE_RESOURCE  # the Neuron device plugin's resource names
DEFAULT_CORE_EXTENDED_RESOURCE = NEURON_CORE_RESOURCE
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"
# The driver cannot run on these EKS compute types (no host access or no Neuron kernel driver).
EXCLUDED_COMPUTE_TYPES = ("fargate", "hybrid", "auto")
# Host paths mounted read-only below the host root: what discovery reads (sysfs, the device nodes).
HOST_READ_ONLY_PATHS = ("/sys", "/dev")
LNC_CONFIG_DIR = "/opt/aws/neuron"  # holds logical_nc_config (partitions.LNC_FILE)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
DEFAULT_DASHBOARD_LABEL = "grafana_dashboard=1"  # the label kube-prometheus-stack's Grafana sidecar selects
# The DaemonSet's pod selector (also the NetworkPolicy's).
POD_SELECTOR = {"app.kubernetes.io/name": "neuron-dra-driver", "app.kubernetes.io/component": "kubelet-plugin"}
# Node labels the Pulumi node groups set: the node group, and the Capacity Block reservation a node belongs to
# (the daemon publishes the latter as `capacityBlockId` on UltraServers; CAPACITY_BLOCK_LABEL lives in slices.py).
NODE_GROUP_LABEL = "neuron-dra/node-group"
NODE_POOL_LABEL = "neuron-dra/node-pool"  # ... and the Karpenter NodePool a node belongs to (TrainiumNodePool)
# The node's Logical NeuronCore config (Trainium2/3 node groups), as the node group writes it to LNC_CONFIG_DIR.
LNC_LABEL = "neuron-dra/lnc"

# The RBAC rules the daemon needs: exactly the API calls the code makes, each with its caller
# (tests/driver/deploy/test_rbac.py records the daemon's calls against the API server and compares).
RBAC_RULES: tuple[Manifest, ...] = (
    # prepare (kube.py KubeClaimLookup): GET the claim named in NodePrepareResources to read its allocation.
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    # publisher.py and health_reporting.py: the Node's UID (owner reference, events), its labels (network layers).
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    # publisher.py: list and watch its node's slices (field selector), create, update (PUT) and delete them. No
    # get (it lists) and no patch (it replaces whole objects); docs/dra-api.md §4's wider minimum is not needed.
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["list", "watch", "create", "update", "delete"],
    },
    # device health: a DeviceUnhealthy / DeviceHealthy Event on the Node (health_reporting.py).
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)

# A qualified name with a domain prefix, as Kubernetes requires of extended resources.
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
    "metrics_service": _FLAG, "pod_monitor": _FLAG, "grafana_dashboard": _FLAG,
    "grafana_dashboard_label": f"KEY=VALUE with {LABEL_KEY_RULE} and {LABEL_VALUE_RULE}",
    "kubernetes_version": f"a Kubernetes minor such as 1.36, at least 1.{MIN_MINOR} (resource.k8s.io/v1), or None "
                          "for the newest",
    "kube_api_qps": "a number from 0.1 to 1000", "kube_api_burst": "a whole number from 1 to 1000",
    "kube_api_timeout": "a number from 0.5 to 40", "max_surge": _ROLLOUT, "max_unavailable": _ROLLOUT,
    "core_partitions": ", ".join(CORE_PARTITION_MODES), "unhealthy_taint_effect": ", ".join(TAINT_EFFECTS),
}


def _must(test: Callable[[Any], bool]) -> AfterValidator:
    """A check pydantic has no constraint for; the refusal's wording is the field's in _ALLOWED."""

    def check(value: Any) -> Any:
        if not test(value):
            raise ValueError("not allowed")
        return value

    return AfterValidator(check)


def _checked(check: Callable[[str, object, type[DeployOptionError]], object]) -> BeforeValidator:
    """A k8s_names check (its own wording), under the field's name; None passes (the field's default)."""
    return BeforeValidator(lambda v, info: v if v is None else check(info.field_name, v, DeployOptionError))


def _labels_checked(labels: object, info: ValidationInfo) -> object:
    option = str(info.field_name)
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
_Subdomain = Annotated[str, _checked(check_dns_subdomain)]
_Extended = Annotated[str | None, Field(strict=True),
                      _must(lambda v: v is None or (bool(_EXTENDED_RESOURCE.match(v))
                                                    and not v.startswith(("kubernetes.io/", "requests."))))]
_Labels = Annotated[Mapping[str, str], BeforeValidator(_labels_checked)]


def _restated(error: ValidationError) -> DeployOptionError:
    """pydantic's first refusal as a DeployOptionError: the check's own, else the field's wording in _ALLOWED."""
    e = error.errors()[0]
    cause = e.get("ctx", {}).get("error")
    if isinstance(cause, DeployOptionError):
        return cause
    option = str(e["loc"][0])
    return DeployOptionError(option, e["input"], _ALLOWED.get(option, e["msg"]))


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


@pydantic_dataclass(frozen=True)
class _DeployOptions:
    """Everything that varies between installations of the driver (`DriverDeployOptions`: refusals as
    DeployOptionError)."""

    image: Annotated[str, Field(strict=True, min_length=1, pattern=r"^\S+$")] = DEFAULT_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    driver_name: Annotated[str, _checked(check_driver_name)] = DEFAULT_DRIVER_NAME
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
    metrics_scrape_namespaces: tuple[Annotated[str, _checked(check_dns_label)], ...] = ("monitoring",)
    # ... and of those namespaces' pods only these (empty: every pod there), e.g. {"app.kubernetes.io/name":
    # "prometheus"}.
    metrics_scrape_pod_labels: _Labels = field(default_factory=dict)
    # Discovery of the metrics port (docs/metrics.md): a headless Service over the driver pods, and a
    # prometheus-operator PodMonitor (the cluster must have its CRD) with the labels its Prometheus selects.
    metrics_service: _Flag = True
    pod_monitor: _Flag = False
    pod_monitor_labels: _Labels = field(default_factory=dict)
    # The Grafana dashboard (deploy/dashboard.py) as a ConfigMap with the label the Grafana sidecar watches
    # (KEY=VALUE; kube-prometheus-stack's default), in this namespace ("": the driver's).
    grafana_dashboard: _Flag = False
    grafana_dashboard_label: Annotated[str, Field(strict=True), _must(_is_dashboard_label)] = DEFAULT_DASHBOARD_LABEL
    grafana_dashboard_namespace: Annotated[str, BeforeValidator(lambda v, info: v and check_dns_label(
        info.field_name, v, DeployOptionError))] = ""
    instance_types: tuple[str, ...] = tuple(CATALOG)  # node affinity: nodes of these types only
    resources: Resources = field(default_factory=Resources)
    priority_class_name: str = "system-node-critical"
    labels: Mapping[str, str] = field(default_factory=dict)  # added to every object
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

    def __post_init__(self) -> None:
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


class DriverDeployOptions(_DeployOptions):
    """Everything that varies between installations of the driver; a refusal is a DeployOptionError naming the
    field, the value and what is allowed (pydantic checks each field, `__post_init__` their combinations)."""

    if not TYPE_CHECKING:  # mypy checks callers against the dataclass's own __init__
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().__init__(*args, **kwargs)
            except ValidationError as e:
                raise _restated(e) from e


def _labels(options: DriverDeployOptions, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "neuron-dra-driver",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "neuron-dra",
        "app.kubernetes.io/version": VERSION,
        **options.labels,
    }


def _meta(options: DriverDeployOptions, name: str, component: str, namespaced: bool = False) -> Manifest:
    meta: Manifest = {"name": name, "labels": _labels(options, component)}
    if namespaced:
        meta["namespace"] = options.namespace
    return meta


def namespace(options: DriverDeployOptions) -> Manifest:
    # hostPath volumes are outside the baseline Pod Security level; say so explicitly so a cluster-wide
    # default of baseline/restricted reports it instead of silently refusing the DaemonSet's pods.
    meta = _meta(options, options.namespace, "namespace")
    meta["labels"].update({
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/warn": "baseline",
    })
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def service_account(options: DriverDeployOptions) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(options, options.service_account, "kubelet-plugin", namespaced=True),
    }


def cluster_role(options: DriverDeployOptions) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(options, options.cluster_role_name, "kubelet-plugin"),
        "rules": [{k: list(v) for k, v in rule.items()} for rule in RBAC_RULES],
    }


def cluster_role_binding(options: DriverDeployOptions) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta(options, options.cluster_role_name, "kubelet-plugin"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": options.cluster_role_name},
        "subjects": [{"kind": "ServiceAccount", "name": options.service_account, "namespace": options.namespace}],
    }


def admission_policy(options: DriverDeployOptions) -> Manifest:
    """Only this driver's slices of the node the driver's pod runs on: the node name comes from the pod-bound
    token; for UPDATE both the old and the new object must qualify, for DELETE the old one (docs/hardening.md §2)."""
    node_of_user = f"request.userInfo.extra[?'{NODE_NAME_EXTRA}'][0].orValue('')"
    node_of_slice = '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")'
    driver_of_slice = '(request.operation == "DELETE" ? oldObject : object).spec.driver'
    # UPDATE: the object as it was must be ours too (else a foreign slice could be rewritten into ours).
    node_before = 'request.operation == "UPDATE" ? oldObject.spec.?nodeName.orValue("") : variables.objectNodeName'
    driver_before = 'request.operation == "UPDATE" ? oldObject.spec.driver : variables.objectDriver'
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(options, options.admission_policy_name, "admission"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": ["resourceslices"],
                }],
            },
            "matchConditions": [{
                "name": "driver-service-account",
                "expression": f'request.userInfo.username == "{options.service_account_user}"',
            }],
            "variables": [
                {"name": "userNodeName", "expression": node_of_user},
                {"name": "objectNodeName", "expression": node_of_slice},
                {"name": "objectDriver", "expression": driver_of_slice},
                {"name": "oldNodeName", "expression": node_before},
                {"name": "oldDriver", "expression": driver_before},
            ],
            "validations": [
                # Forbidden (403), not the default Invalid (422): the request is not malformed, it is not allowed.
                {
                    "expression": 'variables.userNodeName != ""',
                    "reason": "Forbidden",
                    "message": (f"{options.service_account_user} must use a token bound to a pod on a node "
                                "(no node name in its credentials)"),
                },
                {
                    "expression": ("variables.userNodeName == variables.objectNodeName && "
                                   "variables.userNodeName == variables.oldNodeName"),
                    "reason": "Forbidden",
                    "messageExpression": (
                        "'the driver on node ' + variables.userNodeName + ' may not modify ' + "
                        "(variables.objectNodeName != variables.userNodeName ? "
                        "(variables.objectNodeName == '' ? 'ResourceSlices without a node' : "
                        "'ResourceSlices of node ' + variables.objectNodeName) : "
                        "(variables.oldNodeName == '' ? 'ResourceSlices without a node' : "
                        "'ResourceSlices of node ' + variables.oldNodeName))"
                    ),
                },
                {
                    "expression": (f'variables.objectDriver == "{options.driver_name}" && '
                                   f'variables.oldDriver == "{options.driver_name}"'),
                    "reason": "Forbidden",
                    "messageExpression": (
                        f"'the {options.driver_name} driver may not modify ResourceSlices of driver ' + "
                        f'(variables.objectDriver != "{options.driver_name}" ? variables.objectDriver : '
                        "variables.oldDriver)"
                    ),
                },
            ],
        },
    }


def admission_policy_binding(options: DriverDeployOptions) -> Manifest:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(options, options.admission_policy_name, "admission"),
        "spec": {"policyName": options.admission_policy_name, "validationActions": ["Deny"]},
    }


def metrics_service(options: DriverDeployOptions) -> Manifest:
    return monitoring.metrics_service(_meta(options, f"{options.daemonset_name}-metrics", "metrics", namespaced=True),
                                      POD_SELECTOR, options.metrics_port)


def pod_monitor(options: DriverDeployOptions) -> Manifest:
    meta = _meta(options, options.daemonset_name, "metrics", namespaced=True)
    meta["labels"].update(options.pod_monitor_labels)
    return monitoring.pod_monitor(meta, POD_SELECTOR, options.namespace)


def dashboard_config_map(options: DriverDeployOptions) -> Manifest:
    """The dashboard for the Grafana sidecar (imports the Grafana Foundation SDK, which only this needs)."""
    from neuron_dra.driver.deploy.dashboard import DASHBOARD_UID, dashboard_json

    meta = _meta(options, f"{options.daemonset_name}-dashboard", "dashboard", namespaced=True)
    meta["namespace"] = options.grafana_dashboard_namespace or options.namespace
    key, _, value = options.grafana_dashboard_label.partition("=")
    meta["labels"][key] = value
    return monitoring.dashboard_config_map(meta, dashboard_json(), f"{DASHBOARD_UID}.json")


def network_policy(options: DriverDeployOptions) -> Manifest:
    """Ingress to the driver's pods: the metrics port from the scrape namespaces (and pods), nothing else.

    kubelet's gRPC probes need no rule: the pods are on the pod network (no hostNetwork) and the probes come from
    the pod's own node, which NetworkPolicy always admits (the VPC CNI's agent admits the node's IP on every pod);
    a rule for the node's address range would admit every hostNetwork pod too (docs/network-policy.md). The
    kubelet-facing sockets are unix sockets on the host, outside any policy."""
    ingress: list[Manifest] = []
    if options.metrics_port and options.metrics_scrape_namespaces:
        ingress.append({
            "from": monitoring.scrape_peers(options.metrics_scrape_namespaces, options.metrics_scrape_pod_labels),
            "ports": [{"protocol": "TCP", "port": options.metrics_port}],
        })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(options, options.daemonset_name, "kubelet-plugin", namespaced=True),
        "spec": {"podSelector": {"matchLabels": dict(POD_SELECTOR)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _extended(options: DriverDeployOptions, name: str | None) -> str | None:
    return name if options.serves("extended_resource_name") else None


def device_class(options: DriverDeployOptions) -> Manifest:
    return device_class_manifest(options.device_class, options.driver_name,
                                 expression=device_class_selector(options.driver_name, False),
                                 extended_resource_name=_extended(options, options.extended_resource_name),
                                 labels=_labels(options, "device-class"))


def core_device_class(options: DriverDeployOptions) -> Manifest:
    return device_class_manifest(options.core_device_class_name, options.driver_name,
                                 expression=device_class_selector(options.driver_name, True),
                                 extended_resource_name=_extended(options, options.core_extended_resource_name),
                                 labels=_labels(options, "device-class"))


def driver_args(options: DriverDeployOptions) -> list[str]:
    """Flags for what has no environment variable in AWS's chart; the rest comes from `driver_env`."""
    args = ["--driver-name", options.driver_name, "--host-root", options.host_root]
    if options.metrics_port:
        args += ["--metrics-port", str(options.metrics_port)]
    mode = core_partitions_arg(options)
    if mode is not None:
        args += ["--core-partitions", mode]
    defaults = DriverDeployOptions()
    for opt in ("kube_api_qps", "kube_api_burst", "kube_api_timeout"):  # only when changed: no rollout otherwise
        if getattr(options, opt) != getattr(defaults, opt):
            args += [f"--{opt.replace('_', '-')}", f"{getattr(options, opt):g}"]
    return args


def core_partitions_arg(options: DriverDeployOptions) -> str | None:
    """The daemon's --core-partitions for `options`: what `publishes_cores` says, so the daemon publishes
    NeuronCores exactly where the NeuronCore DeviceClass is rendered; None (the daemon's own auto, the same rule
    against the API server's version) for auto where cores are published by default."""
    if options.core_partitions == "auto" and options.publishes_cores:
        return None
    return "on" if options.publishes_cores else "off"


def driver_env(options: DriverDeployOptions) -> list[Manifest]:
    """The environment of AWS's chart (the daemon's flags fall back to these names)."""

    def field_ref(path: str) -> Manifest:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        {"name": "NODE_NAME", **field_ref("spec.nodeName")},
        {"name": "POD_UID", **field_ref("metadata.uid")},
        # Where kubelet's probe connects (the node's IP under hostNetwork): the daemon's health and metrics
        # listen on this address only (docs/hardening.md §1).
        {"name": "POD_IP", **field_ref("status.podIP")},
        {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": options.plugins_dir},
        {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": options.registry_dir},
        {"name": "CDI_ROOT", "value": options.cdi_root},
        {"name": "HEALTHCHECK_PORT", "value": str(options.healthcheck_port)},
    ] + ([{"name": "UNHEALTHY_TAINT_EFFECT", "value": options.unhealthy_taint_effect}]
         if options.serves("device_taints") else []) + (
        [{"name": CATALOG_ENV, "value": f"{CATALOG_DIR}/{CATALOG_KEY}"}] if options.catalog_yaml is not None else [])


@dataclass(frozen=True)
class HostMount:
    """One hostPath volume and where it appears in the container."""

    name: str
    host_path: str
    mount_path: str
    read_only: bool
    host_path_type: str


def host_mounts(options: DriverDeployOptions) -> tuple[HostMount, ...]:
    # Sockets, CDI specs and the checkpoint: identical paths inside and outside (kubelet and the runtime
    # resolve them on the host). DirectoryOrCreate: a fresh node may not have the driver's dirs yet.
    writable = (
        HostMount("plugin-dir", options.plugin_dir, options.plugin_dir, False, "DirectoryOrCreate"),
        HostMount("registry-dir", options.registry_dir, options.registry_dir, False, "DirectoryOrCreate"),
        HostMount("cdi-root", options.cdi_root, options.cdi_root, False, "DirectoryOrCreate"),
    )
    host = options.host_root.rstrip("/")
    on_node = options.host_paths_root.rstrip("/")
    read_only = tuple(
        HostMount(f"host-{p.strip('/')}", f"{on_node}{p}", f"{host}{p}", True, "Directory")
        for p in HOST_READ_ONLY_PATHS
    )
    # The node's LNC file (docs/neuron-cores.md §2); the directory may not exist on a non-Neuron AMI.
    lnc = HostMount("host-neuron-config", f"{on_node}{LNC_CONFIG_DIR}", f"{host}{LNC_CONFIG_DIR}", True,
                    "DirectoryOrCreate")
    return (*writable, *read_only, lnc)


def _volume_mount(m: HostMount) -> Manifest:
    out: Manifest = {"name": m.name, "mountPath": m.mount_path}
    if m.read_only:
        # /sys and /dev carry submounts; make them read-only too where the runtime can.
        out.update({"readOnly": True, "recursiveReadOnly": "IfPossible"})
    return out


def _security_context() -> Manifest:
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        # uid 0 for the root-owned kubelet and CDI directories (see the module docstring); no capabilities.
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _affinity(options: DriverDeployOptions) -> Manifest:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{
                    "matchExpressions": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(options.node_instance_types)},
                        {"key": COMPUTE_TYPE_LABEL, "operator": "NotIn", "values": list(EXCLUDED_COMPUTE_TYPES)},
                    ],
                }],
            },
        },
    }


def daemonset(options: DriverDeployOptions) -> Manifest:
    selector = dict(POD_SELECTOR)
    mounts = host_mounts(options)
    container: Manifest = {
        "name": "plugin",
        "image": options.image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["neuron-dra-driver"],
        "args": driver_args(options),
        "env": driver_env(options),
        "resources": options.resources.to_api(),
        "securityContext": _security_context(),
        "volumeMounts": [_volume_mount(m) for m in mounts] + [{"name": "tmp", "mountPath": "/tmp"}],
    }
    ports = []
    if options.healthcheck_port:
        ports.append({"name": "healthz", "containerPort": options.healthcheck_port, "protocol": "TCP"})
        container["livenessProbe"] = {
            "grpc": {"port": options.healthcheck_port, "service": LIVENESS_SERVICE},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        }
        container["readinessProbe"] = {
            "grpc": {"port": options.healthcheck_port, "service": READINESS_SERVICE},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        }
    if options.metrics_port:
        ports.append({"name": "metrics", "containerPort": options.metrics_port, "protocol": "TCP"})
    if ports:
        container["ports"] = ports
    volumes: list[Manifest] = [
        {"name": m.name, "hostPath": {"path": m.host_path, "type": m.host_path_type}} for m in mounts
    ]
    # Python and grpc want a writable /tmp; the root filesystem is read-only.
    volumes.append({"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}})
    pod_annotations: Manifest = {}
    if options.catalog_yaml is not None:
        volumes.append({"name": "catalog", "configMap": {"name": options.catalog_config_map}})
        container["volumeMounts"].append({"name": "catalog", "mountPath": CATALOG_DIR, "readOnly": True})
        # A changed catalog rolls the pods: the daemon reads the file at start-up only.
        digest = hashlib.sha256(options.catalog_yaml.encode()).hexdigest()[:16]
        pod_annotations["neuron-dra/catalog-sha256"] = digest
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(options, options.daemonset_name, "kubelet-plugin", namespaced=True),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": options.max_surge, "maxUnavailable": options.max_unavailable}},
            "template": {
                "metadata": {"labels": {**_labels(options, "kubelet-plugin"), **selector},
                             **({"annotations": pod_annotations} if pod_annotations else {})},
                "spec": {
                    "serviceAccountName": options.service_account,
                    "priorityClassName": options.priority_class_name,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        neuron_toleration(),
                    ],
                    "affinity": _affinity(options),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def manifests(options: DriverDeployOptions | None = None) -> list[Manifest]:
    """Every object of the driver, in apply order (namespace and RBAC first, the DaemonSet last)."""
    options = options or DriverDeployOptions()
    return [
        namespace(options),
        service_account(options),
        cluster_role(options),
        cluster_role_binding(options),
        admission_policy(options),
        admission_policy_binding(options),
        network_policy(options),
        device_class(options),
        *([core_device_class(options)] if options.publishes_cores else []),
        *([catalog_config_map(options)] if options.catalog_yaml is not None else []),
        *([metrics_service(options)] if options.metrics_port and options.metrics_service else []),
        *([pod_monitor(options)] if options.pod_monitor else []),
        *([dashboard_config_map(options)] if options.grafana_dashboard else []),
        daemonset(options),
    ]


def catalog_config_map(options: DriverDeployOptions) -> Manifest:
    """The catalog file the daemon reads (mounted at CATALOG_DIR)."""
    assert options.catalog_yaml is not None
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(options, options.catalog_config_map, "kubelet-plugin", namespaced=True),
            "data": {CATALOG_KEY: options.catalog_yaml}}


def object_key(manifest: Mapping[str, Any]) -> str:
    """`Kind/name` or `Kind/namespace/name`: how plans and tests name an object."""
    meta = manifest["metadata"]
    ns = meta.get("namespace")
    return f"{manifest['kind']}/{ns}/{meta['name']}" if ns else f"{manifest['kind']}/{meta['name']}"
