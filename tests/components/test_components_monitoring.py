"""The stack's monitoring settings (components/settings.py): what they make of the driver's deployment options,
and the errors that name them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from neuron_dra.components.settings import SettingError
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.stack import driver_options


def test_defaults_change_nothing_without_a_metrics_port() -> None:
    options = driver_options(decode_settings({}))
    assert options.metrics_port == 0
    assert not options.pod_monitor and not options.grafana_dashboard


def test_settings_reach_the_deployment_options() -> None:
    options = driver_options(decode_settings({
        "neuron-dra:driverMetricsPort": "9400",
        "neuron-dra:metricsScrapeNamespaces": '["obs"]',
        "neuron-dra:metricsScrapePodLabels": '["app.kubernetes.io/name=prometheus"]',
        "neuron-dra:podMonitor": "true",
        "neuron-dra:podMonitorLabels": '["release=kps"]',
        "neuron-dra:grafanaDashboardLabel": "dash=on",
        "neuron-dra:grafanaDashboardNamespace": "grafana",
    }))
    assert options.metrics_scrape_namespaces == ("obs",)
    assert options.metrics_scrape_pod_labels == {"app.kubernetes.io/name": "prometheus"}
    assert options.pod_monitor and options.pod_monitor_labels == {"release": "kps"}
    assert options.grafana_dashboard  # on by default once there are metrics
    assert (options.grafana_dashboard_label, options.grafana_dashboard_namespace) == ("dash=on", "grafana")


def test_pod_monitor_auto_is_off_on_a_new_cluster_and_false_is_off() -> None:
    for mode in ("auto", "false"):
        options = driver_options(decode_settings({"driverMetricsPort": "9400", "podMonitor": mode}))
        assert not options.pod_monitor
    assert not driver_options(decode_settings({"driverMetricsPort": "9400", "grafanaDashboard": "false"})
                              ).grafana_dashboard


@pytest.mark.parametrize(("raw", "key", "allowed"), [
    ({"podMonitor": "maybe"}, "podMonitor", "auto, true, false"),
    ({"podMonitor": "true"}, "podMonitor", "false while metrics_port is 0"),
    ({"metricsScrapePodLabels": '["noequals"]'}, "metricsScrapePodLabels", "KEY=VALUE"),
    ({"podMonitorLabels": '["a=b c"]', "driverMetricsPort": "9400"}, "podMonitorLabels", "VALUE a label value"),
    ({"grafanaDashboardLabel": "x"}, "grafanaDashboardLabel", "KEY=VALUE"),
    ({"metricsScrapeNamespaces": '["Not_A_Namespace"]'}, "metricsScrapeNamespaces", "a DNS label"),
])
def test_bad_settings_name_the_setting(raw: dict[str, str], key: str, allowed: str) -> None:
    with pytest.raises(SettingError) as e:
        decode_settings(raw)
    assert f"neuron-dra:{key}" in str(e.value)
    assert allowed in str(e.value)


def test_the_example_stack_plans_the_metrics_service_and_the_dashboard() -> None:
    from pathlib import Path

    from neuron_dra.components import plan
    from neuron_dra.driver.deploy.dashboard import DASHBOARD_UID, dashboard_json

    root = Path(__file__).resolve().parents[2]
    run = plan.plan(plan.load_config_file(root / "Pulumi.example.yaml"))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for m in plan.kubernetes_manifests(run):
        by_kind.setdefault(str(m["kind"]), []).append(m)
    (service,) = by_kind["Service"]
    dashboards = [m for m in by_kind["ConfigMap"] if str(m["metadata"]["name"]).endswith("-dashboard")]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"][f"{DASHBOARD_UID}.json"]) == dashboard_json()
    assert "PodMonitor" not in by_kind  # auto on a new cluster: none
    (policy,) = [m for m in by_kind["NetworkPolicy"] if m["metadata"]["namespace"] == service["metadata"]["namespace"]]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
