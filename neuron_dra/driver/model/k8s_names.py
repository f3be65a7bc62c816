"""Kubernetes and EKS names, name rules and defaults: the one home for what the driver, the claim templates, the
Pulumi components and the local cluster must agree on. Pure Python, in the ground floor (`driver/`), so every
part can import it.

Facts: docs/dra-api.md §1 (name rules: apimachinery's DNS-1123 label and subdomain, label keys and values),
docs/kubelet-dra-protocol.md §1 and §4 (kubelet's plugin directories, the liveness service), docs/cdi.md §1 (the
CDI directory), docs/neuron-hardware.md §3 (driver and DeviceClass name, the chart's defaults),
docs/eks-trainium.md §1 (the Neuron taint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from neuron_dra.driver.model.errors import NotAllowed

# --- name rules (k8s.io/apimachinery/pkg/util/validation) ---
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
DRIVER_NAME_MAX = 63  # ResourceSlice.spec.driver: a DNS subdomain, but at most 63 characters
LABEL_NAME_MAX = 63
LABEL_VALUE_MAX = 63

# fullmatch, never match: `$` matches before a final line feed.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

DNS_LABEL_RULE = (f"a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, "
                  f"at most {DNS_LABEL_MAX} characters")
DNS_SUBDOMAIN_RULE = (f"a DNS subdomain: dot-separated DNS labels (lowercase letters, digits, '-'), at most "
                      f"{DNS_SUBDOMAIN_MAX} characters")
DRIVER_NAME_RULE = f"a DRA driver name: a lowercase DNS subdomain of at most {DRIVER_NAME_MAX} characters"
LABEL_KEY_RULE = (f"a label key: an optional DNS subdomain prefix and '/', then a name of at most {LABEL_NAME_MAX} "
                  "letters, digits, '-', '_' or '.', starting and ending alphanumeric")
LABEL_VALUE_RULE = (f"a label value: at most {LABEL_VALUE_MAX} letters, digits, '-', '_' or '.', starting and "
                    "ending alphanumeric (or empty)")


def is_dns_label(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object, max_length: int = DNS_SUBDOMAIN_MAX) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= max_length and _DNS_SUBDOMAIN.fullmatch(value) is not None


def is_label_key(value: object) -> TypeGuard[str]:
    if not isinstance(value, str):
        return False
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= LABEL_NAME_MAX and _LABEL_NAME.fullmatch(name) is not None


def is_label_value(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value) is not None


def check_dns_label(field: str, value: object, error: type[NotAllowed] = NotAllowed) -> str:
    """`value` if it is a DNS label; otherwise `error` (the caller's NotAllowed) naming `field`."""
    if not is_dns_label(value):
        raise error(field, value, DNS_LABEL_RULE)
    return value


def check_dns_subdomain(field: str, value: object, error: type[NotAllowed] = NotAllowed) -> str:
    if not is_dns_subdomain(value):
        raise error(field, value, DNS_SUBDOMAIN_RULE)
    return value


def check_driver_name(field: str, value: object, error: type[NotAllowed] = NotAllowed) -> str:
    """A DRA driver name; it also names the driver's socket and CDI files."""
    if not is_dns_subdomain(value, DRIVER_NAME_MAX):
        raise error(field, value, DRIVER_NAME_RULE)
    return value


# --- the driver's names and kubelet's directories (AWS's chart uses the same) ---
DEFAULT_DRIVER_NAME = "neuron.aws.com"  # also the DeviceClass name
DEFAULT_CORE_DEVICE_CLASS = "neuroncore.aws.com"
NEURON_CORE = "neuron_core"  # resourceType of a core device (partitions.py publishes them)
# resourceType of an UltraServer group device: one per UltraServer (and 2-node half), published by the cluster-level
# controller in a slice whose nodeSelector names the members (model/ultraserver.py, docs/ultraserver.md).
ULTRASERVER_GROUP = "ultraserver"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR_ENV = "KUBELET_PLUGINS_DIRECTORY_PATH"
REGISTRY_DIR_ENV = "KUBELET_REGISTRAR_DIRECTORY_PATH"
DEFAULT_CDI_ROOT = "/var/run/cdi"
DEFAULT_HEALTHCHECK_PORT = 51515
LIVENESS_SERVICE = "liveness"  # the gRPC health service name kubelet's liveness probe asks for
# ... and its readiness probe: SERVING once kubelet has registered this instance, so a surge rollout stops the
# old pod only when the new one takes calls (docs/upgrades.md).
READINESS_SERVICE = "readiness"

# --- the Neuron device plugin's extended resource names (DeviceClasses can serve them: DRAExtendedResource) ---
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neuron"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
# The first Kubernetes minor whose scheduler keeps a node's counter slices (ResourceSlice sharedCounters) to that
# node: kubernetes/kubernetes#138917. Before it every node's Filter reads every other node's counter slices, so a
# claim pod's scheduler CPU grows with nodes squared (docs/scale.md §2). Not backported: the 1.36 allocator of
# k8s.io/dynamic-resource-allocation v0.36.5 still shares every slice with counters (docs/neuron-cores.md §5).
COUNTERS_PER_NODE_MINOR = 37
CORE_PARTITION_MODES = ("auto", "on", "off")  # the daemon's --core-partitions, DriverDeployOptions.core_partitions

# --- the Neuron taint on Neuron nodes (EKS convention; the chart tolerates it) ---
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
NEURON_TAINT_VALUE = "true"
NEURON_TAINT_EFFECT = "NoSchedule"


def neuron_taint() -> dict[str, str]:
    """The taint as a Node's `spec.taints` entry."""
    return {"key": NEURON_TAINT_KEY, "value": NEURON_TAINT_VALUE, "effect": NEURON_TAINT_EFFECT}


def neuron_toleration() -> dict[str, str]:
    """A pod toleration of the taint, whatever its value."""
    return {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": NEURON_TAINT_EFFECT}


def device_class_manifest(name: str, driver: str, *, expression: str | None = None,
                          extended_resource_name: str | None = None,
                          labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The DeviceClass `name` (resource.k8s.io/v1) selecting devices of `driver`: all of them, or those for which
    the CEL `expression` holds; `extended_resource_name` lets pods ask for them by resource limits (1.36+)."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression or f'device.driver == "{driver}"'}}]}
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class DeviceClassNames:
    """A driver name and the names of its two DeviceClasses (whole devices, NeuronCores)."""

    driver_name: str
    device_class: str
    core_device_class: str

    @property
    def ultraserver_class(self) -> str:
        """The DeviceClass of the UltraServer group devices: `ultraserver.<driver name>` (docs/ultraserver.md)."""
        return ultraserver_class_name(self.driver_name)


def ultraserver_class_name(driver_name: str) -> str:
    """The group DeviceClass name by the driver's naming rule (`ultraserver.neuron.aws.com` for the default)."""
    return f"{ULTRASERVER_GROUP}.{driver_name}"


# Node labels the group controller sets on each UltraServer member (docs/ultraserver.md §3a): `<driver>/ultraserver`
# names the node's UltraServer set (whatever its size), `<driver>/ultraserver-pair` the two nodes a 2-node job may
# span (a 4-node set's half, or a 2-node set whole). A job's pod affinity takes the one of its size as topologyKey.
ULTRASERVER_LABEL_NAME = ULTRASERVER_GROUP
ULTRASERVER_PAIR_LABEL_NAME = f"{ULTRASERVER_GROUP}-pair"
# The pods of one UltraServerJob carry `<driver>/ultraserver-job=<its group key>` (the affinity selects on it).
ULTRASERVER_JOB_LABEL_NAME = f"{ULTRASERVER_GROUP}-job"


def ultraserver_label_keys(driver_name: str) -> tuple[str, str]:
    """The Node label keys of the driver's UltraServer members: (the whole set's, the 2-node pair's); a driver name
    is a DNS subdomain of at most 63 characters, so `<driver>/<name>` is always a label key."""
    return f"{driver_name}/{ULTRASERVER_LABEL_NAME}", f"{driver_name}/{ULTRASERVER_PAIR_LABEL_NAME}"


def ultraserver_topology_key(driver_name: str, nodes: int) -> str:
    """The Node label whose value is shared by exactly the nodes a job of `nodes` pods may span: the pair's for a
    2-node job (it may take a half of a 4-node set), the whole set's otherwise."""
    whole, pair = ultraserver_label_keys(driver_name)
    return pair if nodes == 2 else whole


def ultraserver_job_label_key(driver_name: str) -> str:
    """The pod label naming an UltraServerJob's group (what its pod affinity and anti-affinity select on)."""
    return f"{driver_name}/{ULTRASERVER_JOB_LABEL_NAME}"


def device_class_names(driver_name: str, device_class: str | None = None,
                       core_device_class: str = "") -> DeviceClassNames:
    """The one rule for the DeviceClass names of a driver: the whole-device class is `device_class`, else the
    driver name (as AWS's chart names it); the NeuronCore class is `core_device_class`, else
    DEFAULT_CORE_DEVICE_CLASS for the default driver name and `cores.<driver name>` for any other. What the
    deployment creates, the claim templates name (claim_templates/drivers.py) and the components check."""
    core = core_device_class or (DEFAULT_CORE_DEVICE_CLASS if driver_name == DEFAULT_DRIVER_NAME
                                 else f"cores.{driver_name}")
    return DeviceClassNames(driver_name, device_class or driver_name, core)


def device_class_selector(driver: str, cores: bool) -> str:
    """Whole devices (and the UltraServer node device) or NeuronCores of the driver: the two never mix, so a claim
    for N devices never gets cores, and an extended-resource count of N means N of one kind
    (docs/neuron-cores.md §4). Every device of the driver publishes resourceType. The UltraServer group devices
    are neither: a node's `allocationMode: All` would otherwise take the group too (docs/ultraserver.md §2)."""
    attribute = f'device.attributes["{driver}"].resourceType'
    if cores:
        return f'device.driver == "{driver}" && {attribute} == "{NEURON_CORE}"'
    return (f'device.driver == "{driver}" && {attribute} != "{NEURON_CORE}" && '
            f'{attribute} != "{ULTRASERVER_GROUP}"')


def ultraserver_class_selector(driver: str) -> str:
    """The group devices of the driver only (resourceType `ultraserver`)."""
    return f'device.driver == "{driver}" && device.attributes["{driver}"].resourceType == "{ULTRASERVER_GROUP}"'


# Defaults of the daemon's flags that its entry parses before importing anything heavy (driver/daemon/options.py).
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
DEFAULT_TAINT_EFFECT = "NoSchedule"
CATALOG_ENV = "NEURON_DRA_CATALOG"  # the driver daemon's fallback for --catalog (daemon/options.py)
CHECKPOINT_FILE = "checkpoint.json"
# kubelet's device health stream: the packages served (most recent first) and what the registration advertises
# (health_stream.py, docs/kubelet-dra-protocol.md §3).
HEALTH_PACKAGES = ("v1", "v1beta1", "v1alpha1")
HEALTH_SERVICES = tuple(f"{p}.DRAResourceHealth" for p in HEALTH_PACKAGES)
