"""The driver's Kubernetes objects as plain dicts (`manifests(options)`), each rendered by one function from
`DriverDeployOptions`: the one source of truth for every way of installing it.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_dra.driver.deploy import admission, exporter, monitoring, ultraserver
from neuron_dra.driver.deploy.options import DriverDeployOptions, Manifest
from neuron_dra.driver.model.k8s_names import (
    CATALOG_ENV,
    LIVENESS_SERVICE,
    READINESS_SERVICE,
    device_class_manifest,
    device_class_selector,
    neuron_toleration,
)
from neuron_dra.driver.model.version import VERSION

# A catalog file (docs/catalog-file.md) travels as a ConfigMap mounted here; NEURON_DRA_CATALOG points to it.
CATALOG_DIR = "/etc/neuron-dra"
CATALOG_KEY = "catalog.yaml"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"
# The driver cannot run on these EKS compute types (no host access or no Neuron kernel driver).
EXCLUDED_COMPUTE_TYPES = ("fargate", "hybrid", "auto")
# Host paths mounted read-only below the host root: what discovery reads (sysfs, the device nodes).
HOST_READ_ONLY_PATHS = ("/sys", "/dev")
LNC_CONFIG_DIR = "/opt/aws/neuron"  # holds logical_nc_config (partitions.LNC_FILE)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
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
    if options.runs_neuron_monitor:  # its claim has admin access, served only here (deploy/exporter.py)
        meta["labels"][exporter.ADMIN_ACCESS_LABEL] = "true"
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
        # Where kubelet's probe comes from: the health port's own lane for it (docs/hardening.md §1).
        {"name": "HOST_IP", **field_ref("status.hostIP")},
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
        # Each claim-config object sits before its slice-policy counterpart: `plan` sorts by kind, then name.
        admission.claim_config_policy(options.driver_name, options.namespace, _labels(options, "admission")),
        admission_policy(options),
        admission.claim_config_policy_binding(options.driver_name, options.namespace, _labels(options, "admission")),
        admission_policy_binding(options),
        network_policy(options),
        device_class(options),
        *([core_device_class(options)] if options.publishes_cores else []),
        *([catalog_config_map(options)] if options.catalog_yaml is not None else []),
        *([metrics_service(options)] if options.metrics_port and options.metrics_service else []),
        *([pod_monitor(options)] if options.pod_monitor else []),
        *([dashboard_config_map(options)] if options.grafana_dashboard else []),
        daemonset(options),
        # After the driver's: a caller looking for "the DaemonSet" finds the driver's first.
        *(exporter.manifests(exporter.spec_for(options)) if options.runs_neuron_monitor else []),
        # The UltraServer group controller, rendered by its own module (the Pulumi components create it with
        # UltraServerGroups and leave this off).
        *(ultraserver.manifests(ultraserver.spec_for(options)) if options.ultraserver_groups else []),
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
