"""`NeuronDraDriver`: the DRA driver's Kubernetes objects, applied from `neuron_dra.driver.deploy`'s dicts.

The component adds nothing to those objects except the image reference: the given image, else the image this
repository's release workflow publishes for the installed version (`deploy.DEFAULT_IMAGE`), or, with
`build_from_source`, the image it builds from a checkout's `neuron_dra/driver/Dockerfile` (pulumi-docker-build,
BuildKit) and pushes to a new ECR repository, pinned by digest. Dependencies make the namespace, RBAC and the
node-restricting admission policy exist before the DaemonSet's pods start writing ResourceSlices. The Kubernetes
provider is the cluster's (`cluster=`) or `opts.provider` (Pulumi passes it on to the children). The objects are those
the cluster's Kubernetes minor serves (`DriverDeployOptions.kubernetes_version`, the rule in
`neuron_dra.driver.deploy.KUBERNETES_FEATURES`).

What `pulumi up` waits for: the Kubernetes provider waits until the DaemonSet has rolled out (every scheduled
pod updated and ready), by default up to `rollout_timeout_seconds` = 600, then fails the update (the objects
stay). 0 skips that wait (annotation `pulumi.com/skipAwait`): the update then ends once the apiserver has the
DaemonSet, whether or not its pods run (docs/pulumi-engine.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import neuron_dra
from neuron_dra import __version__
from neuron_dra.components.cluster import TrainiumCluster
from neuron_dra.components.inputs import checked
from neuron_dra.components.k8s_objects import create_object, resource_name
from neuron_dra.components.settings import (
    DEFAULT_ROLLOUT_TIMEOUT_SECONDS,
    MAX_ROLLOUT_TIMEOUT_SECONDS,
    SettingError,
    parse_kubernetes_version,
)
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions, Manifest

DOCKERFILE = Path("neuron_dra") / "driver" / "Dockerfile"


def default_source_dir() -> Path:
    """The checkout this package runs from (editable installs); the image's build context."""
    return Path(neuron_dra.__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class NeuronDraDriverArgs:
    """Inputs of `NeuronDraDriver`.

    options: DriverDeployOptions -- namespace, driver name, DeviceClass names, extended resources, metrics,
        kubelet paths, ... (neuron_dra.driver.deploy; default: DriverDeployOptions()).
    image: Input[str] | None -- the driver image to run; None: the image this version's release workflow
        publishes (`deploy.DEFAULT_IMAGE`).
    build_from_source: bool -- build neuron_dra/driver/Dockerfile of the checkout source_dir into a new ECR repository
        instead (Docker with BuildKit where `pulumi up` runs; default False).
    cluster: TrainiumCluster | None -- the cluster to install into: its Kubernetes version decides what is
        rendered, its provider is used unless opts.provider is given, and the driver waits for the cluster's node
        groups made so far (create the driver after them).
    kubernetes_version: str | None -- without cluster: the cluster's Kubernetes minor ("1.34"); objects and fields
        that minor does not serve are left out (before 1.36: the NeuronCore DeviceClass, extendedResourceName and
        the device-taint setting). None: options.kubernetes_version (None: the newest minor's objects).
    source_dir: Path | None -- the checkout to build the image from (default: the one this package runs from).
    platform: str -- the image's platform (default linux/amd64).
    rollout_timeout_seconds: int -- how long `pulumi up` waits for the DaemonSet's rollout (default 600;
        0: not at all, annotation pulumi.com/skipAwait).
    """

    options: DriverDeployOptions = field(default_factory=DriverDeployOptions)
    image: pulumi.Input[str] | None = None
    build_from_source: bool = False
    cluster: TrainiumCluster | None = None
    kubernetes_version: str | None = None
    source_dir: Path | None = None
    platform: str = "linux/amd64"
    rollout_timeout_seconds: int = DEFAULT_ROLLOUT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.build_from_source and self.image is not None:
            raise SettingError("NeuronDraDriverArgs.image (config neuron-dra:driverImage)", self.image,
                               "unset when build_from_source (neuron-dra:driverBuildFromSource) is true")
        t = self.rollout_timeout_seconds
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_ROLLOUT_TIMEOUT_SECONDS:
            raise SettingError("NeuronDraDriverArgs.rollout_timeout_seconds", t,
                               f"0 (do not wait for the rollout) or 1-{MAX_ROLLOUT_TIMEOUT_SECONDS} seconds")
        if self.kubernetes_version is not None:
            parse_kubernetes_version("NeuronDraDriverArgs.kubernetes_version", self.kubernetes_version)
            if self.cluster is not None and self.kubernetes_version != self.cluster.kubernetes_version:
                raise SettingError("NeuronDraDriverArgs.kubernetes_version", self.kubernetes_version,
                                   f"unset with cluster (the cluster runs {self.cluster.kubernetes_version})")
        if self.image is not None:
            object.__setattr__(self, "image", checked(self.image, _check_image))

    @property
    def deploy_options(self) -> DriverDeployOptions:
        """`options` for the cluster's Kubernetes version."""
        version = (self.cluster.kubernetes_version if self.cluster is not None
                   else self.kubernetes_version or self.options.kubernetes_version)
        return replace(self.options, kubernetes_version=version)

    def dockerfile(self) -> Path:
        source = self.source_dir or default_source_dir()
        dockerfile = source / DOCKERFILE
        if not dockerfile.is_file():
            raise SettingError("NeuronDraDriverArgs.source_dir", str(source),
                               f"a source checkout with {DOCKERFILE} to build from (none at {dockerfile}); without "
                               f"build_from_source (neuron-dra:driverBuildFromSource) the published image "
                               f"{deploy.DEFAULT_IMAGE} is deployed")
        return dockerfile


def _check_image(image: object) -> None:
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise SettingError("NeuronDraDriverArgs.image", image, "a container image reference without spaces")


class NeuronDraDriver(pulumi.ComponentResource):
    """The Neuron DRA driver: namespace, service account, RBAC, admission policy, NetworkPolicy, DeviceClasses,
    DaemonSet.

    `NeuronDraDriver(name, args, opts)` or `NeuronDraDriver(name, cluster=..., image=..., ...)` with the fields of
    `NeuronDraDriverArgs` as keyword arguments. Without `cluster`, give the Kubernetes provider as
    `opts.provider`.

    Outputs: namespace, driver_name, device_class_name, core_device_class_name (None where the minor has no
    NeuronCore class), image, manifests (the rendered dicts), objects (`Kind/name` -> resource), repository.
    """

    namespace: str
    driver_name: str
    device_class_name: str
    core_device_class_name: str | None
    image: pulumi.Output[str]
    manifests: list[Manifest]
    objects: dict[str, pulumi.CustomResource]
    repository: aws.ecr.Repository | None

    def __init__(self, resource_name_: str, args: NeuronDraDriverArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        if args is not None and kwargs:
            raise TypeError("NeuronDraDriver: give either args or keyword arguments, not both")
        args = args if args is not None else NeuronDraDriverArgs(**kwargs)
        waits: list[pulumi.Resource] = []
        if args.cluster is not None:
            waits = [*args.cluster.node_group_dependencies, *args.cluster.node_groups]
            opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(provider=args.cluster.provider), opts)
        super().__init__("neuron-dra:index:NeuronDraDriver", resource_name_, None, opts)
        options = args.deploy_options
        self.options = options  # as rendered: ClaimTemplates(driver=...) reads what it publishes
        self.cluster = args.cluster
        self.namespace = options.namespace
        self.driver_name = options.driver_name
        self.device_class_name = options.device_class
        self.core_device_class_name = options.core_device_class_name if options.publishes_cores else None
        self.kubernetes_version = options.kubernetes_version
        self.repository = None
        if args.build_from_source:
            self.image = self._build_image(resource_name_, args)
        else:
            self.image = pulumi.Output.from_input(args.image if args.image is not None else deploy.DEFAULT_IMAGE)
        # The dicts as `deploy` renders them; only the DaemonSet's spec waits for the image reference.
        self.manifests = deploy.manifests(options)
        self.objects = {}
        # Every object of a kind: on 1.36+ there are two DeviceClasses, and the DaemonSet waits for both.
        by_kind: dict[str, list[pulumi.CustomResource]] = {}
        for manifest in self.manifests:
            kind = manifest["kind"]
            depends = [*waits, *(obj for k in _DEPENDS_ON.get(kind, ()) for obj in by_kind.get(k, ()))]
            overrides: dict[str, Any] | None = None
            child = pulumi.ResourceOptions(parent=self, depends_on=depends)
            if kind == "DaemonSet":
                overrides = {
                    "spec": self.image.apply(lambda ref: deploy.daemonset(replace(options, image=ref))["spec"]),
                }
                overrides["metadata"], child = _await(manifest, child, args.rollout_timeout_seconds)
            obj = create_object(resource_name(resource_name_, manifest), manifest, child, overrides)
            self.objects[deploy.object_key(manifest)] = obj
            by_kind.setdefault(kind, []).append(obj)
        self.register_outputs({"namespace": self.namespace, "image": self.image,
                               "deviceClass": self.device_class_name,
                               "coreDeviceClass": self.core_device_class_name})

    def device_classes(self) -> list[pulumi.CustomResource]:
        """The DeviceClass objects (claim templates that name them wait for these)."""
        return [obj for key, obj in self.objects.items() if key.startswith("DeviceClass/")]

    def _build_image(self, name: str, args: NeuronDraDriverArgs) -> pulumi.Output[str]:
        dockerfile = args.dockerfile()
        child = pulumi.ResourceOptions(parent=self)
        self.repository = aws.ecr.Repository(
            f"{name}-repo",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="AES256")],
            force_delete=True,  # the repository holds only this stack's driver image
            opts=child,
        )
        repo = self.repository
        token = aws.ecr.get_authorization_token_output(registry_id=repo.registry_id)
        image = docker_build.Image(
            f"{name}-image",
            context=docker_build.BuildContextArgs(location=str(dockerfile.parents[2])),
            dockerfile=docker_build.DockerfileArgs(location=str(dockerfile)),
            platforms=[docker_build.Platform(args.platform)],
            push=True,
            tags=[repo.repository_url.apply(lambda url: f"{url}:{__version__}")],
            registries=[docker_build.RegistryArgs(address=repo.repository_url, username=token.user_name,
                                                  password=token.password)],
            opts=child,
        )
        # `ref` is tag@digest once pushed: the DaemonSet pins the exact build.
        return image.ref


SKIP_AWAIT = "pulumi.com/skipAwait"


def _await(manifest: Manifest, opts: pulumi.ResourceOptions, timeout_seconds: int
           ) -> tuple[Manifest, pulumi.ResourceOptions]:
    """The DaemonSet's metadata and options for what `pulumi up` waits for: its rollout for at most
    `timeout_seconds` (custom timeouts), or nothing (0: the provider's skipAwait annotation)."""
    metadata = dict(manifest["metadata"])
    if timeout_seconds == 0:
        metadata["annotations"] = {**metadata.get("annotations", {}), SKIP_AWAIT: "true"}
        return metadata, opts
    timeout = f"{timeout_seconds}s"
    return metadata, pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout)))


# What each object waits for: the namespace for namespaced objects, the role for its binding, the policy for
# its binding, and everything the driver's pods rely on for the DaemonSet.
_DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "ServiceAccount": ("Namespace",),
    "ClusterRoleBinding": ("ClusterRole", "ServiceAccount"),
    "ValidatingAdmissionPolicyBinding": ("ValidatingAdmissionPolicy",),
    "NetworkPolicy": ("Namespace",),
    "ConfigMap": ("Namespace",),
    "DaemonSet": ("Namespace", "ServiceAccount", "ClusterRoleBinding", "ValidatingAdmissionPolicyBinding",
                  "NetworkPolicy", "ConfigMap", "DeviceClass"),
}
