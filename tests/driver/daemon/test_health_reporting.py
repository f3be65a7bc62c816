"""Device health against the real kube-apiserver (1.36): a fault taints the device in the published ResourceSlice
and records an Event on the Node; clearing it removes the taint; an API server without DRADeviceTaints drops the
taints and the publisher notices once and stops sending them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.daemon.health.reporting import HealthReporter
from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.daemon.publisher import slice_publisher
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import clear_faults, emulate, inject_fault
from neuron_dra.driver.model.slices import PublishOptions
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from tests.support.driver import DRIVER, NODE
from tests.support.e2e import raw

pytestmark = pytest.mark.cluster


def ensure_node(api: Any, name: str) -> None:
    core = client.CoreV1Api(api)
    try:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})  # type: ignore[arg-type]
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise


def devices_by_name(api: Any, node: str) -> dict[str, dict[str, Any]]:
    resp = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}",
                                                          _preload_content=False)
    return {d["name"]: d for s in raw(resp)["items"] for d in s["spec"].get("devices") or ()}


def node_events(api: Any, node: str) -> list[tuple[str, str, str]]:
    resp = client.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}",
                                                       _preload_content=False)
    return [(e["reason"], e["type"], e["message"]) for e in raw(resp)["items"]]


class Node:
    """One node's health pieces wired as the daemon wires them (main.py), driven by explicit polls."""

    def __init__(self, api: Any, name: str, host: Path, effect: str) -> None:
        ensure_node(api, name)
        self.host = host
        self.metrics = Metrics()
        self.monitor = HealthMonitor(host, range(16))
        neuron_host = discover(host)
        self.reporter = HealthReporter(self.monitor, neuron_host, name, DRIVER, effect, api, self.metrics)
        self.publisher = slice_publisher(api, neuron_host, name, PublishOptions(driver_name=DRIVER), self.metrics,
                                        taints=self.reporter.taints)
        self.reporter.republish = self.publisher.refresh
        self.monitor.add_listener(self.reporter.on_change)


def test_fault_taints_the_device_records_events_and_clear_untaints(api: Any, tmp_path: Path) -> None:
    node = Node(api, "health-node-a", emulate("trn2.48xlarge", tmp_path / "host"), "NoExecute")
    node.publisher.reconcile()
    assert not any("taints" in d for d in devices_by_name(api, "health-node-a").values())

    inject_fault(node.host, 3)
    assert set(node.monitor.poll()) == {3}  # the listener republished synchronously
    devs = devices_by_name(api, "health-node-a")
    (taint,) = devs["neuron-device-3"]["taints"]
    assert taint["key"] == "neuron.aws.com/unhealthy" and taint["value"] == "mem_ecc_uncorrected"
    assert taint["effect"] == "NoExecute"
    assert [n for n, d in devs.items() if "taints" in d] == ["neuron-device-3"]
    # What the server stored compares equal to what we send: no rewrite loop, timeAdded does not move.
    result, _ = node.publisher.reconcile()
    assert not result.changed
    assert devices_by_name(api, "health-node-a")["neuron-device-3"]["taints"] == [taint]
    assert node.publisher.taints_supported
    assert node.metrics.tainted_devices._value.get() == 1
    unhealthy = [e for e in node_events(api, "health-node-a") if e[0] == "DeviceUnhealthy"]
    assert len(unhealthy) == 1 and unhealthy[0][1] == "Warning"
    assert "neuron-device-3 is unhealthy: 1 uncorrectable HBM ECC errors" in unhealthy[0][2]

    # A restarted daemon sees the fault anew (a later `since`) but keeps the published taint as it is.
    time.sleep(1.1)
    restarted = Node(api, "health-node-a", node.host, "NoExecute")
    result, _ = restarted.publisher.reconcile()
    assert not result.changed
    assert devices_by_name(api, "health-node-a")["neuron-device-3"]["taints"] == [taint]

    clear_faults(node.host, 3)
    node.monitor.poll()
    assert not any("taints" in d for d in devices_by_name(api, "health-node-a").values())
    assert ("DeviceHealthy", "Normal") in [e[:2] for e in node_events(api, "health-node-a")]
    assert node.metrics.tainted_devices._value.get() == 0


def pool_generations(api: Any, node: str) -> list[int]:
    resp = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}",
                                                          _preload_content=False)
    return sorted(s["spec"]["pool"]["generation"] for s in raw(resp)["items"])


def test_two_instances_side_by_side_publish_the_same_taints_without_flapping(api: Any, tmp_path: Path) -> None:
    """A surge rollout (docs/upgrades.md): the new instance starts while a device is tainted, a second device
    fails while both run, then the old one stops. The pool is rewritten only when a fault appears, the taints'
    timeAdded never moves, and nothing is deleted when the old one goes."""
    name = "health-node-surge"
    host = emulate("trn2.48xlarge", tmp_path / "host")
    old = Node(api, name, host, "NoSchedule")
    old.publisher.reconcile()
    inject_fault(host, 5)
    old.monitor.poll()
    first = devices_by_name(api, name)["neuron-device-5"]["taints"]
    time.sleep(1.1)  # the new instance reads the fault later than the old one did
    new = Node(api, name, host, "NoSchedule")  # its first poll happens as it is made: the taint is known at once
    generations = pool_generations(api, name)
    for _ in range(3):
        for node in (new, old):
            result, _ = node.publisher.reconcile()
            assert not result.changed
    assert pool_generations(api, name) == generations

    inject_fault(host, 9)  # while both run: each notices and republishes; the second finds it done already
    old.monitor.poll()
    after_fault = pool_generations(api, name)
    assert after_fault != generations
    time.sleep(1.1)
    new.monitor.poll()
    for node in (old, new, old):
        result, _ = node.publisher.reconcile()
        assert not result.changed
    assert pool_generations(api, name) == after_fault
    devs = devices_by_name(api, name)
    assert devs["neuron-device-5"]["taints"] == first
    assert [n for n, d in devs.items() if "taints" in d] == ["neuron-device-5", "neuron-device-9"]
    del old  # the old instance stops: the publisher deletes nothing on the way out
    assert devices_by_name(api, name)["neuron-device-9"]["taints"]
    assert pool_generations(api, name) == after_fault


@pytest.fixture(scope="module")
def plane_without_taints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Kubernetes 1.36 with the beta DRADeviceTaints gate off: like 1.34/1.35 (alpha, off)."""
    cp = ControlPlane.start(tmp_path_factory.mktemp("controlplane-notaints"), max_lifetime_s=900,
                            extra_apiserver_args=["--feature-gates=DRADeviceTaints=false"])
    try:
        yield cp
    finally:
        cp.stop()


def test_api_server_without_device_taints_drops_them_and_the_publisher_stops_sending(
        plane_without_taints: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    api = config.new_client_from_config(str(plane_without_taints.kubeconfig))
    host = emulate("trn2.48xlarge", tmp_path / "host")
    inject_fault(host, 0)  # unhealthy from the start
    node = Node(api, NODE, host, "NoSchedule")
    node.publisher.reconcile()
    assert not node.publisher.taints_supported
    assert "dropped the device taints" in caplog.text
    assert not any("taints" in d for d in devices_by_name(api, NODE).values())
    result, _ = node.publisher.reconcile()  # stable from then on: no rewrite loop
    assert not result.changed and len(devices_by_name(api, NODE)) == 16
