"""Discovery of the drivers' metrics in the deployment objects: the Service, the PodMonitor, the NetworkPolicy's
scraper rule and the dashboard's ConfigMap (driver/deploy/monitoring.py, __init__.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions
from neuron_dra.driver.deploy.dashboard import DASHBOARD_UID, PANELS, dashboard_json, panel_exprs
from tests.support import kubeschema


def kinds(options: DriverDeployOptions) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in deploy.manifests(options) if m["kind"] != "DeviceClass"}


def test_no_metrics_port_no_service_no_pod_monitor() -> None:
    objs = kinds(DriverDeployOptions())
    assert "Service" not in objs and "PodMonitor" not in objs and "ConfigMap" not in objs


def test_the_service_and_pod_monitor_select_the_driver_pods_metrics_port() -> None:
    options = DriverDeployOptions(metrics_port=9400, pod_monitor=True, pod_monitor_labels={"release": "kps"})
    objs = kinds(options)
    pods = objs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    port = next(p for p in objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["ports"]
                if p["name"] == "metrics")
    service = objs["Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pods.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}]
    monitor = objs["PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [options.namespace]}
    endpoint, = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == port["name"] and endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                        "targetLabel": "node"}]
    for m in (service, objs["NetworkPolicy"]):
        kubeschema.validate(m, "1.34", strict=True)


def test_metrics_service_can_be_left_out() -> None:
    assert "Service" not in kinds(DriverDeployOptions(metrics_port=9400, metrics_service=False))


def test_network_policy_admits_the_scrapers_pods_only() -> None:
    options = DriverDeployOptions(metrics_port=9400, metrics_scrape_namespaces=("monitoring", "obs"),
                                  metrics_scrape_pod_labels={"app.kubernetes.io/name": "prometheus"})
    rule, = kinds(options)["NetworkPolicy"]["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}} for ns in ("monitoring", "obs")]
    # Without pod labels: every pod of the namespaces, as before.
    rule, = kinds(DriverDeployOptions(metrics_port=9400))["NetworkPolicy"]["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    ({"pod_monitor": True}, "pod_monitor", "false while metrics_port is 0"),
    ({"pod_monitor": "yes", "metrics_port": 9400}, "pod_monitor", "true or false"),
    ({"metrics_scrape_pod_labels": {"app": "no spaces"}}, "metrics_scrape_pod_labels", "VALUE a label value"),
    ({"pod_monitor_labels": {"-bad": "x"}}, "pod_monitor_labels", "KEY a label key"),
    ({"grafana_dashboard_label": "grafana_dashboard"}, "grafana_dashboard_label", "KEY=VALUE"),
    ({"grafana_dashboard_namespace": "Grafana"}, "grafana_dashboard_namespace", "a DNS label"),
])
def test_bad_monitoring_options_name_the_field(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(DeployOptionError) as e:
        DriverDeployOptions(**kwargs)
    assert e.value.option == field
    assert allowed in str(e.value)


def test_dashboard_config_map_for_the_grafana_sidecar() -> None:
    objs = kinds(DriverDeployOptions(grafana_dashboard=True, grafana_dashboard_label="dash=yes",
                                     grafana_dashboard_namespace="grafana"))
    cm = objs["ConfigMap"]
    kubeschema.validate(cm, "1.34", strict=True)
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dash"] == "yes"
    document = json.loads(cm["data"][f"{DASHBOARD_UID}.json"])
    assert document == dashboard_json()
    # The ConfigMap is applied after the namespace and before the DaemonSet, like every other object.
    order = [m["kind"] for m in deploy.manifests(DriverDeployOptions(grafana_dashboard=True))]
    assert order.index("ConfigMap") < order.index("DaemonSet")


def test_the_dashboard_has_every_panel_with_its_queries() -> None:
    document = dashboard_json()
    assert document["uid"] == DASHBOARD_UID
    assert [p["title"] for p in document["panels"]] == [p.title for p in PANELS]
    assert [e for _, e in panel_exprs(document)] == [e for p in PANELS for e in p.exprs]
    for panel in document["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        if panel["type"] == "table":
            assert all(t["instant"] and t["format"] == "table" for t in panel["targets"])
    variable, = document["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"


def test_the_dashboard_command_prints_the_json_or_the_config_map(capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_dra.cli import main

    assert main(["dashboard"]) == 0
    assert json.loads(capsys.readouterr().out) == dashboard_json()
    assert main(["dashboard", "--config-map", "--namespace", "grafana"]) == 0
    cm = json.loads(capsys.readouterr().out)
    assert (cm["kind"], cm["metadata"]["namespace"], cm["metadata"]["labels"]["grafana_dashboard"]) == (
        "ConfigMap", "grafana", "1")
    assert main(["dashboard", "--config-map", "--label", "no-equals"]) == 2
    err = capsys.readouterr().err
    assert "grafana_dashboard_label" in err and "'no-equals'" in err and "KEY=VALUE" in err
