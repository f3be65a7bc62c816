"""The NeuronCore slices against real kube-apiservers: 1.36 keeps the counters (the probe says so, the four slices of a
trn2.48xlarge are stored as sent, a second reconcile writes nothing); 1.34 drops them (the probe says so, whole
devices only, and the reason is logged)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.daemon.publisher import NeuronSlices, slice_publisher
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.partitions import CoreLayout
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from tests.support.driver import DRIVER, NODE
from tests.support.e2e import raw

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.gobuild]  # builds 1.34 when not cached


@pytest.fixture(scope="module", params=["1.36", "1.34"])
def versioned_api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[str, Any]]:
    minor: str = request.param
    plane = ControlPlane.start(tmp_path_factory.mktemp(f"plane-{minor}"), kubernetes_version=minor,
                               max_lifetime_s=900)
    api = plane.api_client()
    try:
        yield minor, api
    finally:
        api.close()
        plane.stop()


def _slices(api: Any) -> list[dict[str, Any]]:
    resp = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={NODE}",
                                                          _preload_content=False)
    return list(raw(resp)["items"])


def test_cores_are_published_where_the_api_server_keeps_counters(versioned_api: tuple[str, Any],
                                                                  tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                  ) -> None:
    minor, api = versioned_api
    client.CoreV1Api(api).create_node({"apiVersion": "v1", "kind": "Node",  # type: ignore[arg-type]
                                       "metadata": {"name": NODE}})
    host = discover(emulate("trn2.48xlarge", tmp_path / "host"))
    layout = CoreLayout.for_spec(host.spec)
    pub = slice_publisher(api, host, NODE, PublishOptions(driver_name=DRIVER, cores=layout), Metrics())
    slices = pub.resources
    assert isinstance(slices, NeuronSlices)
    with caplog.at_level(logging.INFO, logger="neuron_dra.driver.daemon.publisher"):
        result, _ = pub.reconcile()
    stored = _slices(api)
    devices = [d for s in stored for d in s["spec"].get("devices") or ()]
    counters = [c for s in stored for c in s["spec"].get("sharedCounters") or ()]
    if minor >= "1.36":
        assert slices.partitions_supported and "keeps ResourceSlice sharedCounters" in slices.partitions_reason
        expected = build_pool(host, NodeFacts(NODE), PublishOptions(driver_name=DRIVER, cores=layout))
        assert result.created == len(stored) == 4 and len(devices) == 80 and len(counters) == 16
        assert sorted(devices, key=lambda d: d["name"]) == sorted((d.to_api() for d in expected.devices),
                                                                  key=lambda d: d["name"])
        assert sorted(counters, key=lambda c: c["name"]) == sorted(expected.counter_sets, key=lambda c: c["name"])
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {4}
    else:
        assert slices.partitions_supported is False and "DRAPartitionableDevices is off" in slices.partitions_reason
        assert len(stored) == 1 and len(devices) == 16 and not counters
        assert all("consumesCounters" not in d for d in devices)
        assert any("whole Neuron devices only" in r.getMessage() for r in caplog.records)
    again, _ = pub.reconcile()
    assert not again.changed  # what the server stored is what we send: no rewrite loop
