"""`NeuronDraDriver`: the DRA driver's Kubernetes objects, applied from `neuron_dra.driver.deploy`'s dicts.

The component adds nothing to those objects except the image reference: the given image, else the image this
repository's release workflow publishes for the installed version (`deploy.DEFAULT_IMAGE`), or, with
`build_from_source`, the image it builds from a checkout's `driver/Dockerfile` (pulumi-docker-build, BuildKit) and
pushes to a new ECR repository, pinned by digest. Dependencies make the namespace, RBAC and the node-restricting
admission policy exist before the DaemonSet's pods start writing ResourceSlices. A Kubernetes provider is given as
`opts.provider` (Pulumi passes it on to the children).

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
from neuron_dra.components.k8s_objects import create_object, resource_name
from neuron_dra.components.settings import (
    DEFAULT_ROLLOUT_TIMEOUT_SECONDS,
    MAX_ROLLOUT_TIMEOUT_SECONDS,
    SettingError,
)
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions, Manifest

DOCKERFILE = Path("driver") / "Dockerfile"


def default_source_dir() -> Path:
    """The checkout this package runs from (editable installs); the image's build context."""
    return Path(neuron_dra.__file__).resolve().parent.parent


@dataclass(frozen=True)
class NeuronDraDriverArgs:
    """Inputs of `NeuronDraDriver`. `image` None: the published image of this version (`deploy.DEFAULT_IMAGE`);
    `build_from_source`: build `driver/Dockerfile` of the checkout `source_dir` (default: the one this package runs
    from) into a new ECR repository instead (needs Docker with BuildKit where `pulumi up` runs)."""

    options: DriverDeployOptions = field(default_factory=DriverDeployOptions)
    image: pulumi.Input[str] | None = None
    build_from_source: bool = False
    source_dir: Path | None = None
    platform: str = "linux/amd64"
    # How long `pulumi up` waits for the DaemonSet's rollout; 0: not at all (pulumi.com/skipAwait).
    rollout_timeout_seconds: int = DEFAULT_ROLLOUT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.build_from_source and self.image is not None:
            raise SettingError("NeuronDraDriverArgs.image (config neuron-dra:driverImage)", self.image,
                               "unset when build_from_source (neuron-dra:driverBuildFromSource) is true")
        t = self.rollout_timeout_seconds
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_ROLLOUT_TIMEOUT_SECONDS:
            raise SettingError("NeuronDraDriverArgs.rollout_timeout_seconds", t,
                               f"0 (do not wait for the rollout) or 1-{MAX_ROLLOUT_TIMEOUT_SECONDS} seconds")

    def dockerfile(self) -> Path:
        source = self.source_dir or default_source_dir()
        dockerfile = source / DOCKERFILE
        if not dockerfile.is_file():
            raise SettingError("NeuronDraDriverArgs.source_dir", str(source),
                               f"a source checkout with {DOCKERFILE} to build from (none at {dockerfile}); without "
                               f"build_from_source (neuron-dra:driverBuildFromSource) the published image "
                               f"{deploy.DEFAULT_IMAGE} is deployed")
        return dockerfile


class NeuronDraDriver(pulumi.ComponentResource):
    """The Neuron DRA driver: namespace, service account, RBAC, admission policy, DeviceClass, DaemonSet."""

    namespace: str
    driver_name: str
    device_class_name: str
    image: pulumi.Output[str]
    manifests: list[Manifest]
    objects: dict[str, pulumi.CustomResource]
    repository: aws.ecr.Repository | None

    def __init__(self, resource_name_: str, args: NeuronDraDriverArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("neuron-dra:index:NeuronDraDriver", resource_name_, None, opts)
        options = args.options
        self.namespace = options.namespace
        self.driver_name = options.driver_name
        self.device_class_name = options.device_class
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
            depends = [obj for k in _DEPENDS_ON.get(kind, ()) for obj in by_kind.get(k, ())]
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
                               "deviceClass": self.device_class_name})

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
            context=docker_build.BuildContextArgs(location=str(dockerfile.parent.parent)),
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
