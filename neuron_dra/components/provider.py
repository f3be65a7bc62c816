"""The components for programs in other Pulumi languages (TypeScript, Go, C#, Java, YAML): the component provider
that `plugin/PulumiPlugin.yaml` (`runtime: python`) runs, hosted by Pulumi's
`pulumi.provider.experimental.component_provider_host` (docs/components.md, "From other languages").

The host infers the package schema from type annotations and calls each component class as
`Component(name, args_dict, opts)`, `args_dict` holding the inputs under their Python names. So each component here
is a thin adapter: a TypedDict of what another language can express (strings, numbers, bools, lists, maps), turned
into our own Args, which validate as they do for Python programs (no second validation here), and a child of our
component, whose outputs it re-exports. What the host cannot express (Python objects: other components, a
ClaimTemplate, a check function) is given in its closest declarative form, said at each input.

No `from __future__ import annotations`: the host reads the annotations as objects, not strings.
"""

from typing import Any, Required, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from neuron_dra.components import claims, cluster, driver
from neuron_dra.components.efa_driver import EXTERNAL
from neuron_dra.components.settings import DEFAULT_ROLLOUT_TIMEOUT_SECONDS, SettingError
from neuron_dra.driver.deploy.options import DriverDeployOptions

PACKAGE = "neuron-dra"  # the schema's package name: resource tokens are `neuron-dra:index:<Component>`


def _k8s_opts(resource_name: str, parent: pulumi.Resource, kubeconfig: pulumi.Input[str] | None
              ) -> pulumi.ResourceOptions:
    """The child's options: under `parent`, on a Kubernetes provider for `kubeconfig` if given (else the provider
    the caller passed in `providers`, or the ambient one)."""
    if kubeconfig is None:
        return pulumi.ResourceOptions(parent=parent)
    provider = k8s.Provider(f"{resource_name}-k8s", kubeconfig=kubeconfig,
                            opts=pulumi.ResourceOptions(parent=parent))
    return pulumi.ResourceOptions(parent=parent, provider=provider)


class NeuronDraDriverArgs(TypedDict, total=False):
    """The inputs of NeuronDraDriver (neuron_dra.components.NeuronDraDriverArgs) for an existing cluster."""

    options: dict[str, Any]
    """The driver's deploy options (DriverDeployOptions) under their Python field names, e.g. `namespace`,
    `driver_name`, `image_pull_policy`, `metrics_port`; an unknown name or a bad value is refused naming it."""
    image: pulumi.Input[str]
    """The driver image to run, `repo@sha256:<digest>` (pinned) or `repo:tag`; unset: built and pushed to ECR."""
    kubernetes_version: str
    """The cluster's Kubernetes minor, e.g. "1.35" (what is deployed depends on it)."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig (e.g. a TrainiumCluster's `kubeconfig` output); unset: the Kubernetes provider
    given in the resource's `providers` option, or the ambient one. Stands for the Python `cluster` input."""
    force_delete_repository: bool
    """Let `pulumi destroy` delete the ECR repository with its images (only without `image`)."""
    platform: str
    """The built image's platform (default linux/amd64)."""
    rollout_timeout_seconds: int
    """How long `pulumi up` waits for the DaemonSet's rollout (0: not at all)."""


class NeuronDraDriver(pulumi.ComponentResource):
    """The Neuron DRA driver: namespace, service account, RBAC, admission policy, NetworkPolicy, DeviceClasses,
    DaemonSet (neuron_dra.components.NeuronDraDriver)."""

    namespace: pulumi.Output[str]
    """The driver's namespace."""
    driver_name: pulumi.Output[str]
    """The DRA driver name its ResourceSlices publish."""
    device_class_name: pulumi.Output[str]
    """The DeviceClass of whole Neuron devices."""
    core_device_class_name: pulumi.Output[str] | None
    """The DeviceClass of NeuronCores (absent where the Kubernetes minor has none)."""
    device_class_names: pulumi.Output[list[str]]
    """Every DeviceClass it creates."""
    image: pulumi.Output[str]
    """The image the DaemonSet runs."""

    def __init__(self, name: str, args: NeuronDraDriverArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:index:NeuronDraDriver", name, {}, opts)
        ours = driver.NeuronDraDriverArgs(
            options=_deploy_options(_wire_numbers(args.get("options") or {})),
            image=args.get("image"),
            kubernetes_version=args.get("kubernetes_version"),
            force_delete_repository=args.get("force_delete_repository", False),
            platform=args.get("platform", "linux/amd64"),
            rollout_timeout_seconds=_wire_numbers(args.get("rollout_timeout_seconds",
                                                            DEFAULT_ROLLOUT_TIMEOUT_SECONDS)),
        )
        inner = driver.NeuronDraDriver(name, ours, _k8s_opts(name, self, args.get("kubeconfig")))
        self.namespace = pulumi.Output.from_input(inner.namespace)
        self.driver_name = pulumi.Output.from_input(inner.driver_name)
        self.device_class_name = pulumi.Output.from_input(inner.device_class_name)
        if inner.core_device_class_name is not None:
            self.core_device_class_name = pulumi.Output.from_input(inner.core_device_class_name)
        self.device_class_names = pulumi.Output.from_input(inner.device_class_names)
        self.image = inner.image
        # Children wait for the driver's DeviceClasses: a template naming them is admitted once they exist.
        self.register_outputs({"namespace": self.namespace, "deviceClassName": self.device_class_name,
                               "image": self.image})


def _wire_numbers(value: Any) -> Any:
    """`value` with whole floats as ints, in lists and maps too. Pulumi's wire format has only doubles, and the
    host (3.272) hands integer inputs on as the float it received; our Args take ints (a fraction stays a float for
    them to refuse)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_wire_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire_numbers(v) for k, v in value.items()}
    return value


def _deploy_options(given: dict[str, Any]) -> DriverDeployOptions:
    """DriverDeployOptions from a map of its fields (its own validation names a bad field); a map is all the host
    gives for a model of this many fields."""
    if not isinstance(given, dict):
        raise SettingError("NeuronDraDriver.options", given, "a map of DriverDeployOptions fields")
    return DriverDeployOptions(**given)


class ClaimTemplatesArgs(TypedDict, total=False):
    """The inputs of ClaimTemplates (neuron_dra.components.ClaimTemplatesArgs) for an existing cluster."""

    templates_file: Required[str]
    """A Python file defining neuron_dra.claim_templates.ClaimTemplate objects at module level, loaded as
    `neuron-dra check` loads one (the templates are Python objects: the host has no schema for them)."""
    instance_types: list[str]
    """The instance types of the cluster's Trainium nodes, each optionally `type@lnc=N`: every template is checked
    to fit one. Stands for the Python `node_groups`/`node_pools` inputs."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig; unset: the provider in the resource's `providers` option, or the ambient one."""
    efa_targets: list[str]
    """Where templates requesting EFA devices must fit (default: instance_types)."""
    efa_driver_external: bool
    """The cluster runs an EFA DRA driver installed otherwise (the Python `efa_driver="external"`)."""
    allow_slow_scheduling: bool
    """Deploy even where scheduling NeuronCores is slow on Kubernetes 1.36."""


class ClaimTemplates(pulumi.ComponentResource):
    """One resource.k8s.io/v1 ResourceClaimTemplate per template, after its check passed
    (neuron_dra.components.ClaimTemplates)."""

    names: pulumi.Output[list[str]]
    """The templates' `namespace/name`."""
    manifests: pulumi.Output[list[dict[str, Any]]]
    """The ResourceClaimTemplates as deployed."""

    def __init__(self, name: str, args: ClaimTemplatesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        from neuron_dra.claim_templates.loader import load_templates

        super().__init__(f"{PACKAGE}:index:ClaimTemplates", name, {}, opts)
        ours = claims.ClaimTemplatesArgs(
            templates=load_templates(args["templates_file"]),  # a LoadError names the file
            instance_types=tuple(args.get("instance_types") or ()),
            efa_driver=EXTERNAL if args.get("efa_driver_external") else None,
            efa_targets=args.get("efa_targets"),
            allow_slow_scheduling=args.get("allow_slow_scheduling", False),
        )
        inner = claims.ClaimTemplates(name, ours, _k8s_opts(name, self, args.get("kubeconfig")))
        self.names = pulumi.Output.from_input(inner.names)
        self.manifests = pulumi.Output.from_input(inner.manifests)
        self.register_outputs({"names": self.names})


class TrainiumClusterArgs(TypedDict, total=False):
    """The inputs of TrainiumCluster (neuron_dra.components.TrainiumClusterArgs), under the same names."""

    cluster_name: pulumi.Input[str]
    """EKS cluster name (default: the component's resource name)."""
    kubernetes_version: str
    """Kubernetes minor EKS offers, e.g. "1.36"."""
    vpc_id: pulumi.Input[str]
    """An existing VPC (with private_subnet_ids); unset: a new VPC."""
    private_subnet_ids: pulumi.Input[list[str]]
    """Private subnets of vpc_id, at least two AZs."""
    public_subnet_ids: pulumi.Input[list[str]]
    """Public subnets of vpc_id (load balancers)."""
    vpc_cidr: str
    """CIDR of a new VPC."""
    availability_zones: list[str]
    """AZs of a new VPC."""
    nat_gateways: str
    """NAT gateways of a new VPC: Single or OnePerAz."""
    admin_principal_arns: pulumi.Input[list[str]]
    """IAM roles/users given cluster-admin access entries."""
    endpoint_public_access: bool
    """Whether the API endpoint is reachable from the internet."""
    public_access_cidrs: pulumi.Input[list[str]]
    """CIDRs allowed to the public endpoint."""
    vpc_cni_version: pulumi.Input[str]
    """The vpc-cni add-on version (default: EKS's default for the minor)."""
    coredns_version: pulumi.Input[str]
    """The coredns add-on version."""
    kube_proxy_version: pulumi.Input[str]
    """The kube-proxy add-on version."""
    pod_identity_agent_version: pulumi.Input[str]
    """The eks-pod-identity-agent add-on version."""
    efa_only_interfaces: bool
    """Some node group uses EFA-only interfaces."""
    vpc_cni_identity: str
    """podIdentity or nodeRole."""
    network_policy: bool
    """The VPC CNI enforces NetworkPolicies."""
    tags: dict[str, str]
    """AWS tags on everything created."""


class TrainiumCluster(pulumi.ComponentResource):
    """An EKS cluster for Trainium node groups (neuron_dra.components.TrainiumCluster). Node groups and pools,
    which take the cluster object, are Python only (see docs/components.md, "From other languages")."""

    cluster_name: pulumi.Output[str]
    """The EKS cluster's name."""
    kubernetes_version: pulumi.Output[str]
    """Its Kubernetes minor."""
    kubeconfig: pulumi.Output[str]
    """A kubeconfig for it (give it to NeuronDraDriver and ClaimTemplates)."""
    vpc_id: pulumi.Output[str]
    """Its VPC."""
    private_subnet_ids: pulumi.Output[list[str]]
    """Its private subnets."""
    public_subnet_ids: pulumi.Output[list[str]]
    """Its public subnets."""
    cluster_security_group_id: pulumi.Output[str]
    """The cluster security group."""
    oidc_provider_arn: pulumi.Output[str]
    """The IAM OIDC provider's ARN."""

    def __init__(self, name: str, args: TrainiumClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:index:TrainiumCluster", name, {}, opts)
        inner = cluster.TrainiumCluster(name, cluster.TrainiumClusterArgs(**args),
                                        pulumi.ResourceOptions(parent=self))
        self.cluster_name = inner.cluster_name
        self.kubernetes_version = pulumi.Output.from_input(inner.kubernetes_version)
        self.kubeconfig = inner.kubeconfig
        self.vpc_id = inner.vpc_id
        self.private_subnet_ids = inner.private_subnet_ids
        self.public_subnet_ids = inner.public_subnet_ids
        self.cluster_security_group_id = inner.cluster_security_group_id
        self.oidc_provider_arn = inner.oidc_provider_arn
        self.register_outputs({"clusterName": self.cluster_name, "kubeconfig": self.kubeconfig})


COMPONENTS: list[type[pulumi.ComponentResource]] = [TrainiumCluster, NeuronDraDriver, ClaimTemplates]


def main() -> None:
    """Serve the components (the plugin's entry point, plugin/__main__.py)."""
    from pulumi.provider.experimental import component_provider_host

    from neuron_dra import __version__

    component_provider_host(COMPONENTS, name=PACKAGE, version=__version__)
