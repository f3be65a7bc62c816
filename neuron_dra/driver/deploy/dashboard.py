"""The driver's Grafana dashboard, built with the Grafana Foundation SDK (docs/metrics.md): who holds which
Neuron devices and cores, capacity, claims, prepare latency, health and taints, and NeuronCore utilisation and
device memory per pod and per claim.

`PANELS` is the one list of panels; `dashboard_json()` renders it. Every query reads series that something the
stack deploys emits: the driver's (its metrics port) or neuron-monitor's exporter (deploy/exporter.py,
docs/utilisation.md), each with the `node` label the scrape configuration gives every target (deploy's
PodMonitors, the local cluster's Prometheus). `PanelSpec.reads` names them; tests check both sides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from neuron_dra.driver.deploy import exporter

DASHBOARD_UID = "neuron-dra-attribution"
DATASOURCE_VARIABLE = "datasource"
NEURON_MONITOR_METRIC = exporter.UTILISATION  # neuron-monitor-prometheus.py's per-core gauge

PanelKind = Literal["timeseries", "table", "stat"]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: PanelKind
    queries: tuple[Query, ...]
    description: str
    reads: tuple[str, ...]  # the metric names its queries read (driver's, or exporter.METRICS)
    unit: str = ""

    @property
    def needs_neuron_monitor(self) -> bool:
        """Returns data only where neuron-monitor's exporter (deploy/exporter.py) is scraped too."""
        return any(name in exporter.METRICS for name in self.reads)

    @property
    def exprs(self) -> tuple[str, ...]:
        return tuple(q.expr for q in self.queries)


# The join of neuron-monitor's per-core utilisation with the driver's per-core attribution: neuron-monitor may
# report a core once per runtime process, so its side is summed per (node, neuroncore) first; the driver's side
# has one series per pod of the claim, and keeps its labels (group_left).
_PER_CORE = "neuron_dra_claim_neuroncore_info * on (node, neuroncore) group_left () sum by (node, neuroncore) ({})"
UTILISATION_PER_POD = f"avg by (namespace, pod) ({_PER_CORE.format(NEURON_MONITOR_METRIC)})"
# Per claim: a claim shared by several pods has one core series per pod; `max by` keeps one per core first.
UTILISATION_PER_CLAIM = (
    "avg by (namespace, claim) (max by (namespace, claim, node, neuroncore) (neuron_dra_claim_neuroncore_info) "
    f"* on (node, neuroncore) group_left () sum by (node, neuroncore) ({NEURON_MONITOR_METRIC}))")
# Device memory the runtimes hold on a pod's cores: every neuroncore_memory_usage_* kind, summed.
CORE_MEMORY_SELECTOR = '{__name__=~"neuroncore_memory_usage_.+"}'
MEMORY_PER_POD = f"sum by (namespace, pod) ({_PER_CORE.format(CORE_MEMORY_SELECTOR)})"

PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Devices per namespace and node", "timeseries", (Query(
        "count by (namespace, node) (group by (namespace, node, claim, device) (neuron_dra_claim_device_info))",
        "{{namespace}} on {{node}}"),),
        "Devices (whole Neuron devices and NeuronCore devices) prepared for claims, per namespace and node.",
        ("neuron_dra_claim_device_info",)),
    PanelSpec("Neuron devices allocated and free", "timeseries", (Query(
        "sum by (node, state) (neuron_dra_node_devices)", "{{node}} {{state}}"),),
        "Whole Neuron devices per node: allocated (any of its cores prepared for a claim) or free.",
        ("neuron_dra_node_devices",)),
    PanelSpec("NeuronCores allocated and free", "timeseries", (Query(
        "sum by (node, state) (neuron_dra_node_neuroncores)", "{{node}} {{state}}"),),
        "NeuronCores (at the node's LNC) per node: allocated or free.", ("neuron_dra_node_neuroncores",)),
    PanelSpec("Claims prepared and pending", "timeseries", (Query(
        "sum by (state) (neuron_dra_claims)", "{{state}}"),),
        "Claims in the drivers' checkpoints: prepared, or pending (a prepare started and not completed).",
        ("neuron_dra_claims",)),
    PanelSpec("Pods per device with their NeuronCores", "table", (Query(
        "max by (node, device, neuroncores, namespace, pod, claim, request) (neuron_dra_claim_device_info)"),),
        "Which pod holds which device on which node, with the NeuronCore ids (NEURON_RT_VISIBLE_CORES) it sees.",
        ("neuron_dra_claim_device_info",)),
    PanelSpec("Prepare and unprepare latency (p99)", "timeseries", (
        Query("histogram_quantile(0.99, sum by (le, node) (rate(neuron_dra_prepare_seconds_bucket"
              "[$__rate_interval])))", "prepare {{node}}"),
        Query("histogram_quantile(0.99, sum by (le, node) (rate(neuron_dra_unprepare_seconds_bucket"
              "[$__rate_interval])))", "unprepare {{node}}")),
        "99th percentile of NodePrepareResources / NodeUnprepareResources per claim (the claim GET included).",
        ("neuron_dra_prepare_seconds_bucket", "neuron_dra_unprepare_seconds_bucket"), unit="s"),
    PanelSpec("Device health", "table", (Query("min by (node, device) (neuron_dra_device_health)"),),
        "Per Neuron device index: 1 healthy, 0 unhealthy (hardware error counters), -1 unknown.",
        ("neuron_dra_device_health",)),
    PanelSpec("Tainted devices", "table", (Query("max by (node, device) (neuron_dra_device_tainted)"),),
        "1 where the device carries the driver's unhealthy taint in its ResourceSlice.",
        ("neuron_dra_device_tainted",)),
    PanelSpec("NeuronCore utilisation per pod (neuron-monitor)", "timeseries", (Query(
        UTILISATION_PER_POD, "{{namespace}}/{{pod}}"),),
        "neuron-monitor's neuroncore_utilization_ratio averaged over each pod's NeuronCores (the exporter the "
        "stack deploys beside the driver: docs/utilisation.md).",
        ("neuron_dra_claim_neuroncore_info", NEURON_MONITOR_METRIC), unit="percentunit"),
    PanelSpec("NeuronCore utilisation per claim (neuron-monitor)", "timeseries", (Query(
        UTILISATION_PER_CLAIM, "{{namespace}}/{{claim}}"),),
        "neuron-monitor's neuroncore_utilization_ratio averaged over each claim's NeuronCores, however many pods "
        "share the claim.", ("neuron_dra_claim_neuroncore_info", NEURON_MONITOR_METRIC), unit="percentunit"),
    PanelSpec("Neuron device memory per pod (neuron-monitor)", "timeseries", (Query(
        MEMORY_PER_POD, "{{namespace}}/{{pod}}"),),
        "Device memory the Neuron runtimes hold on each pod's NeuronCores (neuron-monitor's "
        "neuroncore_memory_usage_*: constants, model code, scratchpad, runtime, tensors), summed.",
        ("neuron_dra_claim_neuroncore_info", *exporter.CORE_MEMORY), unit="bytes"),
)


def dashboard_json(title: str = "Neuron DRA: devices per pod") -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (what a ConfigMap for the Grafana sidecar holds)."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    source = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
    builder = (dashboard.Dashboard(title).uid(DASHBOARD_UID).tags(["neuron", "dra"]).refresh("30s")
               .time("now-1h", "now")
               .with_variable(dashboard.DatasourceVariable(DATASOURCE_VARIABLE).label("Prometheus")
                              .type("prometheus")))
    for spec in PANELS:
        panel: timeseries.Panel | table.Panel | stat.Panel = (
            table.Panel() if spec.kind == "table" else stat.Panel() if spec.kind == "stat" else timeseries.Panel())
        panel = panel.title(spec.title).description(spec.description).datasource(source).span(
            24 if spec.kind == "table" else 12).height(8)
        if spec.unit:
            panel = panel.unit(spec.unit)
        for i, q in enumerate(spec.queries):
            target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(source)
            if spec.kind == "table":
                target = target.instant().format(PromQueryFormat.TABLE)
            elif q.legend:
                target = target.legend_format(q.legend)
            panel = panel.with_target(target)
        builder = builder.with_panel(panel)
    document: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return document


def dashboard_text() -> str:
    return json.dumps(dashboard_json(), indent=2, sort_keys=True) + "\n"


def panel_exprs(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query in a dashboard JSON document."""
    out = []
    for panel in document.get("panels", []):
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out
