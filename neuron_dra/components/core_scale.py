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
from dataclasses import dataclass, replace

from neuron_dra.claim_templates import ClaimTemplate, NeuronCores
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.node_types import NodeType
from neuron_dra.claim_templates.scale import DRA_FILTER_TIMEOUT_MS, ScaleEstimate, estimate
from neuron_dra.components.claims import ClaimTemplateLike, template_key
from neuron_dra.components.efa_driver import class_requests
from neuron_dra.components.settings import SettingError, StackSettings, key_of, setting_name
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.catalog import Catalog

# What an extended-resource pod's claim looks like when no template says more: one NeuronCore.
ONE_CORE = ClaimTemplate("one-neuroncore", NeuronCores(1))


@dataclass(frozen=True)
class CoreChoice:
    """The driver options with corePartitions decided, and who asked for NeuronCores (empty: nobody)."""

    options: DriverDeployOptions
    asked_by: tuple[str, ...] = ()


def choose(settings: StackSettings, options: DriverDeployOptions, templates: Sequence[ClaimTemplateLike]
           ) -> CoreChoice:
    """corePartitions auto decided for the stack: where the minor publishes NeuronCores by default (1.37+) or
    serves none (before 1.36) the rule in `deploy` stands; on 1.36 on when asked for, else off."""
    core_class = options.core_device_class_name
    asked = [f"claim template {template_key(t)}" for t in templates if class_requests(t.to_manifest(), core_class)]
    if settings.asks_for_core_extended_resource:
        asked.append(f"{setting_name(key_of('core_extended_resource_name'))} {settings.core_extended_resource_name}")
    if options.core_partitions == "off" and asked:
        raise SettingError(setting_name(key_of("core_partitions")), "off",
                           f"on or auto: {asked[0]} asks for NeuronCores, which the driver publishes only then "
                           "(with off there is no NeuronCore DeviceClass and such pods never schedule)")
    if options.core_partitions != "auto" or not options.serves("core_device_class") or \
            options.serves("core_partitions_by_default"):
        return CoreChoice(options, tuple(asked) if options.publishes_cores else ())
    return CoreChoice(replace(options, core_partitions="on" if asked else "off"), tuple(asked))


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
    """On 1.36 with NeuronCores published: warn with the predicted scheduler time per claim pod at the stack's
    maximum size; refuse above the DRA filter limit unless allowSlowClaimScheduling."""
    options = choice.options
    if not options.publishes_cores or options.serves("core_partitions_by_default"):
        return
    why = ", ".join(choice.asked_by) or f"{setting_name(key_of('core_partitions'))} on"
    head = (f"NeuronCores on Kubernetes {options.kubernetes_version} (for {why}): its scheduler reads every node's "
            "counter slices on each node (kubernetes#138917, fixed in 1.37), so a claim pod's scheduling cost grows "
            "with nodes squared (docs/scale.md §2)")
    nodes = settings.max_nodes
    if nodes is None:
        warn(f"{head}; `neuron-dra claims check --nodes N` predicts it at this cluster's size")
        return
    worst = predict(templates, max(nodes, 1), settings.check_targets, settings.hardware)
    cpu = worst.cpu_ms_per_pod
    spent = f"{cpu / 1e3:.1f} s" if cpu >= 1e3 else f"{cpu:.0f} ms"
    figure = (f"about {spent} of scheduler CPU per claim pod at {nodes} node{'s' * (nodes != 1)} (the node groups' "
              f"and pools' maximum; {worst.template} on {worst.instance_type})")
    if worst.cpu_ms_per_pod > DRA_FILTER_TIMEOUT_MS and settings.allow_slow_claim_scheduling is not True:
        raise SettingError(
            setting_name(key_of("allow_slow_claim_scheduling")), settings.allow_slow_claim_scheduling,
            f"true to deploy anyway: {head}; {figure}, past the scheduler's {DRA_FILTER_TIMEOUT_MS / 1e3:.0f} s DRA "
            f"filter limit, so claims would stop scheduling. Or: Kubernetes 1.37, "
            f"{setting_name(key_of('core_partitions'))} off (whole devices only), or smaller maxSize/maxNodes")
    warn(f"{head}; {figure}")
