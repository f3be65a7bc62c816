"""The default stack's settings table and the decoding of raw Pulumi config into `StackSettings`.

`SETTINGS` is the one table of the stack's settings: for each `StackSettings` field its kind, description and
whether only a new cluster uses it. The config key and the default come from the field itself (its metadata in
`neuron_dra.components.settings`), so nothing here is a second copy of a name. From the table come:
`Pulumi.yaml`'s `config:` section (`pulumi_project_config`, a test compares them), `Pulumi.example.yaml`'s keys
(tested) and the decoding (`decode_settings`).

The engine treats a `config:` declaration without a `default` as REQUIRED ("Stack ... is missing configuration
values"), so every optional setting is declared with a neutral default ("" or []) that decodes to "unset"
(docs/pulumi-engine.md).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from neuron_dra.components.settings import (
    NODE_GROUP_FIELD_OF_KEY,
    NODE_POOL_FIELD_OF_KEY,
    POOL_CAPACITY_TYPES,
    PROJECT,
    NodeGroupSettings,
    NodePoolSettings,
    SettingError,
    StackSettings,
    setting_name,
)
from neuron_dra.driver.errortext import capped
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog

Kind = Literal["string", "integer", "boolean", "strings", "objects"]

DEFAULT_NODE_GROUPS: tuple[Mapping[str, object], ...] = (
    {"name": "trn2", "instanceType": "trn2.48xlarge", "desiredSize": 1, "minSize": 0, "maxSize": 1},
)


@dataclass(frozen=True)
class Setting:
    """One row of the table. `key` and `default` are the StackSettings field's (see `_row`)."""

    field: str  # the StackSettings field
    kind: Kind
    description: str
    new_cluster_only: bool = False  # meaningless (and refused) when `kubeconfig` selects an existing cluster
    key: str = ""  # filled from the field's metadata
    default: object = None  # the value in Python (None, () or a value)

    @property
    def optional(self) -> bool:
        """No value unless configured (None or an empty list in Python)."""
        return self.default is None or self.default == ()

    @property
    def engine_default(self) -> object:
        """The `default:` Pulumi.yaml declares: the neutral "" or [] for optional settings, so the engine does
        not require them."""
        if self.key == "nodeGroups":
            return [dict(g) for g in DEFAULT_NODE_GROUPS]
        if self.default is None:
            return ""
        if isinstance(self.default, tuple):
            return list(self.default)
        return self.default


_T = Setting  # short rows
_ROWS: tuple[Setting, ...] = (
    _T("kubeconfig", "string",
       "Existing-cluster mode: a kubeconfig (contents or path). When set, the stack installs only the driver "
       "and the claim templates; no AWS resources are created."),
    _T("kubernetes_version", "string", "EKS Kubernetes version: a minor EKS offers, of 1.34 to 1.36 (DRA "
       "resource.k8s.io/v1 is served from 1.34; EKS does not offer 1.37 yet). A minor past EKS standard support "
       "gets a preview warning with its date: extended support costs extra per cluster-hour "
       "(docs/kubernetes-versions.md §1 has the dates).", new_cluster_only=True),
    _T("cluster_name", "string", "EKS cluster name (default: neuron-dra-<stack>).", new_cluster_only=True),
    _T("vpc_id", "string", "Use this VPC instead of creating one (needs privateSubnetIds).",
       new_cluster_only=True),
    _T("private_subnet_ids", "strings", "Private subnets of vpcId for the control plane and the nodes.",
       new_cluster_only=True),
    _T("public_subnet_ids", "strings", "Public subnets of vpcId (for load balancers).", new_cluster_only=True),
    _T("vpc_cidr", "string", "CIDR block of the new VPC.", new_cluster_only=True),
    _T("availability_zones", "strings", "AZs of the new VPC (default: the AZs offering the node groups' "
       "instance types, plus one more for the control plane).", new_cluster_only=True),
    _T("nat_gateways", "string", "NAT gateways of the new VPC: Single or OnePerAz.", new_cluster_only=True),
    _T("admin_principal_arns", "strings", "IAM principals given cluster-admin access entries.",
       new_cluster_only=True),
    _T("endpoint_public_access", "boolean", "Whether the Kubernetes API endpoint is reachable from the "
       "internet (pulumi needs to reach it to install the driver).", new_cluster_only=True),
    _T("public_access_cidrs", "strings", "CIDRs allowed to reach the public API endpoint (default: any).",
       new_cluster_only=True),
    _T("vpc_cni_version", "string", "vpc-cni add-on version (default: EKS's default; at least v1.18.4 when "
       "EFA-only interfaces are used).", new_cluster_only=True),
    _T("vpc_cni_identity", "string", "Who holds the VPC CNI's EC2 permissions (AmazonEKS_CNI_Policy): "
       "podIdentity (its own IAM role for the aws-node service account, through EKS Pod Identity) or nodeRole "
       "(the node role, as EKS's defaults do; any pod that reaches IMDS can then use them).",
       new_cluster_only=True),
    _T("vpc_cni_network_policy", "boolean", "Whether the VPC CNI enforces Kubernetes NetworkPolicies (its "
       "network policy agent, add-on setting enableNetworkPolicy; vpc-cni v1.14+). Without an enforcing CNI the "
       "driver's NetworkPolicy protects nothing.", new_cluster_only=True),
    _T("imds_hop_limit", "integer", "IMDSv2 response hop limit of the nodes: 1 keeps pods (other than "
       "host-network pods) from the node role's credentials; 2 lets every pod reach IMDS.",
       new_cluster_only=True),
    _T("coredns_version", "string", "coredns add-on version (default: EKS's default).", new_cluster_only=True),
    _T("kube_proxy_version", "string", "kube-proxy add-on version (default: EKS's default).",
       new_cluster_only=True),
    _T("pod_identity_agent_version", "string", "eks-pod-identity-agent add-on version (default: EKS's "
       "default).", new_cluster_only=True),
    _T("node_groups", "objects", "Trainium/Inferentia managed node groups: "
       + ", ".join(NODE_GROUP_FIELD_OF_KEY) + ". capacityType is ON_DEMAND or CAPACITY_BLOCK, efaInterfaceType "
       "efa-only or efa, lnc 1 or 2 (Trainium2/Trainium3 only: the nodes' Logical NeuronCore config, default 2; "
       "also the node label neuron-dra/lnc).", new_cluster_only=True),
    _T("node_pools", "objects", "Karpenter NodePools of Neuron instances, instead of or next to nodeGroups "
       "(docs/karpenter.md); Karpenter is installed when there is one: " + ", ".join(NODE_POOL_FIELD_OF_KEY)
       + ". With replicas a static pool (one instance type; a Capacity Block or UltraServer with "
       "capacityReservationId), without a dynamic pool up to maxNodes; capacityTypes: "
       + ", ".join(POOL_CAPACITY_TYPES) + ".", new_cluster_only=True),
    _T("driver_image", "string", "Driver image to deploy, repo@sha256:<digest> (pinned) or repo:tag (follows the "
       "tag), e.g. the one the release workflow publishes (default: build neuron_dra/driver/Dockerfile of the "
       "installed package and push it to an ECR repository of the stack, pinned by digest; needs Docker with "
       "BuildKit where pulumi up runs)."),
    _T("driver_repository_force_delete", "boolean", "Let pulumi destroy delete the driver's ECR repository with "
       "its images (without driverImage; default false: ECR refuses while it holds images)."),
    _T("driver_name", "string", "DRA driver name. Its DeviceClasses are named after it (neuron.aws.com: "
       "neuron.aws.com and neuroncore.aws.com; another name N: N and cores.N) and the claim templates name them."),
    _T("driver_namespace", "string", "Namespace of the driver (default: neuron-dra-driver for the default "
       "driverName, else neuron-dra-<driverName with dots as dashes>; it also names the ClusterRole)."),
    _T("driver_metrics_port", "integer", "Prometheus metrics port of the driver (0: off)."),
    _T("metrics_scrape_namespaces", "strings", "Namespaces whose pods the driver's NetworkPolicy lets scrape "
       "the metrics port."),
    _T("metrics_scrape_pod_labels", "strings", "KEY=VALUE labels: of the scrape namespaces' pods only those "
       "with all of them may scrape (default: every pod there), e.g. app.kubernetes.io/name=prometheus."),
    _T("pod_monitor", "string", "A prometheus-operator PodMonitor for the driver pods (with driverMetricsPort): "
       "true, false, or auto: on an existing cluster when it serves the PodMonitor CRD (asked while the program "
       "runs), off on a new cluster (nothing here installs prometheus-operator). docs/metrics.md."),
    _T("pod_monitor_labels", "strings", "KEY=VALUE labels of the PodMonitor (what the Prometheus's "
       "podMonitorSelector selects, e.g. release=kube-prometheus-stack)."),
    _T("grafana_dashboard", "boolean", "Install the driver's Grafana dashboard (`neuron-dra dashboard`) as a "
       "ConfigMap for the Grafana sidecar (with driverMetricsPort)."),
    _T("grafana_dashboard_label", "string", "KEY=VALUE label the Grafana sidecar selects dashboards by "
       "(kube-prometheus-stack's default grafana_dashboard=1)."),
    _T("grafana_dashboard_namespace", "string", "Namespace of the dashboard ConfigMap (default: the driver's; "
       "the sidecar must search it)."),
    _T("driver_rollout_timeout_seconds", "integer", "How long `pulumi up` waits for the driver's DaemonSet to "
       "roll out (every scheduled pod updated and ready) before it fails; 0: do not wait (the DaemonSet is "
       "created and the update goes on)."),
    _T("driver_max_surge", "integer", "Nodes at a time whose driver pod gets its replacement started beside it "
       "during a rollout (both serve until the old one stops; docs/upgrades.md)."),
    _T("driver_max_unavailable", "integer", "Nodes at a time whose driver pod is stopped before its replacement "
       "starts during a rollout (0 with driverMaxSurge 1: no node is ever without the driver)."),
    _T("neuron_core_device_class", "string", "DeviceClass of NeuronCores (Kubernetes 1.36+; "
       "docs/neuron-cores.md; default: neuroncore.aws.com for the default driverName, else cores.<driverName>)."),
    _T("extended_resource_name", "string", "Extended resource the whole-device DeviceClass serves to pods "
       "written for the Neuron device plugin ('' for none; left out before Kubernetes 1.36)."),
    _T("core_extended_resource_name", "string", "Extended resource the NeuronCore DeviceClass serves (logical "
       "cores at the node's LNC): auto (aws.amazon.com/neuroncore where the driver publishes NeuronCores), a name "
       "(on Kubernetes 1.36 it also turns NeuronCores on), or '' for none; left out before Kubernetes 1.36."),
    _T("core_partitions", "string", "NeuronCores with shared counters beside whole devices (the daemon's "
       "--core-partitions): auto (on Kubernetes 1.37+; on 1.36 only when a claim template requests NeuronCores or "
       "coreExtendedResourceName names a resource, since the 1.36 scheduler's cost per claim pod grows with nodes "
       "squared: docs/scale.md), on, or off."),
    _T("allow_slow_claim_scheduling", "boolean", "Deploy NeuronCores on Kubernetes 1.36 even where the predicted "
       "scheduler time per claim pod at the node groups' and pools' maximum size passes the scheduler's 10 s DRA "
       "filter limit (preview refuses it otherwise)."),
    _T("kubelet_plugins_dir", "string", "kubelet's plugins directory on the nodes."),
    _T("kubelet_registry_dir", "string", "kubelet's plugin registry directory on the nodes."),
    _T("driver_host_paths_root", "string", "Directory on the nodes holding the sys, dev and opt/aws/neuron "
       "trees the driver reads: / on real Neuron nodes; /run/neuron-dra-host on `neuron-dra cluster up`'s "
       "nodes, whose emulated Neuron host tree is there."),
    _T("efa_driver", "string", "AWS's EFA DRA driver (DRANET, Helm chart aws-dranet; docs/efa-dra-driver.md): "
       "auto installs it on the node groups with EFA interfaces (none on an existing cluster), install also on an "
       "existing cluster's EFA instance types (clusterInstanceTypes), external when the cluster already runs "
       "one. Claim templates that request EFA devices need one of them."),
    _T("claim_templates_module", "string", "Python module whose module-level claim templates are deployed "
       "and checked against the node groups ('' for none)."),
    _T("cluster_instance_types", "strings", "Existing-cluster mode: the Neuron instance types of its nodes; "
       "claim templates are checked against them (default: every catalog type)."),
    _T("catalog_file", "string", "A catalog file (YAML, docs/catalog-file.md) that adds or overrides instance "
       "types: node groups may use them, claim templates are checked against them, and the driver pods get "
       "the file (a ConfigMap), so a new instance type needs no new release."),
)


def _join(rows: Sequence[Setting]) -> tuple[Setting, ...]:
    """Each row completed with its field's config key and default; every field exactly once."""
    by_field = {f.name: f for f in fields(StackSettings) if "key" in f.metadata}  # not the derived `hardware`
    names = [r.field for r in rows]
    if sorted(names) != sorted(by_field) or len(set(names)) != len(names):
        raise AssertionError(f"settings table and StackSettings disagree: {sorted(set(names) ^ set(by_field))}")
    out = []
    for row in rows:
        f = by_field[row.field]
        default = None if f.default is MISSING else f.default
        out.append(Setting(row.field, row.kind, row.description, row.new_cluster_only, f.metadata["key"], default))
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _join(_ROWS)
SETTINGS_BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}
NODE_GROUP_KEYS: tuple[str, ...] = tuple(NODE_GROUP_FIELD_OF_KEY)
# Node group keys whose values are strings (the rest: integers, a boolean, a list and an object).
_NODE_POOL_STRINGS = ("name", "capacityReservationId", "availabilityZone", "rootVolumeKmsKeyId", "amiVersion")
_NODE_POOL_LISTS = ("instanceTypes", "instanceFamilies", "capacityTypes")
NODE_POOL_KEYS: tuple[str, ...] = tuple(NODE_POOL_FIELD_OF_KEY)
_NODE_GROUP_STRINGS = ("name", "instanceType", "capacityType", "capacityReservationId", "availabilityZone",
                       "rootVolumeKmsKeyId", "efaInterfaceType", "version")


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


def _decode_node_group(index: int, raw: Mapping[str, Any], hardware: Catalog = BUILTIN) -> NodeGroupSettings:
    where = f"{setting_name('nodeGroups')}[{index}]"
    kwargs: dict[str, Any] = {"where": where, "hardware": hardware}
    for key, value in raw.items():
        if key not in NODE_GROUP_FIELD_OF_KEY:
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
        elif key in _NODE_GROUP_STRINGS:
            if not isinstance(value, str):
                raise SettingError(f"{where}.{key}", value, "a string")
        elif key == "placementGroup" and not isinstance(value, bool):
            raise SettingError(f"{where}.{key}", value, "true or false")
        kwargs[NODE_GROUP_FIELD_OF_KEY[key]] = value
    if "name" not in kwargs:
        raise SettingError(f"{where}.name", None, "a DNS label naming the node group")
    return NodeGroupSettings(**kwargs)


def _decode_node_pool(index: int, raw: Mapping[str, Any], hardware: Catalog = BUILTIN) -> NodePoolSettings:
    where = f"{setting_name('nodePools')}[{index}]"
    kwargs: dict[str, Any] = {"where": where, "hardware": hardware}
    for key, value in raw.items():
        if key not in NODE_POOL_FIELD_OF_KEY:
            raise SettingError(f"{where}.{key}", value,
                               f"{_closest(key, NODE_POOL_KEYS)}the node pool keys: {', '.join(NODE_POOL_KEYS)}")
        if key in _NODE_POOL_LISTS:
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise SettingError(f"{where}.{key}", value, "a list of strings")
            value = tuple(value)
        elif key == "labels":
            if not isinstance(value, dict):
                raise SettingError(f"{where}.labels", value, "an object of label key -> value")
            value = dict(value)
        elif key in _NODE_POOL_STRINGS and not isinstance(value, str):
            raise SettingError(f"{where}.{key}", value, "a string")
        kwargs[NODE_POOL_FIELD_OF_KEY[key]] = value
    if "name" not in kwargs:
        raise SettingError(f"{where}.name", None, "a DNS label naming the node pool")
    return NodePoolSettings(**kwargs)


def _decode(setting: Setting, raw: object, hardware: Catalog = BUILTIN) -> object:
    """One setting's value; the neutral engine default of an optional setting ("" or []) decodes to unset."""
    decoded = _decode_scalar(setting_name(setting.key), setting.kind, raw)
    if setting.optional and decoded in ("", ()):
        return setting.default
    if setting.kind == "objects":
        assert isinstance(decoded, list)
        if setting.key == "nodePools":
            return tuple(_decode_node_pool(i, p, hardware) for i, p in enumerate(decoded))
        return tuple(_decode_node_group(i, g, hardware) for i, g in enumerate(decoded))
    return decoded


def _hardware(catalog_file: object) -> Catalog:
    """The built-in catalog, extended by the catalogFile setting (loaded once, before the node groups)."""
    if catalog_file is None:
        return BUILTIN
    try:
        return load_catalog(Path(str(catalog_file)).expanduser())
    except CatalogFileError as e:
        raise SettingError(setting_name("catalogFile"), catalog_file, f"a valid catalog file: {capped(str(e))}") from e


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
        if key not in SETTINGS_BY_KEY:
            raise SettingError(setting_name(key), value,
                               f"{_closest(key, list(SETTINGS_BY_KEY))}the settings: {', '.join(SETTINGS_BY_KEY)}")
        values[key] = value
    hardware = _hardware(_decode(SETTINGS_BY_KEY["catalogFile"], values["catalogFile"])
                         if "catalogFile" in values else None)
    decoded = {key: _decode(SETTINGS_BY_KEY[key], value, hardware) for key, value in values.items()}
    kwargs: dict[str, Any] = {SETTINGS_BY_KEY[key].field: value for key, value in decoded.items()}
    kwargs["hardware"] = hardware
    if kwargs.get("kubeconfig") is not None:
        for key, value in decoded.items():
            setting = SETTINGS_BY_KEY[key]
            # The engine passes Pulumi.yaml's defaults as values: only a value other than the default is refused.
            if setting.new_cluster_only and value != _decode(setting, setting.engine_default):
                raise SettingError(setting_name(key), values[key],
                                   "unset when neuron-dra:kubeconfig selects an existing cluster (the stack then "
                                   "installs only the driver and the claim templates)")
        kwargs.pop("node_groups", None)
        kwargs.pop("node_pools", None)
    elif "node_groups" not in kwargs and not kwargs.get("node_pools"):  # node pools alone: no default node group
        kwargs["node_groups"] = tuple(_decode_node_group(i, g, hardware) for i, g in enumerate(DEFAULT_NODE_GROUPS))
    return StackSettings(**kwargs)


def pulumi_project_config() -> dict[str, dict[str, Any]]:
    """The `config:` section of Pulumi.yaml that declares `SETTINGS` (types, descriptions, defaults).

    Every entry has a default (the engine requires declared settings without one). Pulumi's project config
    types are string, integer, boolean and array; `nodeGroups` (a list of objects) is declared by description
    and default only, which Pulumi accepts untyped.
    """
    out: dict[str, dict[str, Any]] = {}
    for s in SETTINGS:
        entry: dict[str, Any] = {}
        if s.kind in ("string", "integer", "boolean"):
            entry["type"] = s.kind
        elif s.kind == "strings":
            entry["type"] = "array"
            entry["items"] = {"type": "string"}
        entry["description"] = s.description
        entry["default"] = s.engine_default
        out[s.key] = entry
    return out
