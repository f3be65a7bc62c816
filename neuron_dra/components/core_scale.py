"""NeuronCores on Kubernetes 1.36: when the stack publishes them, and what kube-scheduler then pays per claim pod.

The 1.36 scheduler reads every node's counter slices on each node it filters (kubernetes#138917, fixed in 1.37),
so with NeuronCores published a claim pod's scheduler CPU grows with nodes squared (docs/scale.md §2). On 1.36
the stack publishes them (`corePartitions` auto) only when something asks: a claim template requesting the
NeuronCore DeviceClass, or `coreExtendedResourceName` naming a resource. Whenever it does on 1.36, the predicted
scheduler CPU per claim pod at the node groups' and pools' maximum size (the `claims check --nodes` model,
claim_templates/scale.py) is a preview warning, and past the scheduler's 10 s DRA filter limit a refusal unless
`allowSlowClaimScheduling` is true.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from neuron_dra.claim_templates import ClaimTemplate, Drivers, NeuronCores
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.node_types import NodeType
from neuron_dra.claim_templates.scale import DRA_FILTER_TIMEOUT_MS, ScaleEstimate, estimate
from neuron_dra.components.efa_driver import class_requests
from neuron_dra.components.settings import SettingError, StackSettings, key_of, setting_name
from neuron_dra.components.template_like import ClaimTemplateLike, template_key
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.catalog import Catalog

# What an extended-resource pod's claim looks like when no template says more: one NeuronCore.
ONE_CORE = ClaimTemplate("one-neuroncore", NeuronCores(1))


@dataclass(frozen=True)
class CoreChoice:
    """The driver options with corePartitions decided, who asked for NeuronCores (empty: nobody), and the
    templates as the driver's names render them (what ClaimTemplates deploys: rendered once)."""

    options: DriverDeployOptions
    asked_by: tuple[str, ...] = ()
    templates: tuple[ClaimTemplateLike, ...] = ()


def choose(settings: StackSettings, options: DriverDeployOptions, templates: Sequence[ClaimTemplateLike]
           ) -> CoreChoice:
    """corePartitions auto decided for the stack: where the minor publishes NeuronCores by default (1.37+) or
    serves none (before 1.36) the rule in `deploy` stands; on 1.36 on when asked for, else off. Templates that
    follow their driver are read with this driver's names (a custom driverName renames the NeuronCore class)."""
    core_class = options.core_device_class_name
    drivers = Drivers.of(options.class_names)
    named = tuple(t.for_drivers(drivers) if isinstance(t, ClaimTemplate) else t for t in templates)
    asked = [f"claim template {template_key(t)}" for t in named if class_requests(t.to_manifest(), core_class)]
    if settings.asks_for_core_extended_resource:
        asked.append(f"{setting_name(key_of('core_extended_resource_name'))} {settings.core_extended_resource_name}")
    if options.core_partitions == "off" and asked:
        raise SettingError(setting_name(key_of("core_partitions")), "off",
                           f"on or auto: {asked[0]} asks for NeuronCores, which the driver publishes only then "
                           "(with off there is no NeuronCore DeviceClass and such pods never schedule)")
    if options.core_partitions != "auto" or not options.serves("core_device_class") or \
            options.serves("core_partitions_by_default"):
        return CoreChoice(options, tuple(asked) if options.publishes_cores else (), named)
    return CoreChoice(options.replace(core_partitions="on" if asked else "off"), tuple(asked), named)


def predict(templates: Sequence[ClaimTemplateLike], nodes: int, targets: Sequence[str], hardware: Catalog
            ) -> ScaleEstimate:
    """The costliest claim pod among `templates` (ClaimTemplates; else one NeuronCore) on any of the targets'
    instance types, in a cluster of `nodes` nodes that all publish counters to a 1.36 scheduler."""
    catalog = NodeCatalog(hardware=hardware, partitionable=True)
    typed = [t for t in templates if isinstance(t, ClaimTemplate)] or [ONE_CORE]
    types = list(dict.fromkeys(NodeType.of(t).instance_type for t in targets))
    return max((estimate(t, nodes, instance_type, catalog, shared_counters=True)
                for t in typed for instance_type in types), key=lambda e: e.cpu_ms_per_pod)


def check(settings: StackSettings, choice: CoreChoice, templates: Sequence[ClaimTemplateLike],
          warn: Callable[[str], None]) -> None:
    """The default stack's NeuronCores on 1.36, priced at its maximum size (`assess`)."""
    why = ", ".join(choice.asked_by) or f"{setting_name(key_of('core_partitions'))} on"
    assess(choice.options, why, settings.max_nodes, templates, settings.check_targets, settings.hardware,
           allowed=settings.allow_slow_claim_scheduling is True,
           override=(setting_name(key_of("allow_slow_claim_scheduling")), settings.allow_slow_claim_scheduling),
           instead=f"{setting_name(key_of('core_partitions'))} off", warn=warn)


def assess(options: DriverDeployOptions, why: str, nodes: int | None, templates: Sequence[ClaimTemplateLike],
           targets: Sequence[str], hardware: Catalog, *, allowed: bool, override: tuple[str, object], instead: str,
           warn: Callable[[str], None]) -> None:
    """Where NeuronCores are published to a scheduler without the counter fix: warn with the predicted scheduler
    CPU per claim pod at `nodes` (None: unknown), refuse above the DRA filter limit unless `allowed` (the
    refusal names `override`, the setting and its value, and `instead`, the setting that turns cores off)."""
    if not options.publishes_cores or options.serves("core_partitions_by_default"):
        return
    head = (f"NeuronCores on Kubernetes {options.kubernetes_version or 'of this minor'} (for {why}): its scheduler "
            "reads every node's counter slices on each node (kubernetes#138917, fixed in 1.37), so a claim pod's "
            "scheduling cost grows with nodes squared (docs/scale.md §2)")
    if nodes is None or not targets:
        warn(f"{head}; `neuron-dra claims check --nodes N` predicts it at this cluster's size")
        return
    worst = predict(templates, max(nodes, 1), targets, hardware)
    cpu = worst.cpu_ms_per_pod
    spent = f"{cpu / 1e3:.1f} s" if cpu >= 1e3 else f"{cpu:.0f} ms"
    figure = (f"about {spent} of scheduler CPU per claim pod at {nodes} node{'s' * (nodes != 1)} (the node groups' "
              f"and pools' maximum; {worst.template} on {worst.instance_type})")
    if cpu > DRA_FILTER_TIMEOUT_MS and not allowed:
        raise SettingError(
            override[0], override[1],
            f"true to deploy anyway: {head}; {figure}, past the scheduler's {DRA_FILTER_TIMEOUT_MS / 1e3:.0f} s DRA "
            f"filter limit, so claims would stop scheduling. Or: Kubernetes 1.37, {instead} (whole devices only), "
            "or smaller maximum sizes")
    warn(f"{head}; {figure}")
