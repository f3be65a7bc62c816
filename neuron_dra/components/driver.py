"""`NeuronDraDriver`: the DRA driver's Kubernetes objects, applied from `neuron_dra.driver.deploy`'s dicts.

The component adds nothing to those objects except the image reference: by default the image it builds from
`neuron_dra/driver/Dockerfile` of the directory the package runs from (a checkout or a pip install) and pushes to
an ECR repository it owns, pinned by digest; or the image given (`image`, e.g. the one the release workflow
publishes), pinned when given by digest (`components/driver_image.py`). Dependencies make the namespace, RBAC and the
node-restricting admission policy exist before the DaemonSet's pods start writing ResourceSlices. The Kubernetes
provider is the cluster's (`cluster=`) or `opts.provider` (Pulumi passes it on to the children). The objects are those
the cluster's Kubernetes minor serves (`DriverDeployOptions.kubernetes_version`, the rule in
`neuron_dra.driver.deploy.KUBERNETES_FEATURES`).

What `pulumi up` waits for: the Kubernetes provider waits until the DaemonSet has rolled out (every scheduled
pod updated and ready), by default up to `rollout_timeout_seconds` = 600, then fails the update (the objects
stay). 0 skips that wait (annotation `pulumi.com/skipAwait`): the update then ends once the apiserver has the
DaemonSet, whether or not its pods run (docs/pulumi-engine.md §3).

A driver is not renamed in place: given `previous_driver_name` (the name this stack's driver had at its last `up`;
the default stack reads it from its own previous outputs), a different `options.driver_name` fails the preview,
before any object is registered, with `DriverRenameError` (docs/upgrades.md "Renaming the driver").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from neuron_dra.components import driver_image
from neuron_dra.components.cluster import TrainiumCluster
from neuron_dra.components.inputs import checked, component_args, keyword_hints, on_cluster
from neuron_dra.components.k8s_objects import create_object, resource_name, rollout_wait
from neuron_dra.components.settings import (
    DEFAULT_ROLLOUT_TIMEOUT_SECONDS,
    SettingError,
    check_rollout_timeout,
    parse_kubernetes_version,
)
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions, Manifest
from neuron_dra.driver.model.k8s_names import DeviceClassNames


@keyword_hints
@dataclass(frozen=True, kw_only=True)
class NeuronDraDriverArgs:
    """Inputs of `NeuronDraDriver`.

    options: DriverDeployOptions -- namespace, driver name, DeviceClass names, extended resources, metrics,
        kubelet paths, ... (neuron_dra.driver.deploy; default: DriverDeployOptions()).
    image: Input[str] | None -- the driver image to run, `repo@sha256:<digest>` (pinned) or `repo:tag` (follows
        the tag; preview warns); None: build neuron_dra/driver/Dockerfile of source_dir and push it to
        image_registry, else to an ECR repository of this component (Docker with BuildKit where `pulumi up` runs).
    image_registry: Input[str] | None -- without image: a registry repository of yours to push the built image to
        (`<repository>:<version>-<content hash>`, with the Docker credentials of the machine running `pulumi up`);
        no ECR repository is created.
    force_delete_repository: bool -- let `pulumi destroy` delete the ECR repository with its images (default
        False: ECR refuses to delete a repository that holds images).
    cluster: TrainiumCluster | None -- the cluster to install into: its Kubernetes version decides what is
        rendered, its provider is used unless opts.provider is given, and the driver waits for the cluster's node
        groups made so far (create the driver after them).
    kubernetes_version: str | None -- without cluster: the cluster's Kubernetes minor ("1.34"); objects and fields
        that minor does not serve are left out (before 1.36: the NeuronCore DeviceClass, extendedResourceName and
        the device-taint setting). None: options.kubernetes_version (None: the newest minor's objects).
    source_dir: Path | None -- the build context: the directory holding neuron_dra/ (default: the one this package
        runs from, a checkout or site-packages).
    platform: str -- the image's platform (default linux/amd64).
    rollout_timeout_seconds: int -- how long `pulumi up` waits for the DaemonSet's rollout (default 600;
        0: not at all, annotation pulumi.com/skipAwait).
    previous_driver_name: Input[str | None] | None -- the driver name this stack deployed last (e.g. a
        StackReference to the stack itself, `own_previous_outputs()`); a different driver name is refused
        (`DriverRenameError`). None or "": nothing deployed yet, no check.
    """

    options: DriverDeployOptions = field(default_factory=DriverDeployOptions)
    image: pulumi.Input[str] | None = None
    image_registry: pulumi.Input[str] | None = None
    force_delete_repository: bool = False
    cluster: TrainiumCluster | None = None
    kubernetes_version: str | None = None
    source_dir: Path | None = None
    platform: str = "linux/amd64"
    rollout_timeout_seconds: int = DEFAULT_ROLLOUT_TIMEOUT_SECONDS
    previous_driver_name: pulumi.Input[str | None] | None = None

    def __post_init__(self) -> None:
        if self.force_delete_repository is not True and self.force_delete_repository is not False:
            raise SettingError("NeuronDraDriverArgs.force_delete_repository", self.force_delete_repository,
                               "true or false")
        check_rollout_timeout("NeuronDraDriverArgs.rollout_timeout_seconds", self.rollout_timeout_seconds)
        if self.options.ultraserver_groups:
            # The controller's Deployment runs the driver's image Output, and its objects keep their own resource
            # names: it is UltraServerGroups' to create, never a second time here.
            raise SettingError("NeuronDraDriverArgs.options.ultraserver_groups", True,
                               "false: create the UltraServer controller with UltraServerGroups(driver=...)")
        if self.kubernetes_version is not None:
            parse_kubernetes_version("NeuronDraDriverArgs.kubernetes_version", self.kubernetes_version)
            if self.cluster is not None and self.kubernetes_version != self.cluster.kubernetes_version:
                raise SettingError("NeuronDraDriverArgs.kubernetes_version", self.kubernetes_version,
                                   f"unset with cluster (the cluster runs {self.cluster.kubernetes_version})")
        if self.image is not None:
            object.__setattr__(self, "image", checked(self.image, driver_image.check_image))
        if self.image_registry is not None:
            if self.image is not None:
                raise SettingError(driver_image.REGISTRY_SETTING, self.image_registry,
                                   "unset when image is given (the registry is where a built image goes)")
            object.__setattr__(self, "image_registry", checked(self.image_registry, driver_image.check_registry))

    @property
    def deploy_options(self) -> DriverDeployOptions:
        """`options` for the cluster's Kubernetes version."""
        version = (self.cluster.kubernetes_version if self.cluster is not None
                   else self.kubernetes_version or self.options.kubernetes_version)
        return self.options.replace(kubernetes_version=version)

    def build_context(self) -> Path:
        """The directory the image is built from (without `image`), checked to hold what the build reads."""
        return driver_image.build_context(self.source_dir, "NeuronDraDriverArgs.source_dir")


class NeuronDraDriver(pulumi.ComponentResource):
    """The Neuron DRA driver: namespace, service account, RBAC, admission policy, NetworkPolicy, DeviceClasses,
    DaemonSet.

    `NeuronDraDriver(name, args, opts)` or `NeuronDraDriver(name, cluster=..., image=..., ...)` with the fields of
    `NeuronDraDriverArgs` as keyword arguments. Without `cluster`, give the Kubernetes provider as
    `opts.provider`.

    Outputs: namespace, driver_name, device_class_name, core_device_class_name (None where the minor has no
    NeuronCore class), class_names (the driver name and both class names, `k8s_names.device_class_names`), image,
    manifests (the rendered dicts), objects (`Kind/name` -> resource), repository (the ECR repository of a built
    image, else None).
    """

    namespace: str
    driver_name: str
    device_class_name: str
    core_device_class_name: str | None
    class_names: DeviceClassNames
    image: pulumi.Output[str]
    manifests: list[Manifest]
    objects: dict[str, pulumi.CustomResource]
    repository: aws.ecr.Repository | None

    def __init__(self, resource_name_: str, args: NeuronDraDriverArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("NeuronDraDriver", NeuronDraDriverArgs, args, kwargs)
        waits: list[pulumi.Resource] = []
        if args.cluster is not None:
            waits = [*args.cluster.node_group_dependencies, *args.cluster.node_groups]
        opts = on_cluster(args.cluster, opts)
        super().__init__("neuron-dra:index:NeuronDraDriver", resource_name_, None, opts)
        options = args.deploy_options
        self.options = options  # as rendered: ClaimTemplates(driver=...) reads what it publishes
        self.cluster = args.cluster
        self.namespace = options.namespace
        self.driver_name = options.driver_name
        self.device_class_name = options.device_class
        self.core_device_class_name = options.core_device_class_name if options.publishes_cores else None
        self.class_names = options.class_names  # what templates deployed with this driver name
        self.kubernetes_version = options.kubernetes_version
        self.repository = None
        if args.image is None and args.image_registry is not None:
            built = driver_image.build_into(resource_name_, args.build_context(), args.image_registry,
                                            platform=args.platform, opts=pulumi.ResourceOptions(parent=self))
            self.image = built.ref
        elif args.image is None:
            built = driver_image.build_and_push(resource_name_, args.build_context(), platform=args.platform,
                                                force_delete=args.force_delete_repository,
                                                opts=pulumi.ResourceOptions(parent=self))
            self.repository, self.image = built.repository, built.ref
        else:
            self.image = pulumi.Output.from_input(args.image).apply(_warn_if_floating)
        # Every object waits for the rename check: a refused rename registers nothing (the Automation API's and
        # `pulumi up --skip-preview`'s updates included, which run no preview first).
        guard = pulumi.Output.from_input(args.previous_driver_name).apply(
            functools.partial(check_driver_rename, current=options.driver_name))
        # The name to record as this stack's driver (its `driverName` export): only once the check passed, so a
        # refused rename leaves the recorded name as it was and the next update is compared with the real one.
        self.checked_driver_name: pulumi.Output[str] = guard.apply(lambda _: options.driver_name)
        # The dicts as `deploy` renders them, once; only the DaemonSet's container image waits for the reference.
        self.manifests = deploy.manifests(options)
        self.objects = {}
        # Every object of a kind: on 1.36+ there are two DeviceClasses, and the DaemonSet waits for both.
        by_kind: dict[str, list[pulumi.CustomResource]] = {}
        for manifest in self.manifests:
            kind = manifest["kind"]
            depends = [*waits, *(obj for k in _DEPENDS_ON.get(kind, ()) for obj in by_kind.get(k, ()))]
            monitor = kind == "DaemonSet" and manifest["metadata"]["name"] != options.daemonset_name
            if monitor:
                # neuron-monitor's (deploy/exporter.py, on by default) after the driver's DaemonSet: `pulumi
                # destroy` then deletes it first and waits for its pods to go, while the driver still runs to
                # unprepare their claims (with the driver gone first, kubelet retries the unprepare for ever and
                # the pods and the namespace stay Terminating). Its rollout is awaited as the driver's.
                depends += by_kind.get("DaemonSet", [])
            child = pulumi.ResourceOptions(parent=self, depends_on=depends)
            metadata: Manifest = manifest["metadata"]
            overrides: dict[str, Any] = {}
            if kind == "DaemonSet" and not monitor:
                # The driver's own DaemonSet (the exporter's runs AWS's image as rendered).
                overrides = {"spec": self.image.apply(functools.partial(_with_image, manifest["spec"]))}
            if kind == "DaemonSet":
                metadata, child = rollout_wait(manifest, child, args.rollout_timeout_seconds)
            overrides["metadata"] = guard.apply(functools.partial(_after_check, metadata))
            obj = create_object(resource_name(resource_name_, manifest), manifest, child, overrides)
            self.objects[deploy.object_key(manifest)] = obj
            by_kind.setdefault(kind, []).append(obj)
        self.register_outputs({"namespace": self.namespace, "image": self.image,
                               "deviceClass": self.device_class_name,
                               "coreDeviceClass": self.core_device_class_name})

    def device_classes(self) -> list[pulumi.CustomResource]:
        """The DeviceClass objects (claim templates that name them wait for these)."""
        return [obj for key, obj in self.objects.items() if key.startswith("DeviceClass/")]

    @property
    def device_class_names(self) -> list[str]:
        """The names of the DeviceClasses it creates (the NeuronCore class only where the minor serves it)."""
        return [m["metadata"]["name"] for m in self.manifests if m["kind"] == "DeviceClass"]


class DriverRenameError(ValueError):
    """A driver name that differs from the one this stack's driver runs under."""

    def __init__(self, previous: str, current: str) -> None:
        self.previous, self.current = previous, current
        super().__init__(
            f"driverName: this stack's driver runs as {previous!r}; renaming it to {current!r} in one update is "
            f"refused. The new name is a second driver: for the length of the update both would publish every "
            f"Neuron device of the same nodes as free, each with its own lock and checkpoint (both keyed by the "
            f"driver name), so one device could be given to two claims; and kubelet unprepares a claim only "
            f"through the driver that prepared it, so claims of {previous!r} could no longer be unprepared once "
            f"it is gone. To migrate: (1) drain the driver's nodes, or delete the workloads whose pods hold claims "
            f"of {previous!r}; (2) remove the old driver with its claim templates: `pulumi destroy` (a stack on an "
            f"existing cluster holds nothing else; a stack that also holds the cluster: docs/upgrades.md); (3) "
            f"`pulumi up` with driverName {current!r}. Or set driverName back to {previous!r}. "
            f"See docs/upgrades.md \"Renaming the driver\".")


def check_driver_rename(previous: object, current: str) -> None:
    """Refuse `current` when this stack's driver ran under another name (`previous`; None or "": none yet)."""
    if previous is None or previous == "":
        return
    if not isinstance(previous, str):
        raise SettingError("NeuronDraDriverArgs.previous_driver_name", previous,
                           "the driver name of the stack's last update (a string), or None")
    if previous != current:
        raise DriverRenameError(previous, current)


def _after_check(metadata: Manifest, _checked: None) -> Manifest:
    return metadata


def own_previous_outputs() -> pulumi.StackReference:
    """A reference to this very stack: what its last `pulumi up` exported (nothing for a new or destroyed stack).
    Read at preview too (a StackReference is a read); `neuron-dra plan` answers it with `PlanMocks(previous=...)`."""
    name = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    return pulumi.StackReference(f"{pulumi.get_stack()}-previous", stack_name=name)


def _warn_if_floating(image: str) -> str:
    if not driver_image.is_pinned(image):
        pulumi.log.warn(driver_image.floating_warning(image))
    return image


def _with_image(spec: Manifest, image: str) -> Manifest:
    """The DaemonSet's spec as rendered, its containers running `image` (the rendering's only Output)."""
    pod = spec["template"]["spec"]
    containers = [{**c, "image": image} for c in pod["containers"]]
    return {**spec, "template": {**spec["template"], "spec": {**pod, "containers": containers}}}


# What each object waits for: the namespace for namespaced objects, the role for its binding, the policy for
# its binding, and everything the driver's pods rely on for the DaemonSet (neuron-monitor's: its claim template,
# rendered after the driver's DaemonSet, so only the exporter's waits for it).
_DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "ServiceAccount": ("Namespace",),
    "ClusterRoleBinding": ("ClusterRole", "ServiceAccount"),
    "ValidatingAdmissionPolicyBinding": ("ValidatingAdmissionPolicy",),
    "NetworkPolicy": ("Namespace",),
    "ConfigMap": ("Namespace",),
    "ResourceClaimTemplate": ("Namespace", "DeviceClass"),
    "DaemonSet": ("Namespace", "ServiceAccount", "ClusterRoleBinding", "ValidatingAdmissionPolicyBinding",
                  "NetworkPolicy", "ConfigMap", "DeviceClass", "ResourceClaimTemplate"),
}
