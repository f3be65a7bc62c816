"""neuron-monitor and its Prometheus exporter on every Neuron node: the source of NeuronCore utilisation that the
dashboard joins with the driver's attribution (docs/utilisation.md).

What runs: AWS's image `public.ecr.aws/neuron/neuron-monitor`, at the version AWS's own DaemonSet names
(aws-neuron-sdk `src/k8/k8s-neuron-monitor-daemonset.yml`: tag 1.0.0, `/opt/bin/entrypoint.sh --port 8000`,
256m/128Mi requests). AWS publishes no digest on that page and this machine cannot reach the registry; the tag is
pinned, and `image` takes a digest reference (docs/utilisation.md says how to resolve it).

How it reaches the devices (docs/utilisation.md, "Least privilege"): not privileged (AWS's DaemonSet is), but
through a DRA claim with admin access (KEP-5018; resource.k8s.io/v1 `adminAccess`, on by default on every minor
the options accept, GA in 1.36): one claim per pod, from `claim_template`, asking for every whole Neuron device of
the node (allocationMode All). The scheduler allocates admin-access requests whether or not the devices are in
use and does not count them as allocated, kubelet has the driver prepare them (the CDI spec gives the container
every /dev/neuronN), and the driver neither holds them exclusively nor names the monitor's pod in the attribution.
The API server accepts admin access only in a namespace labelled ADMIN_ACCESS_LABEL: the driver's namespace gets
it (deploy/manifests.py `namespace`), where only the installer creates pods (its Pod Security level is
privileged already: a pod there could mount the host, more than admin access gives). The container drops every
capability: the device nodes and sysfs (read-only, as every container has it) are what neuron-monitor reads. It
needs no Kubernetes API (its service account has no token and no RBAC), listens on one port (the NetworkPolicy
admits the scrape namespaces only) and talks to nothing but the EC2 instance metadata service (its instance
labels).

Where the driver publishes NeuronCores (counters), the scheduler checks an admin-access device's counters like any
other's (k8s.io/dynamic-resource-allocation, structured allocator `allocateDevice`): the monitor's claim could not
be allocated on a node with a device in use. DriverDeployOptions.runs_neuron_monitor leaves it out there.

Plain objects from plain arguments, like monitoring.py: `spec_for(options)` reads the driver's deploy options,
`manifests(spec)` renders. The deploy option `neuron_monitor` (stack: `neuronMonitor`, default on) decides, with
runs_neuron_monitor, whether deploy.manifests() includes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_dra.driver.deploy import monitoring
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME

if TYPE_CHECKING:  # the options' module imports this one to include its objects
    from neuron_dra.driver.deploy import DriverDeployOptions

Manifest = dict[str, Any]

# AWS's published image and its exporter port (k8s-neuron-monitor-daemonset.yml of aws-neuron-sdk).
IMAGE = "public.ecr.aws/neuron/neuron-monitor:1.0.0"
PORT = 8000
COMPONENT = "neuron-monitor"
POD_SELECTOR = {"app.kubernetes.io/name": "neuron-monitor", "app.kubernetes.io/component": COMPONENT}
IMDS = "169.254.169.254/32"  # EC2 instance metadata: where neuron-monitor's instance labels come from
# The namespace label without which the API server refuses a claim with admin access (k8s.io/api resource/v1
# DRAAdminNamespaceLabelKey, 1.34+).
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
CLAIM_REQUEST = "neuron"  # the claim's one request, and the pod's name for the claim

# neuron-monitor-prometheus.py's series, as the CloudWatch agent's Neuron scraper keeps them
# (opentelemetry-collector-contrib receiver/awscontainerinsightreceiver/internal/neuron/metric_name.go; labels from
# its neuron_monitor_scraper_test.go and the Neuron Monitor User Guide). Every series also carries INSTANCE_LABELS,
# and `ultraserver_id` on UltraServer members.
INSTANCE_LABELS = ("availability_zone", "instance_id", "instance_name", "instance_type", "region", "subnet_id")
UTILISATION = "neuroncore_utilization_ratio"
CORE_MEMORY_KINDS = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
CORE_MEMORY = tuple(f"neuroncore_memory_usage_{k}" for k in CORE_MEMORY_KINDS)
RUNTIME_MEMORY = "neuron_runtime_memory_used_bytes"
LATENCY = "execution_latency_seconds"
MEMORY_LOCATIONS = ("host", "neuron_device")
# name -> its own labels (besides INSTANCE_LABELS)
METRICS: Mapping[str, tuple[str, ...]] = {
    UTILISATION: ("neuroncore", "runtime_tag"),
    **dict.fromkeys(CORE_MEMORY, ("neuroncore", "runtime_tag")),
    RUNTIME_MEMORY: ("memory_location", "runtime_tag"),
    LATENCY: ("percentile", "runtime_tag"),
}
LATENCY_PERCENTILES = ("p0", "p1", "p25", "p50", "p75", "p99", "p100")


@dataclass(frozen=True)
class ExporterSpec:
    namespace: str
    device_class: str = DEFAULT_DRIVER_NAME  # the driver's whole-device DeviceClass (named as the driver)
    name: str = "neuron-monitor"
    image: str = IMAGE
    image_pull_policy: str = "IfNotPresent"
    labels: Mapping[str, str] = field(default_factory=dict)  # added to every object's
    node_instance_types: tuple[str, ...] = ()  # empty: every node
    instance_type_label: str = "node.kubernetes.io/instance-type"  # the well-known label, as the driver's affinity
    tolerations: tuple[Mapping[str, str], ...] = ()
    scrape_namespaces: tuple[str, ...] = ("monitoring",)
    scrape_pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_monitor: bool = False
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)


def spec_for(options: DriverDeployOptions) -> ExporterSpec:
    """The exporter beside the driver: its namespace, nodes, tolerations, scrape rules and PodMonitor choice."""
    from neuron_dra.driver.model.k8s_names import neuron_toleration

    return ExporterSpec(
        namespace=options.namespace, device_class=options.device_class, labels=dict(options.labels),
        node_instance_types=options.node_instance_types,
        tolerations=(neuron_toleration(),),
        scrape_namespaces=tuple(options.metrics_scrape_namespaces),
        scrape_pod_labels=dict(options.metrics_scrape_pod_labels), pod_monitor=bool(options.pod_monitor),
        pod_monitor_labels=dict(options.pod_monitor_labels))


def _meta(spec: ExporterSpec, name: str) -> Manifest:
    labels = {**POD_SELECTOR, "app.kubernetes.io/part-of": "neuron-dra", **spec.labels}
    return {"name": name, "namespace": spec.namespace, "labels": labels}


def service_account(spec: ExporterSpec) -> Manifest:
    """Its own identity, with no token mounted and no RBAC: neuron-monitor never calls the API server."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, spec.name),
            "automountServiceAccountToken": False}


def claim_template(spec: ExporterSpec) -> Manifest:
    """Every whole Neuron device of the pod's node, with admin access: see the module docstring."""
    request = {"name": CLAIM_REQUEST, "exactly": {"deviceClassName": spec.device_class, "allocationMode": "All",
                                                  "adminAccess": True}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": _meta(spec, spec.name),
            "spec": {"metadata": {"labels": {**POD_SELECTOR, **spec.labels}},
                     "spec": {"devices": {"requests": [request]}}}}


def daemonset(spec: ExporterSpec) -> Manifest:
    container: Manifest = {
        "name": "neuron-monitor",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/opt/bin/entrypoint.sh"],
        "args": ["--port", str(PORT)],
        "ports": [{"name": monitoring.METRICS_PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "256m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "env": [{"name": "GOMEMLIMIT", "value": "160MiB"}],
        # The devices come from the admin-access claim (see the module docstring): no privilege, no capability.
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    container["resources"]["claims"] = [{"name": CLAIM_REQUEST}]
    pod_spec: Manifest = {
        "serviceAccountName": spec.name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "tolerations": [dict(t) for t in spec.tolerations],
        "resourceClaims": [{"name": CLAIM_REQUEST, "resourceClaimTemplateName": spec.name}],
        "containers": [container],
    }
    if spec.node_instance_types:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": spec.instance_type_label, "operator": "In", "values": list(spec.node_instance_types)}]}]}}}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(spec, spec.name),
        "spec": {"selector": {"matchLabels": dict(POD_SELECTOR)},
                 "template": {"metadata": {"labels": {**POD_SELECTOR, **spec.labels}}, "spec": pod_spec}},
    }


def network_policy(spec: ExporterSpec) -> Manifest:
    """In: the exporter port from the scrape namespaces (and pods). Out: the instance metadata service only."""
    ingress = [{"from": monitoring.scrape_peers(spec.scrape_namespaces, spec.scrape_pod_labels),
                "ports": [{"protocol": "TCP", "port": PORT}]}] if spec.scrape_namespaces else []
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(spec, spec.name),
        "spec": {"podSelector": {"matchLabels": dict(POD_SELECTOR)}, "policyTypes": ["Ingress", "Egress"],
                 "ingress": ingress,
                 "egress": [{"to": [{"ipBlock": {"cidr": IMDS}}], "ports": [{"protocol": "TCP", "port": 80}]}]},
    }


def pod_monitor(spec: ExporterSpec) -> Manifest:
    """The exporter's port every 30 s, the pod's node as `node` (the join key with the driver's series)."""
    meta = _meta(spec, spec.name)
    meta["labels"].update(spec.pod_monitor_labels)
    return monitoring.pod_monitor(meta, POD_SELECTOR, spec.namespace)


def manifests(spec: ExporterSpec) -> list[Manifest]:
    """The exporter's objects in apply order (its namespace is the driver's, created before them, with
    ADMIN_ACCESS_LABEL)."""
    return [service_account(spec), network_policy(spec), *([pod_monitor(spec)] if spec.pod_monitor else []),
            claim_template(spec), daemonset(spec)]
