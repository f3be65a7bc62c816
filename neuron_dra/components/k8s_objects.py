"""Typed pulumi_kubernetes resources built from plain manifest dicts.

The manifests come from `neuron_dra.driver.deploy` and the claim templates; this module only maps each
(apiVersion, kind) to its typed resource class and passes the manifest's fields through unchanged, so the
objects Pulumi applies are exactly those dicts (camelCase keys are accepted by the typed resources as-is).
An unsupported kind is an error rather than a silent fallback to an untyped resource.

Objects whose fields the API server keeps immutable are replaced, never patched (`REPLACED_ON_CHANGE`, the one
table: `create_object` turns it into `replace_on_changes` and `delete_before_replace`, and `neuron-dra plan --diff`
reads those options back from what the program registered; docs/upgrades.md "Day two").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

ResourceFactory = Callable[..., pulumi.CustomResource]


def _pod_monitor(name: str, *, opts: pulumi.ResourceOptions, **fields: Any) -> pulumi.CustomResource:
    # prometheus-operator's kind has no typed class in pulumi_kubernetes: the generic custom resource.
    return k8s.apiextensions.CustomResource(name, api_version="monitoring.coreos.com/v1", kind="PodMonitor",
                                            opts=opts, **fields)


RESOURCE_CLASSES: Mapping[tuple[str, str], ResourceFactory] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,  # the driver's catalog file (DriverDeployOptions.catalog_yaml)
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,  # the UltraServer controller's Lease
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"):
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("resource.k8s.io/v1", "DeviceClass"): k8s.resource.v1.DeviceClass,
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): k8s.resource.v1.ResourceClaimTemplate,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,  # the UltraServer controller (components/ultraserver.py)
    ("v1", "Service"): k8s.core.v1.Service,  # the metrics port's (docs/metrics.md)
    ("monitoring.coreos.com/v1", "PodMonitor"): _pod_monitor,
}

# Fields the API server refuses to change (upstream k8s.io/kubernetes v1.36.5 pkg/apis/*/validation):
# - ResourceClaimTemplate.spec: `ValidateResourceClaimTemplateUpdate` (ValidateImmutableField(template.Spec)); the
#   Kubernetes provider's own force-new list (pulumi-kubernetes provider/pkg/provider/diff.go) has no resource.k8s.io
#   kind, so without this a changed template fails `pulumi up` with "field is immutable".
# - ClusterRoleBinding.roleRef and DaemonSet.spec.selector: on that force-new list already; listed here too so that
#   the plan's diff has one table to read.
# Mutable, so patched in place: DeviceClass (ValidateDeviceClassUpdate validates the new spec only),
# ValidatingAdmissionPolicy and its binding (paramKind, policyName: validated, not frozen), Namespace, ConfigMap
# (without `immutable: true`), Service (the driver's sets no clusterIP), NetworkPolicy, PodMonitor. Helm releases
# (helm.v3.Release) are upgraded by Helm. Every object has a fixed name, so the old one goes first
# (delete_before_replace): a new one of the same name cannot exist beside it. Pods running keep their claims (a
# generated ResourceClaim belongs to its pod, not to the template); pods created after use the new template.
REPLACED_ON_CHANGE: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ("spec",),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("roleRef",),
    ("apps/v1", "DaemonSet"): ("spec.selector",),
}


def replace_options(api_version: str, kind: str) -> pulumi.ResourceOptions | None:
    """The options that make the engine replace (old object first) an object of this kind whose immutable
    fields change; None for kinds patched in place."""
    paths = REPLACED_ON_CHANGE.get((api_version, kind))
    if paths is None:
        return None
    return pulumi.ResourceOptions(replace_on_changes=list(paths), delete_before_replace=True)


# Top-level manifest fields -> the resource's keyword argument.
_FIELD_ARGS = {
    "metadata": "metadata",
    "spec": "spec",
    "rules": "rules",
    "aggregationRule": "aggregation_rule",
    "roleRef": "role_ref",
    "subjects": "subjects",
    "automountServiceAccountToken": "automount_service_account_token",
    "imagePullSecrets": "image_pull_secrets",
    "secrets": "secrets",
    "data": "data",
}


def resource_name(prefix: str, manifest: Mapping[str, Any]) -> str:
    """A stable Pulumi name: prefix, kind, namespace and object name."""
    meta = manifest["metadata"]
    parts = [prefix, manifest["kind"].lower(), meta.get("namespace"), meta["name"]]
    return "-".join(p for p in parts if p)


def create_object(
    name: str,
    manifest: Mapping[str, Any],
    opts: pulumi.ResourceOptions,
    overrides: Mapping[str, pulumi.Input[Any]] | None = None,
) -> pulumi.CustomResource:
    """Create the typed resource for `manifest`; `overrides` replaces top-level fields with Outputs
    (e.g. a DaemonSet spec whose image is only known after the image is built)."""
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    factory = RESOURCE_CLASSES.get(key)
    if factory is None:
        allowed = ", ".join(f"{a} {k}" for a, k in RESOURCE_CLASSES)
        raise ValueError(f"manifest kind {key[0]} {key[1]} is not supported; supported: {allowed}")
    kwargs: dict[str, Any] = {}
    for field_name, value in {**manifest, **(overrides or {})}.items():
        if field_name in ("apiVersion", "kind"):
            continue
        if field_name not in _FIELD_ARGS:
            raise ValueError(f"{key[1]} field {field_name!r} is not supported; supported: {', '.join(_FIELD_ARGS)}")
        kwargs[_FIELD_ARGS[field_name]] = value
    replace = replace_options(*key)
    return factory(name, opts=pulumi.ResourceOptions.merge(opts, replace) if replace else opts, **kwargs)


SKIP_AWAIT = "pulumi.com/skipAwait"


def rollout_wait(manifest: Mapping[str, Any], opts: pulumi.ResourceOptions, timeout_seconds: int
                 ) -> tuple[dict[str, Any], pulumi.ResourceOptions]:
    """A workload's metadata and options for what `pulumi up` waits for: its rollout for at most `timeout_seconds`
    (custom timeouts on create and update), or nothing (0: the provider's skipAwait annotation). The driver's
    DaemonSet and the UltraServer controller's Deployment."""
    metadata = dict(manifest["metadata"])
    if timeout_seconds == 0:
        metadata["annotations"] = {**metadata.get("annotations", {}), SKIP_AWAIT: "true"}
        return metadata, opts
    timeout = f"{timeout_seconds}s"
    return metadata, pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout)))
