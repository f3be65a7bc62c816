"""neuron-monitor's exporter beside the driver (driver/deploy/exporter.py) and the dashboard's sources: every panel
reads series that the driver or that exporter really emits (docs/utilisation.md)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from neuron_dra.driver import deploy
from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.deploy import DriverDeployOptions, exporter
from neuron_dra.driver.deploy.dashboard import PANELS
from neuron_dra.driver.model.catalog import CATALOG
from neuron_dra.driver.model.partitions import CoreLayout
from tests.support import kubeschema

# The names as the CloudWatch agent's Neuron scraper has them (opentelemetry-collector-contrib
# receiver/awscontainerinsightreceiver/internal/neuron/metric_name.go) and the labels of its exposition sample
# (neuron_monitor_scraper_test.go), typed here, not read from the module under test.
DOCUMENTED = {
    "neuroncore_utilization_ratio", "neuroncore_memory_usage_constants", "neuroncore_memory_usage_model_code",
    "neuroncore_memory_usage_model_shared_scratchpad", "neuroncore_memory_usage_runtime_memory",
    "neuroncore_memory_usage_tensors", "neuron_runtime_memory_used_bytes", "execution_latency_seconds",
}
DOCUMENTED_INSTANCE_LABELS = {"availability_zone", "instance_id", "instance_name", "instance_type", "region",
                              "subnet_id"}


def by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs}


def test_the_exporters_names_and_labels_are_the_documented_ones() -> None:
    assert set(exporter.METRICS) == DOCUMENTED
    assert set(exporter.INSTANCE_LABELS) == DOCUMENTED_INSTANCE_LABELS
    assert exporter.METRICS["neuroncore_utilization_ratio"] == ("neuroncore", "runtime_tag")
    assert exporter.METRICS["neuron_runtime_memory_used_bytes"] == ("memory_location", "runtime_tag")
    assert exporter.MEMORY_LOCATIONS == ("host", "neuron_device")


def test_the_exporter_runs_awss_image_with_no_api_access() -> None:
    objs = by_kind(exporter.manifests(exporter.spec_for(DriverDeployOptions())))
    # no RBAC, no PodMonitor by default
    assert set(objs) == {"ServiceAccount", "NetworkPolicy", "ResourceClaimTemplate", "DaemonSet"}
    assert objs["ServiceAccount"]["automountServiceAccountToken"] is False
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "neuron-monitor"
    (container,) = pod["containers"]
    image = container["image"]
    assert image.startswith("public.ecr.aws/neuron/neuron-monitor") and ("@sha256:" in image or re.search(
        r":\d+\.\d+\.\d+$", image)), image  # pinned, never a moving tag
    assert container["ports"] == [{"name": "metrics", "containerPort": 8000, "protocol": "TCP"}]
    assert container["args"] == ["--port", "8000"]
    # The Neuron nodes only, as the driver's DaemonSet, with the Neuron taint tolerated.
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == list(DriverDeployOptions().node_instance_types)
    assert {t["key"] for t in pod["tolerations"]} == {"aws.amazon.com/neuron"}
    selector = objs["DaemonSet"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= objs["DaemonSet"]["spec"]["template"]["metadata"]["labels"].items()
    assert not selector.items() <= {"app.kubernetes.io/name": "neuron-dra-driver"}.items()


@pytest.mark.parametrize("minor", ["1.34", "1.35", "1.36"])
def test_the_exporter_gets_every_device_through_an_admin_access_claim_not_privilege(minor: str) -> None:
    options = DriverDeployOptions(kubernetes_version=minor, driver_name="neuron.example.com")
    assert options.neuron_monitor and options.runs_neuron_monitor  # on by default where no cores are published
    every = deploy.manifests(options)
    objs = by_kind(exporter.manifests(exporter.spec_for(options)))
    for manifest in objs.values():
        kubeschema.validate(manifest, minor, strict=True)
    (request,) = objs["ResourceClaimTemplate"]["spec"]["spec"]["devices"]["requests"]
    assert options.device_class == "neuron.example.com"  # the driver's whole-device class
    assert request == {"name": "neuron", "exactly": {"deviceClassName": options.device_class,
                                                     "allocationMode": "All", "adminAccess": True}}
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "neuron",
                                      "resourceClaimTemplateName": objs["ResourceClaimTemplate"]["metadata"]["name"]}]
    (container,) = pod["containers"]
    assert container["resources"]["claims"] == [{"name": "neuron"}]
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and "volumes" not in pod
    # The API server serves admin access in a labelled namespace only: the driver's, where the exporter is.
    (namespace,) = [m for m in every if m["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"][exporter.ADMIN_ACCESS_LABEL] == "true"
    assert {m["metadata"].get("namespace") for m in objs.values()} == {namespace["metadata"]["name"]}
    assert [m for m in every if m["kind"] == "ResourceClaimTemplate"] == [objs["ResourceClaimTemplate"]]


@pytest.mark.parametrize("options", [
    DriverDeployOptions(kubernetes_version="1.36", neuron_monitor=False),  # opted out
    DriverDeployOptions(kubernetes_version="1.36", core_partitions="on"),  # NeuronCores: counters
    DriverDeployOptions(),  # the newest minor: NeuronCores by default
], ids=["opted-out", "cores-on", "newest"])
def test_the_exporter_and_the_admin_label_are_left_out_when_off_or_where_cores_are_published(
        options: DriverDeployOptions) -> None:
    every = deploy.manifests(options)
    assert not options.runs_neuron_monitor
    assert not [m for m in every if m["metadata"]["name"] == "neuron-monitor"]
    (namespace,) = [m for m in every if m["kind"] == "Namespace"]
    assert exporter.ADMIN_ACCESS_LABEL not in namespace["metadata"]["labels"]


def test_the_network_policy_admits_scrapers_in_and_instance_metadata_out_only() -> None:
    options = DriverDeployOptions(metrics_scrape_namespaces=("prom",),
                                  metrics_scrape_pod_labels={"app.kubernetes.io/name": "prometheus"})
    policy = by_kind(exporter.manifests(exporter.spec_for(options)))["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == exporter.POD_SELECTOR
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    (out,) = policy["egress"]
    assert out == {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}], "ports": [{"protocol": "TCP", "port": 80}]}
    none = by_kind(exporter.manifests(exporter.spec_for(DriverDeployOptions(metrics_scrape_namespaces=()))))
    assert none["NetworkPolicy"]["spec"]["ingress"] == []


def test_the_pod_monitor_labels_the_node_for_the_join() -> None:
    options = DriverDeployOptions(metrics_port=9400, pod_monitor=True, pod_monitor_labels={"release": "kps"})
    monitor = by_kind(exporter.manifests(exporter.spec_for(options)))["PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == exporter.POD_SELECTOR
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["relabelings"] == [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                        "targetLabel": "node"}]


def driver_series() -> set[str]:
    """Every series name the driver's /metrics carries (its registry with the attribution collector)."""
    metrics = Metrics()
    metrics.attribute(dict, "n1", [0, 1], CoreLayout.for_spec(CATALOG["trn2.48xlarge"], 1))
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def test_every_panel_reads_series_the_deployed_stack_emits() -> None:
    emitted = driver_series() | set(exporter.METRICS)
    for panel in PANELS:
        assert panel.reads, panel.title
        assert set(panel.reads) <= emitted, (panel.title, set(panel.reads) - emitted)
        text = " ".join(panel.exprs)
        regexes = re.findall(r'__name__=~"([^"]+)"', text)
        for name in panel.reads:
            assert name in text or any(re.fullmatch(r, name) for r in regexes), (panel.title, name)
    monitor = [p.title for p in PANELS if p.needs_neuron_monitor]
    assert monitor == ["NeuronCore utilisation per pod (neuron-monitor)",
                       "NeuronCore utilisation per claim (neuron-monitor)",
                       "Neuron device memory per pod (neuron-monitor)"]


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_documented_names_are_what_the_doc_lists(name: str) -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "utilisation.md").read_text()
    assert f"`{name}`" in doc
