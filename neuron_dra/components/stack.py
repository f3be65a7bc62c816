"""The default stack program: settings -> components -> exports. `__main__.py` runs it; so does `neuron-dra plan`.

New-cluster mode (no `kubeconfig`): a TrainiumCluster, one TrainiumNodeGroup per `nodeGroups` entry, with
`nodePools` Karpenter (TrainiumKarpenter) and one TrainiumNodePool per entry, CoreDNS once there are nodes,
the driver and the claim templates (checked against the node groups' and pools' instance types).
Existing-cluster mode (`kubeconfig` set): only the driver and the claim templates, through a Kubernetes
provider for that kubeconfig; no AWS resource is created.

Where the node groups or pools hold UltraServer types (or an existing cluster's `clusterInstanceTypes` names one),
the UltraServer group controller and its DeviceClass (`UltraServerGroups`, from the driver's image).

AWS's EFA DRA driver (`EfaDraDriver`) is installed on the node groups with EFA interfaces, or (`efaDriver`
install) on an existing cluster's EFA instance types.

AZs: a node group without `subnetIds` or `availabilityZone` goes to the AZs that offer its instance type
(looked up with `ec2:DescribeInstanceTypeOfferings`; trn2 exists in few AZs); an EFA group takes the first one
only. A new VPC spans those AZs (at least two, as EKS requires).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from neuron_dra.components import core_scale
from neuron_dra.components.claims import ClaimTemplates, ClaimTemplatesArgs, TemplateCheck, module_templates
from neuron_dra.components.cluster import TrainiumCluster, TrainiumClusterArgs
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs, own_previous_outputs
from neuron_dra.components.efa_driver import EXTERNAL, EfaDraDriver, EfaDraDriverArgs, EfaDriverRef
from neuron_dra.components.karpenter import TrainiumKarpenter, TrainiumKarpenterArgs
from neuron_dra.components.monitoring import serves_pod_monitors
from neuron_dra.components.nodegroup import TrainiumNodeGroup, TrainiumNodeGroupArgs
from neuron_dra.components.nodepool import TrainiumNodePool, TrainiumNodePoolArgs
from neuron_dra.components.settings import (
    PROJECT,
    NodePoolSettings,
    SettingError,
    StackSettings,
    setting_name,
)
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.ultraserver import UltraServerGroups, UltraServerGroupsArgs, stack_ultraserver_types
from neuron_dra.driver.deploy import DriverDeployOptions

MAX_NON_EFA_ZONES = 3  # spread non-EFA groups over at most this many AZs


@dataclass(frozen=True)
class ZonePlan:
    """Which AZs each node group may use, and the AZs of a new VPC."""

    vpc_zones: tuple[str, ...]
    group_zones: Mapping[str, tuple[str, ...]]


@dataclass
class StackResult:
    settings: StackSettings
    cluster: TrainiumCluster | None
    node_groups: list[TrainiumNodeGroup]
    driver: NeuronDraDriver
    templates: ClaimTemplates
    efa_driver: EfaDraDriver | None = None
    exports: dict[str, Any] = field(default_factory=dict)
    karpenter: TrainiumKarpenter | None = None
    node_pools: list[TrainiumNodePool] = field(default_factory=list)
    ultraserver_groups: UltraServerGroups | None = None


def offered_zones(instance_type: str) -> tuple[str, ...]:
    """AZs of the current region that offer `instance_type`, sorted."""
    result = aws.ec2.get_instance_type_offerings(
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])],
        location_type="availability-zone",
    )
    return tuple(sorted(set(result.locations or ())))


def available_zones() -> tuple[str, ...]:
    """The region's regular AZs (no Local or Wavelength Zones), sorted."""
    result = aws.get_availability_zones(
        state="available",
        filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
    )
    return tuple(sorted(result.names or ()))


def plan_zones(settings: StackSettings) -> ZonePlan:
    """Choose each node group's AZs and (for a new VPC) the VPC's AZs."""
    chosen: dict[str, tuple[str, ...]] = {}
    wanted = set(settings.availability_zones)
    for group in settings.node_groups:
        if group.subnet_ids:
            chosen[group.name] = ()
            continue
        if group.availability_zone:
            zones: tuple[str, ...] = (group.availability_zone,)
        else:
            zones = offered_zones(group.instance_type)
            if wanted:
                zones = tuple(z for z in zones if z in wanted)
            if not zones:
                where = " among neuron-dra:availabilityZones" if wanted else " in this region"
                raise SettingError(f"{group.where}.instanceType", group.instance_type,
                                   f"an instance type offered{where} (EC2 offers it in no such AZ)")
        chosen[group.name] = zones[:1] if group.is_efa else zones[:MAX_NON_EFA_ZONES]
    if settings.vpc_id is not None:
        return ZonePlan((), chosen)
    pool_zones = _pool_zones(settings)
    if settings.availability_zones:
        outside_groups = [(g.where, z) for g in settings.node_groups for z in chosen[g.name] if z not in wanted]
        outside_pools = [(p.where, p.availability_zone) for p in settings.node_pools
                         if p.availability_zone and p.availability_zone not in wanted]
        for where, zone in (*outside_groups, *outside_pools):
            raise SettingError(f"{where}.availabilityZone", zone,
                               f"one of neuron-dra:availabilityZones ({', '.join(settings.availability_zones)})")
        return ZonePlan(tuple(settings.availability_zones), chosen)
    vpc_zones = list(dict.fromkeys([*(z for zones in chosen.values() for z in zones), *pool_zones]))
    for zone in available_zones():
        if len(vpc_zones) >= 2:
            break
        if zone not in vpc_zones:
            vpc_zones.append(zone)
    if len(vpc_zones) < 2:
        raise SettingError(setting_name("availabilityZones"), vpc_zones, "two or more AZs (EKS needs two)")
    return ZonePlan(tuple(vpc_zones), chosen)


def _pool_zones(settings: StackSettings) -> list[str]:
    """AZs a new VPC needs for the node pools: a pool's own AZ (a Capacity Block's), else the first AZ offering
    each of its instance types, so that Karpenter finds a subnet where it can launch them."""
    zones: list[str] = []
    for pool in settings.node_pools:
        if pool.availability_zone:
            zones.append(pool.availability_zone)
            continue
        offered = [z for t in pool.types for z in offered_zones(t)[:1]]
        if not offered:
            raise SettingError(f"{pool.where}.instanceTypes", list(pool.types),
                               "instance types offered in this region (EC2 offers none of them in any AZ)")
        zones.extend(offered)
    return zones


def driver_options(settings: StackSettings) -> DriverDeployOptions:
    options = settings.driver_options()
    if (settings.pod_monitor == "auto" and settings.existing_cluster and options.metrics_port
            and settings.kubeconfig is not None
            and serves_pod_monitors(kubeconfig_input(settings.kubeconfig), pulumi.log.warn)):
        options = options.replace(pod_monitor=True)
    return options


def build_stack(
    settings: StackSettings,
    *,
    stack: str,
    source_dir: Path | None = None,
    check: TemplateCheck | None = None,
) -> StackResult:
    """Create every resource of the stack from validated settings."""
    templates = module_templates(settings.claim_templates_module) if settings.claim_templates_module else []
    cluster: TrainiumCluster | None = None
    groups: list[TrainiumNodeGroup] = []
    karpenter: TrainiumKarpenter | None = None
    pools: list[TrainiumNodePool] = []
    if settings.existing_cluster:
        assert settings.kubeconfig is not None
        kubeconfig: pulumi.Output[str] = pulumi.Output.secret(kubeconfig_input(settings.kubeconfig))
        provider = k8s.Provider("existing-cluster", kubeconfig=kubeconfig)
    else:
        zones = plan_zones(settings)
        cluster = TrainiumCluster("cluster", TrainiumClusterArgs(
            cluster_name=settings.resolved_cluster_name(stack),
            kubernetes_version=settings.kubernetes_version,
            vpc_id=settings.vpc_id,
            private_subnet_ids=settings.private_subnet_ids,
            public_subnet_ids=settings.public_subnet_ids,
            vpc_cidr=settings.vpc_cidr,
            availability_zones=zones.vpc_zones,
            nat_gateways=settings.nat_gateways,
            admin_principal_arns=settings.admin_principal_arns,
            endpoint_public_access=settings.endpoint_public_access,
            public_access_cidrs=settings.public_access_cidrs,
            vpc_cni_version=settings.vpc_cni_version,
            coredns_version=settings.coredns_version,
            kube_proxy_version=settings.kube_proxy_version,
            pod_identity_agent_version=settings.pod_identity_agent_version,
            efa_only_interfaces=settings.uses_efa_only,
            vpc_cni_identity=settings.vpc_cni_identity,
            network_policy=settings.vpc_cni_network_policy,
        ))
        # Each group takes its placement from the cluster, waits for the VPC CNI's identity, and the first
        # one with nodes installs CoreDNS.
        groups = [TrainiumNodeGroup(f"ng-{group.name}", TrainiumNodeGroupArgs.from_settings(
            group, cluster=cluster, availability_zones=zones.group_zones[group.name],
            imds_hop_limit=settings.imds_hop_limit)) for group in settings.node_groups]
        if settings.node_pools:  # no group has nodes: TrainiumKarpenter installs CoreDNS on its own nodes
            karpenter, pools = _karpenter(cluster, settings)
        if cluster.coredns is None:
            pulumi.log.warn("no node group has nodes yet (every desiredSize is 0): the CoreDNS add-on is created "
                            "by the first `pulumi up` after a node group has nodes")
        provider = cluster.provider
        kubeconfig = cluster.kubeconfig
    cores = core_scale.choose(settings, driver_options(settings), templates)
    core_scale.check(settings, cores, cores.templates, pulumi.log.warn)
    driver = NeuronDraDriver("driver", NeuronDraDriverArgs(
        options=cores.options, image=settings.driver_image, image_registry=settings.driver_image_registry,
        source_dir=source_dir, cluster=cluster,
        force_delete_repository=settings.driver_repository_force_delete,
        rollout_timeout_seconds=settings.driver_rollout_timeout_seconds,
        # The driver name of this stack's last update (its `driverName` export): a rename is refused at preview.
        previous_driver_name=own_previous_outputs().get_output("driverName"),
    ), opts=pulumi.ResourceOptions(provider=provider))
    efa_driver = _efa_driver(settings, provider)
    # The group controller and class where the nodes hold UltraServer types (docs/ultraserver.md §3).
    ultraserver = (UltraServerGroups("ultraserver", UltraServerGroupsArgs(driver=driver),
                                     opts=pulumi.ResourceOptions(provider=provider))
                   if stack_ultraserver_types(settings) else None)
    efa_ref: EfaDriverRef | None = EXTERNAL if settings.efa_driver == EXTERNAL else efa_driver
    # Templates may name either DeviceClass (whole devices, NeuronCores): both exist first. Each is checked
    # against the node groups' nodes at their LNC.
    claim_templates = ClaimTemplates("claim-templates", ClaimTemplatesArgs(
        templates=cores.templates, instance_types=settings.check_targets, check=check, hardware=settings.hardware,
        driver=driver, efa_driver=efa_ref, scheduling_priced=True,
        efa_targets=None if efa_driver is None or settings.existing_cluster else settings.efa_check_targets,
    ), opts=pulumi.ResourceOptions(provider=provider))
    exports: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "clusterName": cluster.cluster_name if cluster else None,
        "nodeGroupNames": [g.name for g in groups],
        "nodePoolNames": [p.name for p in pools],
        "driverNamespace": driver.namespace,
        "driverName": driver.checked_driver_name,
        "driverImage": driver.image,
        "claimTemplates": claim_templates.names,
        "ultraserverDeviceClass": ultraserver.device_class_name if ultraserver else None,
    }
    return StackResult(settings, cluster, groups, driver, claim_templates, efa_driver, exports, karpenter,
                       pools, ultraserver)


def _efa_driver(settings: StackSettings, provider: k8s.Provider) -> EfaDraDriver | None:
    """AWS's EFA DRA driver on the node groups with EFA interfaces (new cluster), or on the EFA instance types
    of an existing cluster when `efaDriver` is install; None when nothing in the stack has EFA."""
    if settings.efa_driver == EXTERNAL:
        return None
    if settings.existing_cluster:
        if settings.efa_driver != "install":
            return None
        types = [t for t in settings.node_instance_types if settings.hardware.spec(t).efa_count > 0]
        if not types:
            raise SettingError(setting_name("efaDriver"), settings.efa_driver,
                               "auto or external: none of the cluster's instance types (clusterInstanceTypes) has "
                               "EFA interfaces")
        args = EfaDraDriverArgs(instance_types=types, hardware=settings.hardware)
    else:
        # Node groups' nodes carry neuron-dra/node-group, Karpenter pools' neuron-dra/node-pool; a pool gets
        # EFA interfaces when all its types have the same EFA count (nodepool.py).
        groups = [g.name for g in settings.node_groups if g.is_efa]
        pools = [p.name for p in settings.node_pools if p.efa_count]
        if not groups and not pools:
            if settings.efa_driver == "install":
                raise SettingError(setting_name("efaDriver"), settings.efa_driver,
                                   "auto or external: no node group or node pool has EFA interfaces")
            return None
        args = EfaDraDriverArgs(node_groups=groups, node_pools=pools, hardware=settings.hardware)
    return EfaDraDriver("efa-driver", args, opts=pulumi.ResourceOptions(provider=provider))


def _karpenter(cluster: TrainiumCluster, settings: StackSettings) -> tuple[TrainiumKarpenter, list[TrainiumNodePool]]:
    """Karpenter in the cluster and one TrainiumNodePool per `nodePools` entry, after Karpenter's chart (its CRDs)."""
    provider = pulumi.ResourceOptions(provider=cluster.provider)
    karpenter = TrainiumKarpenter("karpenter", TrainiumKarpenterArgs(cluster=cluster), opts=provider)
    return karpenter, [_node_pool(cluster, karpenter, pool, settings) for pool in settings.node_pools]


def _node_pool(cluster: TrainiumCluster, karpenter: TrainiumKarpenter, pool: NodePoolSettings,
               settings: StackSettings) -> TrainiumNodePool:
    return TrainiumNodePool(f"pool-{pool.name}", TrainiumNodePoolArgs.from_settings(
        pool, cluster=cluster, karpenter=karpenter, imds_hop_limit=settings.imds_hop_limit))


def current_config() -> dict[str, str]:
    """Every config value of this run (all namespaces), as the engine passed them (PULUMI_CONFIG and what the
    language host set)."""
    from pulumi.runtime import config as runtime_config

    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def kubeconfig_input(value: str) -> str:
    """A kubeconfig's contents as they are, or a path with `~` expanded (the provider takes either)."""
    return os.path.expanduser(value) if "\n" not in value and value.startswith("~") else value


def settings_from_pulumi_config(project: str | None = None) -> StackSettings:
    """Decode this project's config; keys of other namespaces (aws:region, ...) are ignored."""
    project = project or pulumi.get_project()
    raw = {f"{PROJECT}:{key.split(':', 1)[1]}": value for key, value in current_config().items()
           if key.split(":", 1)[0] == project}
    return decode_settings(raw)


def run_program() -> StackResult:
    """The body of `__main__.py`."""
    settings = settings_from_pulumi_config()
    result = build_stack(settings, stack=pulumi.get_stack())
    for key, value in result.exports.items():
        pulumi.export(key, value)
    return result
