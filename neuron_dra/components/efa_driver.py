"""`EfaDraDriver`: AWS's EFA DRA driver (DRANET) installed the way EKS documents it, on EFA nodes only.

EKS installs it with Helm: chart `aws-dranet` from https://aws.github.io/eks-charts, release `aws-dranet` in
`kube-system` (docs/efa-dra-driver.md §1). This component is that Helm release (pulumi-kubernetes
`helm.v3.Release`), pinned to a chart version and an image, with three values of its own:

- `supportedInstanceLabels`: the chart's node affinity (each label key a node selector term, `key In values`;
  the terms are ORed). By default the chart lists every EFA-capable instance type; here it lists the node groups
  given (label `neuron-dra/node-group`, set by `TrainiumNodeGroup`), the Karpenter pools given (label
  `neuron-dra/node-pool`, set by `TrainiumNodePool` on its nodes) or the instance types given, so DRANET runs only
  where EFA interfaces are attached;
- `tolerations`: the Neuron taint, which every Neuron node carries and the chart does not tolerate;
- `deviceClass.name`: the DeviceClass the claim checks know (driver/model/efa.py).

Do not run it on nodes where the EFA device plugin runs (EKS: the two cannot coexist on a node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from neuron_dra.components.inputs import component_args, keyword_hints, on_cluster
from neuron_dra.components.settings import SettingError
from neuron_dra.driver.deploy import NODE_GROUP_LABEL, NODE_POOL_LABEL
from neuron_dra.driver.errortext import did_you_mean
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.efa import EFA_DEVICE_CLASS, EFA_DRIVER
from neuron_dra.driver.model.k8s_names import (
    DNS_SUBDOMAIN_RULE,
    LABEL_VALUE_RULE,
    is_dns_subdomain,
    is_label_value,
    neuron_toleration,
)

# Pinned: the newest aws-dranet chart of github.com/aws/eks-charts (stable/aws-dranet/Chart.yaml) and its image.
EKS_CHARTS_REPOSITORY = "https://aws.github.io/eks-charts"
EFA_CHART = "aws-dranet"
EFA_CHART_VERSION = "1.0.0"
EFA_IMAGE_REPOSITORY = "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/dranet"
EFA_IMAGE_TAG = "v1.2.0-eksbuild.2"
EFA_NAMESPACE = "kube-system"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DEFAULT_TIMEOUT_SECONDS = 600
MAX_TIMEOUT_SECONDS = 3600

# A stack that installs no EFA DRA driver because the cluster already runs one.
EXTERNAL: Literal["external"] = "external"

_EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@keyword_hints
@dataclass(frozen=True)
class EfaDraDriverArgs:
    """Inputs of `EfaDraDriver`. Where DRANET runs: `node_groups` (names of `TrainiumNodeGroup`s with EFA
    interfaces) and/or `node_pools` (names of `TrainiumNodePool`s whose nodes get EFA interfaces), or else
    `instance_types` (EFA-capable instance types, for clusters whose nodes this project did not create).
    `cluster`: the TrainiumCluster whose Kubernetes provider installs it (else `opts.provider`)."""

    node_groups: Sequence[str] = ()
    instance_types: Sequence[str] = ()
    node_pools: Sequence[str] = ()
    cluster: Any = None  # a TrainiumCluster (typed Any: claims.py imports this module, not the cluster's)
    chart_version: str = EFA_CHART_VERSION  # an exact chart version: what is installed does not drift
    chart_repository: str = EKS_CHARTS_REPOSITORY
    image_repository: str = EFA_IMAGE_REPOSITORY  # EKS's image registries are per region; us-west-2 serves all
    image_tag: str = EFA_IMAGE_TAG
    namespace: str = EFA_NAMESPACE
    release_name: str = EFA_CHART
    device_class_name: str = EFA_DEVICE_CLASS  # what claim templates name (Drivers.efa_class)
    extra_values: Mapping[str, Any] = field(default_factory=dict)  # more chart values (values.yaml), top-level keys
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS  # how long `pulumi up` waits for the release to be ready
    hardware: Catalog = field(default=BUILTIN, repr=False)  # to refuse known instance types without EFA

    def __post_init__(self) -> None:
        for key in ("node_groups", "node_pools", "instance_types"):
            value = getattr(self, key)
            if isinstance(value, str):
                raise SettingError(f"EfaDraDriverArgs.{key}", value, "a list of names, not one string")
            object.__setattr__(self, key, tuple(value))
        if bool(self.node_groups or self.node_pools) == bool(self.instance_types):
            raise SettingError("EfaDraDriverArgs.node_groups", list(self.node_groups),
                               "the names of the node groups (and/or node_pools) with EFA interfaces, or else "
                               "instance_types (not both, not neither)")
        for key in ("node_groups", "node_pools", "instance_types"):
            for name in getattr(self, key):
                if not is_label_value(name):
                    raise SettingError(f"EfaDraDriverArgs.{key}", name, LABEL_VALUE_RULE)
        if self.cluster is not None:
            self._check_names_in(self.cluster)
        no_efa = [t for t in self.instance_types if t in self.hardware and self.hardware.spec(t).efa_count == 0]
        if no_efa:
            with_efa = [t for t in self.hardware.names if self.hardware.spec(t).efa_count > 0]
            raise SettingError("EfaDraDriverArgs.instance_types", no_efa[0],
                               f"instance types with EFA interfaces, such as {', '.join(with_efa)}")
        if not _EXACT_VERSION.match(self.chart_version):
            raise SettingError("EfaDraDriverArgs.chart_version", self.chart_version,
                               f"an exact chart version such as {EFA_CHART_VERSION} (no range: the install is pinned)")
        if not _IMAGE_TAG.match(self.image_tag) or self.image_tag == "latest":
            raise SettingError("EfaDraDriverArgs.image_tag", self.image_tag,
                               f"a pinned image tag such as {EFA_IMAGE_TAG} (not latest)")
        for key in ("namespace", "release_name", "device_class_name"):
            value = getattr(self, key)
            if not is_dns_subdomain(value) or (key != "device_class_name" and len(value) > 53):
                raise SettingError(f"EfaDraDriverArgs.{key}", value, DNS_SUBDOMAIN_RULE
                                   + (" of at most 53 characters (Helm release names)" if key != "device_class_name"
                                      else ""))
        t = self.timeout_seconds
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_TIMEOUT_SECONDS:
            raise SettingError("EfaDraDriverArgs.timeout_seconds", t, f"1-{MAX_TIMEOUT_SECONDS} seconds")
        owned = sorted(set(self.extra_values) & set(_OWN_VALUES))
        if owned:
            raise SettingError("EfaDraDriverArgs.extra_values", owned[0],
                               f"chart values other than {', '.join(_OWN_VALUES)} (set those with their own fields)")

    def _check_names_in(self, cluster: Any) -> None:
        """With `cluster`: each named node group and pool is one of the cluster's (made with cluster=...), so the
        driver's node selector matches nodes that exist."""
        for key, made in (("node_groups", getattr(cluster, "node_groups", [])),
                          ("node_pools", getattr(cluster, "node_pools", []))):
            known = [str(getattr(c, "name", "")) for c in made]
            for name in getattr(self, key):
                if name not in known:
                    kind = key[:-1].replace("_", " ")
                    raise SettingError(f"EfaDraDriverArgs.{key}", name,
                                       f"the name of a {kind} of this cluster ({', '.join(known) or 'none yet'}: "
                                       f"create the {kind} with cluster=... before the EfaDraDriver)"
                                       f"{did_you_mean(name, known)}")

    def values(self) -> dict[str, Any]:
        """The chart values the release is installed with."""
        # The chart makes one node selector term per key, each `key In values` with the same values.
        if self.instance_types:
            keys, names = [INSTANCE_TYPE_LABEL], list(self.instance_types)
        else:
            keys = [*([NODE_GROUP_LABEL] if self.node_groups else []), *([NODE_POOL_LABEL] if self.node_pools else [])]
            names = list(dict.fromkeys([*self.node_groups, *self.node_pools]))
        return {
            **dict(self.extra_values),
            "image": {"repository": self.image_repository, "tag": self.image_tag},
            "supportedInstanceLabels": {"keys": keys, "values": names},
            "tolerations": [neuron_toleration()],
            "deviceClass": {"create": True, "name": self.device_class_name},
        }


_OWN_VALUES = ("image", "supportedInstanceLabels", "tolerations", "deviceClass")


class EfaDraDriver(pulumi.ComponentResource):
    """DRANET's Helm release: a DaemonSet on the EFA nodes and the DeviceClass `efa.networking.k8s.aws`.

    `EfaDraDriver(name, args, opts)` or `EfaDraDriver(name, cluster=..., node_groups=[...], ...)`. Outputs:
    driver_name, device_class_name, namespace, release, and where it runs (node_groups, node_pools,
    instance_types)."""

    driver_name: str
    device_class_name: str
    namespace: str
    release: k8s.helm.v3.Release

    def __init__(self, resource_name_: str, args: EfaDraDriverArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("EfaDraDriver", EfaDraDriverArgs, args, kwargs)
        opts = on_cluster(args.cluster, opts)
        super().__init__("neuron-dra:index:EfaDraDriver", resource_name_, None, opts)
        self.node_groups = args.node_groups
        self.node_pools = args.node_pools
        self.instance_types = args.instance_types
        self.driver_name = EFA_DRIVER  # fixed by the DRANET binary
        self.device_class_name = args.device_class_name
        self.namespace = args.namespace
        self.release = k8s.helm.v3.Release(
            f"{resource_name_}-release",
            name=args.release_name,
            chart=EFA_CHART,
            version=args.chart_version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=args.chart_repository),
            namespace=args.namespace,
            values=args.values(),
            timeout=args.timeout_seconds,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"releaseStatus": self.release.status, "deviceClass": self.device_class_name,
                               "driverName": self.driver_name})


EfaDriverRef = EfaDraDriver | Literal["external"]


def class_requests(manifest: Mapping[str, Any], device_class: str) -> list[str]:
    """The names of a ResourceClaimTemplate's requests (and firstAvailable subrequests) for `device_class`
    (the EFA class here, the NeuronCore class in core_scale.py)."""
    found = []
    for request in manifest.get("spec", {}).get("spec", {}).get("devices", {}).get("requests") or ():
        exact = request.get("exactly") or {}
        if exact.get("deviceClassName") == device_class:
            found.append(str(request.get("name")))
        for sub in request.get("firstAvailable") or ():
            if sub.get("deviceClassName") == device_class:
                found.append(f"{request.get('name')}/{sub.get('name')}")
    return found


def missing_efa_driver(template: str, requests: Sequence[str], device_class: str = EFA_DEVICE_CLASS) -> SettingError:
    """The refusal for a template that asks for EFA devices in a stack that installs no EFA DRA driver."""
    return SettingError(
        "ClaimTemplatesArgs.efa_driver", None,
        f"an EfaDraDriver, or '{EXTERNAL}' when the cluster already runs an EFA DRA driver: claim template "
        f"{template} requests EFA devices ({', '.join(requests)}: DeviceClass {device_class}) and nothing in this "
        "stack publishes them, so its pods would stay Pending. The default stack installs the EFA DRA driver when "
        "a node group has EFA interfaces; on an existing cluster set neuron-dra:efaDriver to install or external")
