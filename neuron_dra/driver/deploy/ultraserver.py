"""The UltraServer group controller's objects, as data (docs/ultraserver.md §3): a one-replica Deployment from the
driver's image (`python -m neuron_dra.driver.groups`, leader election on a Lease), its ServiceAccount, least
privilege RBAC and the group DeviceClass.

RBAC cannot restrict ResourceSlice writes by content, so a ValidatingAdmissionPolicy does: the controller's
service account may create, update and delete only slices of its driver with no `nodeName` in a group pool
(`ultraserver-<size>/<id>`), checked on the old object too for UPDATE and DELETE, so it can never touch a node's
slice. Leases: only in its namespace, updates only of its own Lease. Claims: list only (to find the claims that
hold a group); Events: create (what it tells holders). Nodes: patch, to keep its members' UltraServer labels
(docs/ultraserver.md §3a); a second policy refuses any Node update by its service account that changes anything
but those labels (the old and new Node compared with the keys left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.driver.deploy.options import DEFAULT_IMAGE, ULTRASERVER_CONTROLLER_NAME, DriverDeployOptions
from neuron_dra.driver.model.k8s_names import (
    DEFAULT_DRIVER_NAME,
    TAINT_EFFECTS,
    check_dns_label,
    check_driver_name,
    device_class_manifest,
    is_label_key,
    is_label_value,
    neuron_toleration,
    ultraserver_class_name,
    ultraserver_class_selector,
    ultraserver_label_keys,
)
from neuron_dra.driver.model.ultraserver import POOL_PREFIX

Manifest = dict[str, Any]
DEFAULT_NAME = ULTRASERVER_CONTROLLER_NAME
DEFAULT_NAMESPACE = "neuron-dra-driver"
COMPONENT = "ultraserver-controller"
POD_LABELS = {"app.kubernetes.io/name": "neuron-dra-driver", "app.kubernetes.io/component": COMPONENT}


@dataclass(frozen=True)
class UltraServerControllerOptions:
    """What the controller's objects need; the lead builds it from DriverDeployOptions (driver name, namespace,
    image) when wiring."""

    driver_name: str = DEFAULT_DRIVER_NAME
    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    name: str = DEFAULT_NAME  # Deployment, ServiceAccount, Lease; cluster-scoped objects get `<name>-<driver>`
    taint_effect: str = "NoSchedule"
    resync_seconds: int = 60
    # auto | off: the controller's --shared-counters. Off by default: on 1.36 each counter slice costs every DRA
    # pod's scheduling a scan of all slices, a cost that grows faster than the cluster (docs/ultraserver.md §2a, §8).
    shared_counters: str = "off"
    # Added to every object's labels (not to the pod selector): the driver's `labels` where deploy.manifests()
    # renders the controller beside the driver.
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_driver_name("UltraServerControllerOptions.driver_name", self.driver_name)
        check_dns_label("UltraServerControllerOptions.namespace", self.namespace)
        check_dns_label("UltraServerControllerOptions.name", self.name)
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"UltraServerControllerOptions.image: {self.image!r} is not allowed; allowed: an image "
                             "reference without spaces")
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(f"UltraServerControllerOptions.taint_effect: {self.taint_effect!r} is not allowed; "
                             f"allowed: {', '.join(TAINT_EFFECTS)}")
        if self.shared_counters not in ("auto", "off"):
            raise ValueError(f"UltraServerControllerOptions.shared_counters: {self.shared_counters!r} is not "
                             "allowed; allowed: auto, off")
        if not 1 <= self.resync_seconds <= 3600:
            raise ValueError(f"UltraServerControllerOptions.resync_seconds: {self.resync_seconds!r} is not allowed; "
                             "allowed: 1 to 3600")
        for k, v in self.labels.items():
            if not is_label_key(k) or not is_label_value(v):
                raise ValueError(f"UltraServerControllerOptions.labels: {k}={v} is not allowed; allowed: label "
                                 "keys and values")

    @property
    def cluster_name(self) -> str:
        """Cluster-scoped objects: one per driver, so two installations never share one."""
        return f"{self.name}-{self.driver_name}"

    @property
    def service_account_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def spec_for(options: DriverDeployOptions) -> UltraServerControllerOptions:
    """The controller beside the driver (deploy.manifests with `ultraserver_groups`): the driver's name, namespace,
    image and labels, and `ultraserver_shared_counters`; the rest at its defaults. Those values are not checked
    again: DriverDeployOptions checked each by the same rules (one validation per fact; a test builds the same
    options checked and compares), and the chart's generator renders them as placeholders (deploy/chart.py)."""
    spec = UltraServerControllerOptions()
    for name, value in (("driver_name", options.driver_name), ("namespace", options.namespace),
                        ("image", options.image), ("labels", dict(options.labels)),
                        ("shared_counters", options.ultraserver_shared_counters)):
        object.__setattr__(spec, name, value)
    return spec


def _labels(o: UltraServerControllerOptions) -> dict[str, str]:
    return {**POD_LABELS, **o.labels}


def _meta(o: UltraServerControllerOptions, name: str, namespaced: bool) -> Manifest:
    meta: Manifest = {"name": name, "labels": _labels(o)}
    if namespaced:
        meta["namespace"] = o.namespace
    return meta


def service_account(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(o, o.name, True)}


CLUSTER_RULES: tuple[Manifest, ...] = (
    # Writes are narrowed to group slices by the admission policy below.
    # Exactly what the controller calls (driver/groups): lists and watches, never a GET of one slice or Node;
    # claims are listed only when a group is about to go (no watch: a pass per claim change would be waste).
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["list", "watch", "create", "update", "delete"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]},
    # patch: the members' UltraServer labels only (node_admission_policy bounds it)
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)


def cluster_role(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": _meta(o, o.cluster_name, False), "rules": [dict(r) for r in CLUSTER_RULES]}


def cluster_role_binding(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": _meta(o, o.cluster_name, False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": o.cluster_name},
            "subjects": [{"kind": "ServiceAccount", "name": o.name, "namespace": o.namespace}]}


def lease_role(o: UltraServerControllerOptions) -> Manifest:
    """Leases in its namespace: create (a name cannot restrict create), read and update its own only."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(o, o.name, True),
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                      {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [o.name],
                       "verbs": ["get", "update"]}]}


def lease_role_binding(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(o, o.name, True),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": o.name},
            "subjects": [{"kind": "ServiceAccount", "name": o.name, "namespace": o.namespace}]}


def _is_group_slice(var: str, driver: str) -> str:
    return (f'({var}.spec.driver == "{driver}" && !has({var}.spec.nodeName) && '
            f'{var}.spec.pool.name.startsWith("{POOL_PREFIX}") && {var}.spec.pool.name.contains("/"))')


def admission_policy(o: UltraServerControllerOptions) -> Manifest:
    """The controller's service account writes group slices of its driver only (old and new object)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(o, o.cluster_name, False),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["resourceslices"]}]},
            "matchConditions": [{"name": "controller-service-account",
                                 "expression": f'request.userInfo.username == "{o.service_account_user}"'}],
            "validations": [{
                "expression": (f"(object == null || {_is_group_slice('object', o.driver_name)}) && "
                               f"(oldObject == null || {_is_group_slice('oldObject', o.driver_name)})"),
                "reason": "Forbidden",
                "message": (f"{o.service_account_user} may only write {o.driver_name} ResourceSlices without a "
                            f"nodeName in a {POOL_PREFIX}<size>/<id> pool"),
            }],
        },
    }


def admission_policy_binding(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": _meta(o, o.cluster_name, False),
            "spec": {"policyName": o.cluster_name, "validationActions": ["Deny"]}}


def _same(field: str) -> str:
    """CEL: `field` (a path below object/oldObject) is absent on both or equal."""
    return (f"has(object.{field}) == has(oldObject.{field}) && "
            f"(!has(object.{field}) || object.{field} == oldObject.{field})")


def node_update_expression(label_keys: tuple[str, ...]) -> str:
    """CEL: an UPDATE whose Node differs from the stored one in `label_keys` only (other labels, annotations,
    finalizers, owner references, spec and status all unchanged). CREATE and DELETE are refused (RBAC grants
    neither; refused here too)."""
    keys = "[" + ", ".join(f'"{k}"' for k in label_keys) + "]"
    new, old = "object.metadata.labels", "oldObject.metadata.labels"
    labels = (f"(!has({new}) || {new}.all(k, k in {keys} || (has({old}) && k in {old} && {old}[k] == {new}[k]))) "
              f"&& (!has({old}) || {old}.all(k, k in {keys} || (has({new}) && k in {new})))")
    rest = " && ".join(_same(f) for f in ("metadata.annotations", "metadata.finalizers",
                                            "metadata.ownerReferences", "spec", "status"))
    return f'request.operation == "UPDATE" && {labels} && {rest}'


def node_policy_name(o: UltraServerControllerOptions) -> str:
    return f"{o.cluster_name}-nodes"


def node_admission_policy(o: UltraServerControllerOptions) -> Manifest:
    """The controller's service account changes only the UltraServer labels of a Node (GA API
    admissionregistration.k8s.io/v1; docs/ultraserver.md §3a)."""
    keys = ultraserver_label_keys(o.driver_name)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(o, node_policy_name(o), False),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["nodes"]}]},
            "matchConditions": [{"name": "controller-service-account",
                                 "expression": f'request.userInfo.username == "{o.service_account_user}"'}],
            "validations": [{
                "expression": node_update_expression(keys),
                "reason": "Forbidden",
                "message": f"{o.service_account_user} may only change the labels {', '.join(keys)} of a Node",
            }],
        },
    }


def node_admission_policy_binding(o: UltraServerControllerOptions) -> Manifest:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": _meta(o, node_policy_name(o), False),
            "spec": {"policyName": node_policy_name(o), "validationActions": ["Deny"]}}


def group_device_class(o: UltraServerControllerOptions) -> Manifest:
    return device_class_manifest(ultraserver_class_name(o.driver_name), o.driver_name,
                                 expression=ultraserver_class_selector(o.driver_name), labels=_labels(o))


def controller_args(o: UltraServerControllerOptions) -> list[str]:
    return ["python", "-m", "neuron_dra.driver.groups", f"--driver-name={o.driver_name}",
            f"--namespace={o.namespace}", f"--lease-name={o.name}", f"--taint-effect={o.taint_effect}",
            f"--resync-seconds={o.resync_seconds}", f"--shared-counters={o.shared_counters}"]


def deployment(o: UltraServerControllerOptions) -> Manifest:
    """One replica; a second one during a rollout only waits for the Lease."""
    def field_ref(path: str) -> Manifest:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    container = {
        "name": "controller", "image": o.image, "command": controller_args(o),
        "env": [{"name": "POD_NAME", **field_ref("metadata.name")},
                {"name": "POD_NAMESPACE", **field_ref("metadata.namespace")}],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 65532,
                            "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(o, o.name, True),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(POD_LABELS)},
            "template": {
                "metadata": {"labels": dict(POD_LABELS)},
                "spec": {"serviceAccountName": o.name, "containers": [container],
                         # the Neuron taint's too: a cluster whose only nodes are Neuron nodes (node groups
                         # without a system group) has nowhere else to run it (CoreDNS does the same)
                         "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, neuron_toleration()],
                         "terminationGracePeriodSeconds": 30},
            },
        },
    }


def manifests(o: UltraServerControllerOptions | None = None) -> list[Manifest]:
    """Every object, cluster-scoped ones and RBAC first, then the Deployment. The namespace is the driver's."""
    o = o or UltraServerControllerOptions()
    return [service_account(o), cluster_role(o), cluster_role_binding(o), lease_role(o), lease_role_binding(o),
            admission_policy(o), admission_policy_binding(o), node_admission_policy(o),
            node_admission_policy_binding(o), group_device_class(o), deployment(o)]
