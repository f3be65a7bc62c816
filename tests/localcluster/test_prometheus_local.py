"""The local cluster's Prometheus (localcluster/controlplane/prometheus.py, prometheus_build.py) without a cluster:
the binary built from the Go module proxy, its configuration, targets labelled with their node (honouring a `node` the
series carry), and the file-SD hook for neuron-monitor exporters."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from neuron_dra.localcluster.controlplane import prometheus, prometheus_build
from neuron_dra.localcluster.nodes.kubelet import PortAllocator
from tests.support.e2e import eventually


def test_the_release_of_the_pinned_module() -> None:
    assert prometheus_build.prometheus_module_version() == "v0.316.0"
    assert prometheus_build.prometheus_version() == "3.16.0"


def test_config_labels_every_target_with_its_node_and_watches_the_extra_targets(tmp_path: Path) -> None:
    conf = prometheus.config([prometheus.ScrapeTarget("n1", "127.0.0.1:1"), prometheus.ScrapeTarget("n2", "x:2")],
                             tmp_path / "extra.json")
    drivers, monitor = conf["scrape_configs"]
    assert drivers["honor_labels"] is True
    assert drivers["static_configs"] == [{"targets": ["127.0.0.1:1"], "labels": {"node": "n1"}},
                                         {"targets": ["x:2"], "labels": {"node": "n2"}}]
    assert monitor["file_sd_configs"][0]["files"] == [str(tmp_path / "extra.json")]
    assert monitor["static_configs"] == []
    # The nodes' neuron-monitor exporters (the local cluster's stand-ins) under job neuron-monitor, by node.
    conf = prometheus.config([], tmp_path / "extra.json", exporters=[prometheus.ScrapeTarget("n1", "127.0.0.1:7")])
    assert conf["scrape_configs"][1]["job_name"] == "neuron-monitor"
    assert conf["scrape_configs"][1]["static_configs"] == [{"targets": ["127.0.0.1:7"], "labels": {"node": "n1"}}]


def serve(*series: tuple[str, dict[str, str]]) -> tuple[int, object]:
    registry = CollectorRegistry()
    for name, labels in series:
        Gauge(name, name, list(labels), registry=registry).labels(**labels).set(1)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    return server.server_port, server


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[tuple[prometheus.LocalPrometheus, int]]:
    port, server = serve(("neuron_dra_node_devices", {"state": "free"}),
                         ("neuron_dra_claim_device_info", {"node": "n1", "pod": "p"}))
    p = prometheus.LocalPrometheus(tmp_path / "prometheus", prometheus_build.build_prometheus(),
                                   PortAllocator().take())
    p.start([prometheus.ScrapeTarget("n1", f"127.0.0.1:{port}")], lifetime_s=300)
    try:
        yield p, port
    finally:
        p.stop()
        server.shutdown()  # type: ignore[attr-defined]


@pytest.mark.gobuild
@pytest.mark.process
def test_the_built_binary_reports_its_release() -> None:
    out = subprocess.run([str(prometheus_build.build_prometheus()), "--version"], capture_output=True, text=True,
                         timeout=30, check=True)
    assert "version 3.16.0" in out.stdout + out.stderr


@pytest.mark.gobuild
def test_scrapes_label_the_node_and_the_file_sd_hook_adds_exporters(
        prom: tuple[prometheus.LocalPrometheus, int]) -> None:
    p, _ = prom
    eventually(lambda: prometheus.targets_up(p.url) == {"n1": True} or None, 30, what="the target scraped")
    free = eventually(lambda: prometheus.query(p.url, "neuron_dra_node_devices") or None, 30, what="a series")
    assert [s["metric"]["node"] for s in free] == ["n1"]
    info = prometheus.query(p.url, "neuron_dra_claim_device_info")
    assert [s["metric"].get("exported_node") for s in info] == [None]  # its own node kept (honor_labels)

    port, server = serve(("neuroncore_utilization_ratio", {"neuroncore": "3"}))
    try:
        prometheus.add_targets(p.dir, "n2", [f"127.0.0.1:{port}"])
        util = eventually(lambda: prometheus.query(p.url, "neuroncore_utilization_ratio") or None, 30,
                          what="the neuron-monitor stand-in scraped")
        assert [(s["metric"]["node"], s["metric"]["neuroncore"], s["metric"]["job"]) for s in util] == [
            ("n2", "3", "neuron-monitor")]
    finally:
        server.shutdown()  # type: ignore[attr-defined]


@pytest.mark.gobuild
def test_a_bad_query_names_the_expression(prom: tuple[prometheus.LocalPrometheus, int]) -> None:
    p, _ = prom
    with pytest.raises(prometheus.PrometheusError, match="sum by"):
        prometheus.query(p.url, "sum by (")
