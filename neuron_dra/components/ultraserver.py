"""`UltraServerGroups`: the UltraServer group controller and the group DeviceClass (docs/ultraserver.md §2, §3).

Applied from `neuron_dra.driver.deploy.ultraserver`'s dicts: ServiceAccount, ClusterRole and binding, the Lease Role
and binding, the ValidatingAdmissionPolicies that keep the controller to group slices and its member labels, the
DeviceClass `ultraserver.<driver name>` and the one-replica Deployment (its pods tolerate the Neuron taint: rendered
there). The component adds one thing to those objects: the image, the driver component's own `image` Output, so the
controller runs exactly the driver's image, built here or given, whichever way the driver chose it.

Its namespaced objects wait for the driver's Namespace. The default stack creates it where a node group or
Karpenter pool holds an UltraServer type (catalog `ultraserver`: trn2u.48xlarge, trn3p.48xlarge), or an existing
cluster's `clusterInstanceTypes` name one (`ultraserver_types`).

What `pulumi up` waits for: by default nothing past the apiserver taking the Deployment (`rollout_timeout_seconds`
0, annotation `pulumi.com/skipAwait`): its pod needs a node, and a stack whose node groups are still empty (a
Capacity Block not yet active) would otherwise fail its update; N > 0 waits up to N s for the rollout.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from neuron_dra.components.driver import NeuronDraDriver
from neuron_dra.components.inputs import component_args, on_cluster
from neuron_dra.components.k8s_objects import create_object, resource_name, rollout_wait
from neuron_dra.components.settings import SettingError, StackSettings, check_rollout_timeout
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import Manifest
from neuron_dra.driver.deploy import ultraserver as controller
from neuron_dra.driver.model.catalog import Catalog

# Fields of UltraServerControllerOptions the Args pass through (the options check them; errors name the Args field).
_OPTION_FIELDS = ("name", "taint_effect", "resync_seconds", "shared_counters")


@dataclass(frozen=True, kw_only=True)
class UltraServerGroupsArgs:
    """Inputs of `UltraServerGroups`.

    driver: NeuronDraDriver -- the driver whose UltraServers it publishes: its driver name (the group slices' driver
        and the DeviceClass `ultraserver.<driver name>`), its namespace (the controller's objects go there and wait
        for the driver's Namespace), its image (the same Output) and its Kubernetes provider (the cluster's, when
        the driver has `cluster`; else give `opts.provider`).
    name: str -- the Deployment, ServiceAccount and Lease (default neuron-dra-ultraserver); cluster-scoped objects
        are `<name>-<driver name>`.
    taint_effect: str -- the effect of the taints a group device gets while a member is missing or unhealthy:
        NoSchedule (default), NoExecute (also evicts running pods of the group's claim) or PreferNoSchedule.
    resync_seconds: int -- a full pass at least this often (1-3600, default 60); events start one sooner.
    rollout_timeout_seconds: int -- how long `pulumi up` waits for the Deployment's rollout (default 0: not at all,
        annotation pulumi.com/skipAwait; its pod needs a node, which an empty node group does not have yet).
    shared_counters: str -- "auto": keep a 4-node UltraServer's whole and halves apart with shared counters where
        the API server serves them (1.36+); "off" (default): never, because on 1.36 they cost every DRA pod's
        scheduling, which grows faster than the cluster (measured: docs/ultraserver.md §2a).
    """

    driver: NeuronDraDriver
    name: str = controller.DEFAULT_NAME
    taint_effect: str = "NoSchedule"
    resync_seconds: int = 60
    rollout_timeout_seconds: int = 0
    shared_counters: str = "off"

    def __post_init__(self) -> None:
        if not isinstance(self.driver, NeuronDraDriver):
            raise SettingError("UltraServerGroupsArgs.driver", self.driver, "a NeuronDraDriver")
        check_rollout_timeout("UltraServerGroupsArgs.rollout_timeout_seconds", self.rollout_timeout_seconds)
        self.controller_options()

    def controller_options(self, image: str = deploy.DEFAULT_IMAGE) -> controller.UltraServerControllerOptions:
        """The controller's options (the deploy module checks each value; its error is restated under the Args
        field). `image` is the driver's, known only once its Output resolves."""
        try:
            return controller.UltraServerControllerOptions(
                driver_name=self.driver.driver_name, namespace=self.driver.namespace, image=image,
                name=self.name, taint_effect=self.taint_effect, resync_seconds=self.resync_seconds,
                shared_counters=self.shared_counters)
        except ValueError as e:
            text = str(e)
            key = next((k for k in _OPTION_FIELDS if text.startswith(f"UltraServerControllerOptions.{k}:")), None)
            if key is None:
                raise
            raise SettingError(f"UltraServerGroupsArgs.{key}", getattr(self, key),
                               text.split("allowed: ", 1)[-1]) from e


class UltraServerGroups(pulumi.ComponentResource):
    """The UltraServer group controller (one Deployment from the driver's image) and the group DeviceClass.

    `UltraServerGroups(name, args, opts)` or `UltraServerGroups(name, driver=..., ...)` with the fields of
    `UltraServerGroupsArgs` as keyword arguments.

    Outputs: device_class_name (`ultraserver.<driver name>`, what `UltraServerJob` names), driver_name, namespace,
    image (the driver's Output), manifests (the rendered dicts, with the driver's image as rendered before it is
    known: the Deployment gets the Output), objects (`Kind/name` -> resource).
    """

    device_class_name: str
    driver_name: str
    namespace: str
    image: pulumi.Output[str]
    manifests: list[Manifest]
    objects: dict[str, pulumi.CustomResource]

    def __init__(self, resource_name_: str, args: UltraServerGroupsArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("UltraServerGroups", UltraServerGroupsArgs, args, kwargs)
        driver = args.driver
        opts = on_cluster(driver.cluster, opts)
        super().__init__("neuron-dra:index:UltraServerGroups", resource_name_, None, opts)
        options = args.controller_options()
        self.driver_name = options.driver_name
        self.namespace = options.namespace
        self.image = driver.image
        self.manifests = controller.manifests(options)
        self.device_class_name = controller.group_device_class(options)["metadata"]["name"]
        namespace = [obj for key, obj in driver.objects.items() if key.startswith("Namespace/")]
        self.objects = {}
        by_kind: dict[str, list[pulumi.CustomResource]] = {}
        for manifest in self.manifests:
            kind = manifest["kind"]
            depends: list[pulumi.Resource] = [*(namespace if manifest["metadata"].get("namespace") else ()),
                                              *(o for k in _DEPENDS_ON.get(kind, ()) for o in by_kind.get(k, ()))]
            child = pulumi.ResourceOptions(parent=self, depends_on=depends)
            overrides: dict[str, Any] | None = None
            if kind == "Deployment":
                overrides = {"spec": self.image.apply(functools.partial(_pod_spec, manifest["spec"]))}
                overrides["metadata"], child = rollout_wait(manifest, child, args.rollout_timeout_seconds)
            obj = create_object(resource_name(resource_name_, manifest), manifest, child, overrides)
            self.objects[deploy.object_key(manifest)] = obj
            by_kind.setdefault(kind, []).append(obj)
        self.register_outputs({"deviceClass": self.device_class_name, "namespace": self.namespace,
                               "image": self.image})


def _pod_spec(spec: Manifest, image: str) -> Manifest:
    """The Deployment's spec as rendered, its container running the driver's `image`."""
    pod = spec["template"]["spec"]
    containers = [{**c, "image": image} for c in pod["containers"]]
    return {**spec, "template": {**spec["template"], "spec": {**pod, "containers": containers}}}


# What each object waits for (besides the driver's Namespace for namespaced ones).
_DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "ClusterRoleBinding": ("ClusterRole", "ServiceAccount"),
    "RoleBinding": ("Role", "ServiceAccount"),
    "ValidatingAdmissionPolicyBinding": ("ValidatingAdmissionPolicy",),
    "Deployment": ("ServiceAccount", "ClusterRoleBinding", "RoleBinding", "ValidatingAdmissionPolicyBinding",
                   "DeviceClass"),
}


def ultraserver_types(instance_types: Sequence[str], hardware: Catalog) -> tuple[str, ...]:
    """The UltraServer types (catalog `ultraserver`) among `instance_types`, in order, once each."""
    return tuple(dict.fromkeys(t for t in instance_types
                               if t in hardware and hardware.spec(t).ultraserver is not None))


def stack_ultraserver_types(settings: StackSettings) -> tuple[str, ...]:
    """Where the default stack runs the controller: the UltraServer types of its node groups and Karpenter pools
    (new cluster), or those `clusterInstanceTypes` names (existing cluster; its default, every catalog type, is
    not a statement that the cluster has UltraServers, so it creates none)."""
    if settings.existing_cluster:
        return ultraserver_types(settings.cluster_instance_types, settings.hardware)
    return ultraserver_types(settings.node_instance_types, settings.hardware)
