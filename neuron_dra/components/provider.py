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

from neuron_dra.components import claims, cluster, driver, karpenter, nodegroup, nodepool
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
    """The instance types of the cluster's Trainium nodes, each optionally `type:lnc=N` (a TrainiumNodeGroup's
    checkTarget, a TrainiumNodePool's checkTargets): every template is checked to fit one. Stands for the Python
    `node_groups`/`node_pools` inputs."""
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
    """An EKS cluster for Trainium node groups (neuron_dra.components.TrainiumCluster). Node groups, Karpenter and
    pools take its outputs one by one (clusterName, vpcId, clusterSecurityGroupId, privateSubnetIds, kubeconfig):
    the cluster object itself cannot cross the language boundary (docs/components.md, "From other languages")."""

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


def _coredns(resource_name: str, parent: pulumi.Resource, cluster_name: pulumi.Input[str],
             version: pulumi.Input[str] | None, tags: Any, after: pulumi.Resource) -> None:
    """The cluster's CoreDNS add-on once `after` (nodes) exists: what `TrainiumCluster` does itself for the first
    node group given the cluster object (cluster.coredns_addon)."""
    cluster.coredns_addon(f"{resource_name}-coredns", cluster_name, version, tags or {},
                          pulumi.ResourceOptions(parent=parent, depends_on=[after]))


class TrainiumNodeGroupArgs(TypedDict, total=False):
    """The inputs of TrainiumNodeGroup (neuron_dra.components.TrainiumNodeGroupArgs) under the same names, placed
    by the cluster's outputs rather than the cluster object (`cluster=` in Python)."""

    name: str
    """Node group name, a DNS label of at most 40 characters (default: the resource name)."""
    instance_type: str
    """A Neuron instance type of the hardware catalog (default trn2.48xlarge)."""
    desired_size: int
    """Nodes (default 1)."""
    min_size: int
    """Fewest nodes (default 0)."""
    max_size: int
    """Most nodes (default: desired_size)."""
    capacity_type: str
    """ON_DEMAND or CAPACITY_BLOCK (default: CAPACITY_BLOCK with a reservation id)."""
    capacity_reservation_id: pulumi.Input[str]
    """A Capacity Block for ML (cr-...); needs availability_zone or subnet_ids in its AZ, min_size 0."""
    availability_zone: str
    """The group's AZ (default: the first of availability_zones for an EFA group)."""
    subnet_ids: pulumi.Input[list[str]]
    """The group's subnets (an EFA group: exactly one); default: candidate_subnet_ids in the AZs."""
    labels: dict[str, str]
    """Node labels (neuron-dra/node-group, neuron-dra/lnc and a Capacity Block's id are added)."""
    root_volume_size_gib: int
    """The encrypted gp3 root volume's size (default 500)."""
    root_volume_kms_key_id: str
    """A KMS key for the root volume (default: the account's EBS key)."""
    efa_interface_type: str
    """efa-only (default) or efa for network cards 1..n."""
    placement_group: bool
    """A cluster placement group (default: for EFA groups not on a Capacity Block)."""
    version: str
    """The nodes' Kubernetes minor (default: kubernetes_version)."""
    lnc: int
    """Logical NeuronCore config of the nodes: 1 or 2 on Trainium2/Trainium3 (default: the AMI's, 2)."""
    cluster_name: Required[pulumi.Input[str]]
    """The EKS cluster's name (TrainiumCluster's clusterName)."""
    vpc_id: Required[pulumi.Input[str]]
    """The cluster's VPC (TrainiumCluster's vpcId)."""
    cluster_security_group_id: Required[pulumi.Input[str]]
    """The cluster security group (TrainiumCluster's clusterSecurityGroupId), on every node interface."""
    kubernetes_version: Required[str]
    """The cluster's Kubernetes minor, e.g. "1.36": a plain string, as what is created depends on it."""
    candidate_subnet_ids: pulumi.Input[list[str]]
    """Subnets to choose from (TrainiumCluster's privateSubnetIds): those in the AZs are used, an EFA group takes
    the first by id. Needed unless subnet_ids is given."""
    availability_zones: list[str]
    """AZs offering the instance type (needed unless availability_zone or subnet_ids is given)."""
    security_group_ids: pulumi.Input[list[str]]
    """More security groups on the nodes' interfaces."""
    imds_hop_limit: int
    """IMDSv2 hop limit (default 1: only host-network pods reach IMDS and the node role)."""
    cni_policy_on_node_role: bool
    """AmazonEKS_CNI_Policy on the node role: true when the cluster's vpcCniIdentity is nodeRole (default false)."""
    tags: dict[str, str]
    """AWS tags."""
    install_coredns: bool
    """Install the cluster's CoreDNS add-on (tolerating the Neuron taint) once this group exists: set it on the
    cluster's first group with nodes (in Python the cluster object does this itself)."""
    coredns_version: pulumi.Input[str]
    """The CoreDNS add-on version with install_coredns (default: EKS's default for the minor)."""


class TrainiumNodeGroup(pulumi.ComponentResource):
    """An EKS managed node group of one Neuron instance type with its launch template (EFA interfaces, IMDSv2,
    encrypted root volume, the Neuron taint) and node role (neuron_dra.components.TrainiumNodeGroup). Give it
    `dependsOn` the cluster component so that the VPC CNI's identity exists before its nodes."""

    name: pulumi.Output[str]
    """The node group's name."""
    instance_type: pulumi.Output[str]
    """Its instance type."""
    lnc: pulumi.Output[int] | None
    """The nodes' LNC (absent where LNC does not apply)."""
    check_target: pulumi.Output[str]
    """How ClaimTemplates' instanceTypes name these nodes (`type` or `type:lnc=N`)."""
    node_group_arn: pulumi.Output[str]
    """The EKS node group's ARN."""
    role_arn: pulumi.Output[str]
    """The node role's ARN."""
    launch_template_id: pulumi.Output[str]
    """The launch template's id."""
    subnet_ids: pulumi.Output[list[str]]
    """The subnets its nodes use."""
    efa_security_group_id: pulumi.Output[str] | None
    """The security group of its EFA traffic (EFA groups only)."""

    def __init__(self, name: str, args: TrainiumNodeGroupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:index:TrainiumNodeGroup", name, {}, opts)
        given = {k: v for k, v in _wire_numbers(dict(args)).items() if k not in ("install_coredns", "coredns_version")}
        if _absent(given.get("subnet_ids")) and _absent(given.get("candidate_subnet_ids")):
            raise SettingError("TrainiumNodeGroup.candidate_subnet_ids", None,
                               "the cluster's private subnets (TrainiumCluster's privateSubnetIds), or subnet_ids")
        # The resource's dependsOn (the cluster, with its VPC CNI identity) reaches the EKS node group itself.
        ours = nodegroup.TrainiumNodeGroupArgs(**{"name": name, **given, "depends_on": _depends_on(opts)})
        inner = nodegroup.TrainiumNodeGroup(name, ours, pulumi.ResourceOptions(parent=self))
        if args.get("install_coredns"):
            _coredns(name, self, args["cluster_name"], args.get("coredns_version"), ours.tags, inner.node_group)
        self.name = pulumi.Output.from_input(inner.name)
        self.instance_type = pulumi.Output.from_input(inner.instance_type)
        if inner.lnc is not None:
            self.lnc = pulumi.Output.from_input(inner.lnc)
        self.check_target = pulumi.Output.from_input(ours.check_target)
        self.node_group_arn = inner.node_group.arn
        self.role_arn = inner.role.arn
        self.launch_template_id = inner.launch_template.id
        self.subnet_ids = inner.subnet_ids
        if inner.efa_security_group is not None:
            self.efa_security_group_id = inner.efa_security_group.id
        self.register_outputs({"name": self.name, "nodeGroupArn": self.node_group_arn})


def _depends_on(opts: pulumi.ResourceOptions | None) -> tuple[pulumi.Resource, ...]:
    """The resources of `opts.depends_on` (one or a list, as the host gives them)."""
    given = opts.depends_on if opts is not None else None
    if given is None:
        return ()
    items = list(given) if isinstance(given, list | tuple) else [given]
    return tuple(r for r in items if isinstance(r, pulumi.Resource))


def _absent(value: Any) -> bool:
    """An input not given (None or an empty list; an Output counts as given)."""
    return value is None or (isinstance(value, list) and not value)


class TrainiumKarpenterArgs(TypedDict, total=False):
    """The inputs of TrainiumKarpenter (neuron_dra.components.TrainiumKarpenterArgs), placed by the cluster's
    outputs rather than the cluster object."""

    cluster_name: Required[pulumi.Input[str]]
    """The EKS cluster's name (TrainiumCluster's clusterName)."""
    subnet_ids: Required[pulumi.Input[list[str]]]
    """Its private subnets, for the controller's node group (TrainiumCluster's privateSubnetIds)."""
    kubernetes_version: Required[str]
    """Its Kubernetes minor, e.g. "1.36" (the controller's node group)."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig, for the Karpenter chart (TrainiumCluster's kubeconfig); unset: the provider in
    the resource's `providers` option, or the ambient one."""
    chart_version: str
    """The Karpenter chart release (default the pinned one)."""
    static_capacity: bool
    """featureGates.staticCapacity: static NodePools with replicas (default true)."""
    system_instance_type: str
    """The controller nodes' instance type (default m7i.large)."""
    cni_policy_on_node_role: bool
    """AmazonEKS_CNI_Policy on the node roles: true when the cluster's vpcCniIdentity is nodeRole (default false)."""
    tags: dict[str, str]
    """AWS tags."""
    install_coredns: bool
    """Install the cluster's CoreDNS add-on once the controller's nodes exist (a cluster of Karpenter pools
    alone: its first nodes are these)."""
    coredns_version: pulumi.Input[str]
    """The CoreDNS add-on version with install_coredns (default: EKS's default for the minor)."""


class TrainiumKarpenter(pulumi.ComponentResource):
    """Karpenter with its IAM (node role and access entry, controller role through EKS Pod Identity), its
    interruption queue, two controller nodes and its chart (neuron_dra.components.TrainiumKarpenter). Give it
    `dependsOn` the cluster component (its Pod Identity agent must exist first); pools depend on it."""

    node_role_name: pulumi.Output[str]
    """The role of the nodes Karpenter launches (TrainiumNodePool's nodeRoleName)."""
    node_role_arn: pulumi.Output[str]
    """That role's ARN."""
    controller_role_arn: pulumi.Output[str]
    """The controller's role."""
    queue_name: pulumi.Output[str]
    """The interruption queue."""
    chart_version: pulumi.Output[str]
    """The chart release installed."""

    def __init__(self, name: str, args: TrainiumKarpenterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:index:TrainiumKarpenter", name, {}, opts)
        given: dict[str, Any] = {k: v for k, v in dict(args).items()
                                 if k not in ("kubeconfig", "install_coredns", "coredns_version")}
        ours = karpenter.TrainiumKarpenterArgs(**given, depends_on=_depends_on(opts))  # the cluster's Pod Identity
        inner = karpenter.TrainiumKarpenter(name, ours, _k8s_opts(name, self, args.get("kubeconfig")))
        if args.get("install_coredns"):
            _coredns(name, self, args["cluster_name"], args.get("coredns_version"), ours.tags, inner.system_node_group)
        self.node_role_name = inner.node_role.name
        self.node_role_arn = inner.node_role.arn
        self.controller_role_arn = inner.controller_role.arn
        self.queue_name = inner.queue.name
        self.chart_version = pulumi.Output.from_input(ours.chart_version)
        self.register_outputs({"nodeRoleName": self.node_role_name, "queueName": self.queue_name})


class TrainiumNodePoolArgs(TypedDict, total=False):
    """The inputs of TrainiumNodePool (neuron_dra.components.TrainiumNodePoolArgs), placed by the outputs of the
    cluster and of Karpenter rather than the objects."""

    name: str
    """The NodePool's and EC2NodeClass's name, a DNS label (default: the resource name)."""
    instance_types: list[str]
    """Neuron instance types of the catalog (and/or instance_families)."""
    instance_families: list[str]
    """Every type of these families (a dynamic pool)."""
    capacity_types: list[str]
    """on-demand, spot and/or reserved (default: reserved with a reservation id, else on-demand)."""
    replicas: int
    """A static pool of this many nodes (unset: a dynamic pool)."""
    capacity_reservation_id: str
    """A Capacity Block or UltraServer reservation (cr-...) of a static pool."""
    max_nodes: int
    """The most nodes (default: replicas, or the dynamic default)."""
    availability_zone: str
    """Only this AZ."""
    labels: dict[str, str]
    """Node labels (neuron-dra/node-pool, neuron-dra/lnc and a reservation's id are added)."""
    root_volume_size_gib: int
    """The encrypted gp3 root volume's size (default 500)."""
    root_volume_kms_key_id: str
    """A KMS key for the root volume."""
    lnc: int
    """Logical NeuronCore config of the nodes (default: the AMI's, 2 on Trainium2)."""
    ami_version: str
    """latest or an EKS AMI release such as v20261120 (Karpenter alias al2023@<version>)."""
    node_role_name: Required[pulumi.Input[str]]
    """The nodes' role (TrainiumKarpenter's nodeRoleName)."""
    subnet_ids: Required[pulumi.Input[list[str]]]
    """The nodes' subnets (TrainiumCluster's privateSubnetIds)."""
    security_group_ids: Required[pulumi.Input[list[str]]]
    """The nodes' security groups (e.g. [TrainiumCluster's clusterSecurityGroupId])."""
    imds_hop_limit: int
    """IMDSv2 hop limit (default 1)."""
    tags: dict[str, str]
    """AWS tags."""
    kubeconfig: pulumi.Input[str]
    """The cluster's kubeconfig; unset: the provider in the resource's `providers` option, or the ambient one."""


class TrainiumNodePool(pulumi.ComponentResource):
    """A Karpenter NodePool and its EC2NodeClass for Neuron instances (neuron_dra.components.TrainiumNodePool).
    Give it `dependsOn` the TrainiumKarpenter component: its chart installs the CRDs."""

    name: pulumi.Output[str]
    """The pool's name."""
    instance_types: pulumi.Output[list[str]]
    """Its instance types."""
    check_targets: pulumi.Output[list[str]]
    """How ClaimTemplates' instanceTypes name its nodes."""
    node_limit: pulumi.Output[int]
    """Its most nodes (limits.nodes)."""
    efa_count: pulumi.Output[int] | None
    """EFA interfaces a node (absent without EFA)."""

    def __init__(self, name: str, args: TrainiumNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:index:TrainiumNodePool", name, {}, opts)
        given = {k: v for k, v in _wire_numbers(dict(args)).items() if k != "kubeconfig"}
        for key in ("instance_types", "instance_families", "capacity_types"):
            if isinstance(given.get(key), list):
                given[key] = tuple(given[key])
        # The resource's dependsOn (Karpenter, whose chart installs the CRDs) reaches the NodePool and
        # EC2NodeClass themselves: a component's children do not inherit its dependencies.
        ours = nodepool.TrainiumNodePoolArgs(**{"name": name, **given, "depends_on": _depends_on(opts)})
        inner = nodepool.TrainiumNodePool(name, ours, _k8s_opts(name, self, args.get("kubeconfig")))
        self.name = pulumi.Output.from_input(inner.name)
        self.instance_types = pulumi.Output.from_input(list(inner.instance_types))
        self.check_targets = pulumi.Output.from_input(list(inner.check_targets))
        self.node_limit = pulumi.Output.from_input(inner.node_limit)
        if inner.efa_count:
            self.efa_count = pulumi.Output.from_input(inner.efa_count)
        self.register_outputs({"name": self.name, "checkTargets": self.check_targets})


COMPONENTS: list[type[pulumi.ComponentResource]] = [TrainiumCluster, TrainiumNodeGroup, TrainiumKarpenter,
                                                   TrainiumNodePool, NeuronDraDriver, ClaimTemplates]


def main() -> None:
    """Serve the components (the plugin's entry point, plugin/__main__.py)."""
    from pulumi.provider.experimental import component_provider_host

    from neuron_dra import __version__

    component_provider_host(COMPONENTS, name=PACKAGE, version=__version__)
