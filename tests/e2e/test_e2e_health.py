"""End-to-end device health (Kubernetes 1.36; 1.34 and 1.37 at the end): `neuron-dra cluster fault` on a device in
use taints it in the ResourceSlice within seconds, new claims get other devices, the pod's status shows the device
Unhealthy (kubelet's health stream), and `--clear` undoes all of it; with the NoExecute effect the pod using the
device is evicted while a pod that tolerates the taint stays."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.claim_templates import ClaimTemplate, Neuron, TolerateUnhealthy, checked_manifest
from neuron_dra.cli import main as cli_main
from neuron_dra.localcluster.cluster import LocalCluster, up
from tests.support.e2e import (
    allocated_devices,
    eventually,
    namespace_name,
    pod_claim,
    pod_phase,
    pod_with_template,
    raw,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DRIVER = "neuron.aws.com"
TAINT_KEY = f"{DRIVER}/unhealthy"
TRN2 = "trn2.48xlarge"
TRN2_A = "trn2-48xlarge-1"
TAINT_WITHIN_S = 10.0  # the driver polls every second; the slice write is one API call


def device_taints(res: client.ResourceV1Api, node: str) -> dict[str, list[dict[str, Any]]]:
    items = raw(res.list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}",
                                        _preload_content=False))["items"]
    return {d["name"]: d["taints"] for s in items for d in s["spec"].get("devices") or () if d.get("taints")}


def resource_health(core: client.CoreV1Api, ns: str, pod: str, device: str) -> str | None:
    """The health kubelet reports in the pod's status for one device (resourceID: the device's CDI id)."""
    p = raw(core.read_namespaced_pod(pod, ns, _preload_content=False))
    for cs in p.get("status", {}).get("containerStatuses") or ():
        for rs in cs.get("allocatedResourcesStatus") or ():
            for r in rs.get("resources") or ():
                if str(r.get("resourceID", "")).endswith(f"-{device}"):
                    return str(r.get("health"))
    return None


def fault(cluster_dir: Path, node: str, device: str, clear: bool = False) -> None:
    index = device.rsplit("-", 1)[1]
    args = ["cluster", "fault", "--dir", str(cluster_dir), "--node", node, "--device", index]
    assert cli_main([*args, "--clear"] if clear else args) == 0


def create_template(kube: client.ApiClient, ns: str, template: ClaimTemplate) -> None:
    body = checked_manifest(template)
    body["metadata"]["namespace"] = ns
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(ns, body)  # type: ignore[arg-type]


def run_pod(kube: client.ApiClient, ns: str, name: str, template: str, node: str) -> str:
    """Start a pod with one device of `template` on `node`; returns the device once it runs."""
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    core.create_namespaced_pod(ns, pod_with_template(name, template, node=node))  # type: ignore[arg-type]
    eventually(lambda: pod_phase(core, ns, name) == "Running", 90, what=f"pod {name} running")
    (device,) = allocated_devices(pod_claim(core, res, ns, name), DRIVER)
    return device


def test_fault_on_a_device_in_use_taints_it_new_claims_avoid_it_and_clear_undoes_it(
        local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    create_template(kube, ns, ClaimTemplate("one", Neuron(1, instance_types=TRN2)))
    device = run_pod(kube, ns, "worker", "one", TRN2_A)
    assert resource_health(core, ns, "worker", device) in (None, "Healthy")
    injected = time.monotonic()
    fault(local_cluster.dir, TRN2_A, device)
    try:
        taints = eventually(lambda: device_taints(res, TRN2_A).get(device), TAINT_WITHIN_S,
                            interval=0.1, what=f"taint on {device}")
        latency = time.monotonic() - injected
        print(f"fault -> taint on the ResourceSlice: {latency:.2f} s")
        assert [(t["key"], t["value"], t["effect"]) for t in taints] == [(TAINT_KEY, "mem_ecc_uncorrected",
                                                                          "NoSchedule")]
        # The device and the cores carved from it (when the node publishes cores), nothing else.
        tainted = set(device_taints(res, TRN2_A))
        assert device in tainted and all(n == device or n.startswith(f"{device}-core-") for n in tainted)
        # A new claim on the same node gets another device; the running pod stays (NoSchedule).
        other = run_pod(kube, ns, "newcomer", "one", TRN2_A)
        assert other != device
        assert pod_phase(core, ns, "worker") == "Running"
        # kubelet learned it from the driver's health stream and shows it in the pod's status.
        eventually(lambda: resource_health(core, ns, "worker", device) == "Unhealthy", 30,
                   what=f"{device} Unhealthy in the worker's status")
        assert resource_health(core, ns, "newcomer", other) in (None, "Healthy")
        events = raw(core.list_namespaced_event("default", field_selector=f"involvedObject.name={TRN2_A}",
                                                _preload_content=False))["items"]
        assert any(e["reason"] == "DeviceUnhealthy" and device in e["message"] for e in events)
    finally:
        fault(local_cluster.dir, TRN2_A, device, clear=True)
    eventually(lambda: device not in device_taints(res, TRN2_A), TAINT_WITHIN_S, interval=0.1,
               what=f"taint on {device} removed")
    eventually(lambda: resource_health(core, ns, "worker", device) == "Healthy", 30,
               what=f"{device} Healthy again in the worker's status")


# --- NoExecute: a cluster of its own, with the driver started with that effect ---------------------------------

@pytest.fixture(scope="module")
def no_execute_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UNHEALTHY_TAINT_EFFECT", "NoExecute")  # the daemon's env fallback of --unhealthy-taint-effect
        cluster = up(tmp_path_factory.mktemp("noexec"), [f"{TRN2}:1"], ttl=1800, timeout=600, runtime="fake")
    try:
        yield cluster
    finally:
        cluster.down()


def test_no_execute_evicts_the_pod_on_the_device_but_not_one_that_tolerates_it(
        no_execute_cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    kube = config.new_client_from_config(str(no_execute_cluster.kubeconfig))
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    ns = namespace_name("health-", request.node.name)
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(ns).items), 30, what="default SA")
    node = no_execute_cluster.nodes[0].name
    create_template(kube, ns, ClaimTemplate("plain", Neuron(1, instance_types=TRN2)))
    create_template(kube, ns, ClaimTemplate("diagnostics", Neuron(1, instance_types=TRN2,
                                                                   tolerations=TolerateUnhealthy("NoExecute"))))
    victim = run_pod(kube, ns, "victim", "plain", node)
    diag = run_pod(kube, ns, "diag", "diagnostics", node)
    faulted = [victim, diag]
    try:
        fault(no_execute_cluster.dir, node, victim)
        fault(no_execute_cluster.dir, node, diag)
        eventually(lambda: {victim, diag} <= set(device_taints(res, node)), TAINT_WITHIN_S, interval=0.1,
                   what="both devices tainted")
        assert {t["effect"] for ts in device_taints(res, node).values() for t in ts} == {"NoExecute"}

        def victim_evicted() -> bool:
            pods = {p.metadata.name: p for p in core.list_namespaced_pod(ns).items if p.metadata is not None}
            v = pods.get("victim")
            return v is None or v.metadata.deletion_timestamp is not None  # type: ignore[union-attr]

        eventually(victim_evicted, 60, what="the device taint eviction controller deletes the victim")
        assert pod_phase(core, ns, "diag") == "Running"
        eventually(lambda: resource_health(core, ns, "diag", diag) == "Unhealthy", 30,
                   what=f"{diag} Unhealthy in the tolerating pod's status")
        # New untolerating claims avoid both tainted devices.
        other = run_pod(kube, ns, "after", "plain", node)
        assert other not in faulted
    finally:
        for d in faulted:
            fault(no_execute_cluster.dir, node, d, clear=True)
    eventually(lambda: not device_taints(res, node), TAINT_WITHIN_S, interval=0.1, what="taints removed")
    eventually(lambda: resource_health(core, ns, "diag", diag) == "Healthy", 30, what=f"{diag} Healthy again")
    core.delete_namespace(ns)


# --- Kubernetes 1.34: no device taints (alpha, off), no health in pod status (alpha, off) ---------------------------

def test_on_1_34_a_fault_is_detected_and_logged_and_nothing_else_changes(tmp_path_factory: pytest.TempPathFactory,
                                                                       request: pytest.FixtureRequest) -> None:
    cluster = up(tmp_path_factory.mktemp("k134"), [f"{TRN2}:1"], ttl=1200, timeout=600, kubernetes_version="1.34",
                 runtime="fake")
    try:
        kube = config.new_client_from_config(str(cluster.kubeconfig))
        core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
        ns = namespace_name("h134-", request.node.name)
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                               for sa in core.list_namespaced_service_account(ns).items), 30, what="default SA")
        node = cluster.nodes[0].name
        create_template(kube, ns, ClaimTemplate("one", Neuron(1, instance_types=TRN2)))
        device = run_pod(kube, ns, "worker", "one", node)
        fault(cluster.dir, node, device)
        log = cluster.node_paths(node).driver_log
        eventually(lambda: "dropped the device taints" in log.read_text(), 20,
                   what="the driver noticing that the API server drops taints")
        assert device_taints(res, node) == {}  # nothing to see in the slices: the gate is off
        assert '"msg": "device health changed"' in log.read_text()
        assert pod_phase(core, ns, "worker") == "Running"
        assert resource_health(core, ns, "worker", device) is None  # ResourceHealthStatus is off in 1.34
        run_pod(kube, ns, "newcomer", "one", node)  # allocation still works (and may pick the faulty device)
        fault(cluster.dir, node, device, clear=True)
    finally:
        cluster.down()


# --- Kubernetes 1.37: kubelet picks DRAResourceHealth v1 from the registration ---------------------------------

def test_on_1_37_kubelet_takes_health_over_v1_and_taints_are_ga(tmp_path_factory: pytest.TempPathFactory,
                                                                request: pytest.FixtureRequest) -> None:
    cluster = up(tmp_path_factory.mktemp("k137"), [f"{TRN2}:1"], ttl=1200, timeout=900, kubernetes_version="1.37",
                 runtime="fake")
    try:
        kube = config.new_client_from_config(str(cluster.kubeconfig))
        core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
        ns = namespace_name("h137-", request.node.name)
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                               for sa in core.list_namespaced_service_account(ns).items), 30, what="default SA")
        node = cluster.nodes[0].name
        create_template(kube, ns, ClaimTemplate("one", Neuron(1, instance_types=TRN2)))
        device = run_pod(kube, ns, "worker", "one", node)
        fault(cluster.dir, node, device)
        eventually(lambda: device in device_taints(res, node), TAINT_WITHIN_S, interval=0.1, what="taint")
        eventually(lambda: resource_health(core, ns, "worker", device) == "Unhealthy", 30,
                   what=f"{device} Unhealthy in the pod's status (1.37 kubelet, health v1)")
        assert run_pod(kube, ns, "newcomer", "one", node) != device
        fault(cluster.dir, node, device, clear=True)
        eventually(lambda: resource_health(core, ns, "worker", device) == "Healthy", 30, what="Healthy again")
        # The taint goes with a slice update, which the health stream to kubelet does not wait for.
        eventually(lambda: device not in device_taints(res, node), TAINT_WITHIN_S, interval=0.1, what="untainted")
    finally:
        cluster.down()
