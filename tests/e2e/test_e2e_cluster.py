"""End-to-end: the driver and claims against a real kube-apiserver, kube-scheduler and kube-controller-manager.

The session fixture `local_cluster` starts the local cluster (see localcluster/); every test here talks to it
through the real API as a user would, and inspects the emulated nodes' CDI directories and kubelet records.
The `ns` fixture (conftest.py) gives each test a namespace and cleans its pods and claims up afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.partitions import CoreLayout, parse_core_device, read_node_lnc
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool, resource_slices
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.processes import procs
from tests.support.e2e import (
    allocated_devices,
    cdi_specs_naming,
    claim_template,
    created_container,
    eventually,
    pod_claim,
    pod_phase,
    pod_with_template,
    raw,
)

# The end-to-end suite runs the local cluster.
pytestmark = pytest.mark.cluster

DRIVER = "neuron.aws.com"
TRN2_A, TRN2_B, TRN1, INF2, TRN2U = (
    "trn2-48xlarge-1", "trn2-48xlarge-2", "trn1-32xlarge-1", "inf2-48xlarge-1", "trn2u-48xlarge-1")


def slices_of(res: client.ResourceV1Api, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw(res.list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={driver}", _preload_content=False))["items"]
    return items


def _complete(slices: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The slices once all `count` of the pool are there (else none)."""
    return slices if len(slices) == count else []


def test_slices_are_the_device_model_and_come_back_after_deletion(local_cluster: LocalCluster,
                                                                  kube: client.ApiClient) -> None:
    res = client.ResourceV1Api(kube)
    core = client.CoreV1Api(kube)
    # From 1.36 (partitionable devices on by default) the driver publishes NeuronCores and counters as well.
    version: Any = client.VersionApi(kube).get_code()
    partitionable = int(re.sub(r"\D.*", "", version.minor)) >= 36
    for node in local_cluster.nodes:
        host_root = local_cluster.node_paths(node.name).host_root
        host = discover(host_root)
        cores = CoreLayout.for_spec(host.spec, read_node_lnc(host_root, host.spec)) if partitionable else None
        node_obj: Any = core.read_node(node.name)
        pool = build_pool(host, NodeFacts.from_labels(node.name, node_obj.metadata.labels),
                          PublishOptions(DRIVER, cores=cores))
        want = len(resource_slices(pool))
        published = eventually(lambda n=node.name, w=want: _complete(slices_of(res, n), w),  # type: ignore[misc]
                               60, what=f"{want} slices of {node.name}")
        devices = sorted((d for s in published for d in s["spec"].get("devices", [])), key=lambda d: d["name"])
        assert devices == sorted((d.to_api() for d in pool.devices), key=lambda d: d["name"])
        counters = [c for s in published for c in s["spec"].get("sharedCounters", [])]
        assert sorted(counters, key=lambda c: c["name"]) == sorted(pool.counter_sets, key=lambda c: c["name"])
        assert all(s["spec"]["pool"]["name"] == node.name for s in published)
        assert len({s["spec"]["pool"]["generation"] for s in published}) == 1
        assert all(s["metadata"]["ownerReferences"][0]["name"] == node.name for s in published)
    before = {s["metadata"]["name"] for s in slices_of(res, TRN1)}
    res.delete_collection_resource_slice(field_selector=f"spec.nodeName={TRN1},spec.driver={DRIVER}")
    again = eventually(lambda: _complete(slices_of(res, TRN1), len(before)), 20,
                       what="slices republished after deletion")
    assert {s["metadata"]["name"] for s in again}.isdisjoint(before)
    whole = [d for s in again for d in s["spec"].get("devices", []) if not parse_core_device(d["name"])]
    assert len(whole) == 16


def test_driver_identity_cannot_write_another_nodes_slice(local_cluster: LocalCluster) -> None:
    driver_api = config.new_client_from_config(str(local_cluster.node_paths(TRN1).driver_kubeconfig))
    res = client.ResourceV1Api(driver_api)

    def slice_for(node: str) -> Any:
        # its own driver name (the admission policy refuses other drivers' slices), a pool of its own (the
        # daemon leaves slices of its node and driver in another pool alone)
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"generateName": f"{node}-probe-"},
                "spec": {"driver": DRIVER, "nodeName": node,
                         "pool": {"name": f"{node}-probe", "generation": 0, "resourceSliceCount": 1},
                         "devices": []}}

    with pytest.raises(ApiException) as refused:
        res.create_resource_slice(slice_for(TRN2_A))
    assert refused.value.status in (403, 422)
    assert "node" in str(refused.value.body).lower()
    own: Any = res.create_resource_slice(slice_for(TRN1))  # its own node: allowed
    res.delete_resource_slice(own.metadata.name)
    with pytest.raises(ApiException) as forbidden:  # least privilege: no secrets
        client.CoreV1Api(driver_api).list_secret_for_all_namespaces()
    assert forbidden.value.status == 403


def _create(kube: client.ApiClient, ns: str, obj: dict[str, Any]) -> None:
    if obj["kind"] == "Pod":
        client.CoreV1Api(kube).create_namespaced_pod(ns, obj)  # type: ignore[arg-type]
    else:
        client.ResourceV1Api(kube).create_namespaced_resource_claim_template(ns, obj)  # type: ignore[arg-type]


def _running(kube: client.ApiClient, ns: str, pods: list[str]) -> list[str]:
    core = client.CoreV1Api(kube)
    return [p for p in pods if pod_phase(core, ns, p) == "Running"]


def _unschedulable(kube: client.ApiClient, ns: str, pod: str) -> bool:
    p = raw(client.CoreV1Api(kube).read_namespaced_pod(pod, ns, _preload_content=False))
    return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
               for c in p.get("status", {}).get("conditions", []))


def test_four_connected_claims_pack_four_per_trn2_and_get_their_cores(local_cluster: LocalCluster,
                                                                       kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'trn2.48xlarge'"}}
    _create(kube, ns, claim_template("four", [{"name": "neurons", "exactly": {
        "deviceClassName": DRIVER, "count": 4, "selectors": [sel]}}],
        [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]))
    pods = [f"p{i}" for i in range(5)]
    for p in pods:
        _create(kube, ns, pod_with_template(p, "four", node=TRN2_B))
    eventually(lambda: len(_running(kube, ns, pods)) == 4, 90, what="4 pods running")
    (pending,) = set(pods) - set(_running(kube, ns, pods))
    eventually(lambda: _unschedulable(kube, ns, pending), 30, what="the fifth pod unschedulable")
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    paths = local_cluster.node_paths(TRN2_B)
    groups = []
    for p in _running(kube, ns, pods):
        claim = pod_claim(core, res, ns, p)
        devices = sorted(int(d.rsplit("-", 1)[1]) for d in allocated_devices(claim, DRIVER))
        assert len(devices) == 4 and devices == list(range(devices[0], devices[0] + 4)) and devices[0] % 4 == 0
        groups.append(devices[0] // 4)
        record = created_container(paths.cri_records, ns, p)
        env = record["env"]
        first = devices[0] * 4  # trn2 at LNC 2: 4 logical cores per device
        assert env["NEURON_RT_VISIBLE_CORES"] == f"{first}-{first + 15}"
        nodes = sorted(n["path"] for n in record["deviceNodes"])
        assert nodes == sorted(f"/dev/neuron{d}" for d in devices)
        uid = claim["metadata"]["uid"]
        assert cdi_specs_naming(paths.cdi_root, [uid]), "a CDI spec names the claim UID"
    assert sorted(groups) == [0, 1, 2, 3]
    # Deleting the pods unprepares the claims: their CDI specs are removed.
    uids = [pod_claim(core, res, ns, p)["metadata"]["uid"] for p in _running(kube, ns, pods)]
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(ns).items, 60, what="pods deleted")
    # kubelet unprepares after the pods are gone (a forced deletion does not wait for it)
    eventually(lambda: not cdi_specs_naming(paths.cdi_root, uids), 30,
               what="CDI specs of the deleted pods' claims removed")


def test_whole_node_with_lnc1(local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'trn2.48xlarge'"}}
    _create(kube, ns, claim_template("all-lnc1", [{"name": "neurons", "exactly": {
        "deviceClassName": DRIVER, "allocationMode": "All", "selectors": [sel]}}],
        config=[{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]))
    _create(kube, ns, pod_with_template("whole", "all-lnc1", node=TRN2_A))
    eventually(lambda: _running(kube, ns, ["whole"]), 90, what="whole-node pod running")
    env = created_container(local_cluster.node_paths(TRN2_A).cri_records, ns, "whole")["env"]
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-127"  # 16 devices x 8 logical cores at LNC 1


def test_bad_config_is_a_per_claim_error_and_pod_does_not_start(local_cluster: LocalCluster,
                                                                  kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'trn1.32xlarge'"}}
    _create(kube, ns, claim_template("lnc-on-trn1", [{"name": "n", "exactly": {
        "deviceClassName": DRIVER, "count": 1, "selectors": [sel]}}],
        config=[{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]))
    _create(kube, ns, pod_with_template("bad", "lnc-on-trn1", node=TRN1))
    core = client.CoreV1Api(kube)

    def failure_event() -> str | None:
        for e in core.list_namespaced_event(ns).items:
            if e.involved_object.name == "bad" and "logicalNeuronCore" in (e.message or ""):
                return str(e.message)
        return None

    message = eventually(failure_event, 60, what="a prepare failure event naming the field")
    assert "trn1.32xlarge" in message
    assert pod_phase(core, ns, "bad") != "Running"


def test_inf2_ring_segments(local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'inf2.48xlarge'"}}
    _create(kube, ns, claim_template("ring4", [{"name": "n", "exactly": {
        "deviceClassName": DRIVER, "count": 4, "selectors": [sel]}}],
        [{"requests": ["n"], "matchAttribute": f"{DRIVER}/topology4_id"}]))
    pods = ["r0", "r1", "r2", "r3"]
    for p in pods:
        _create(kube, ns, pod_with_template(p, "ring4", node=INF2))
    eventually(lambda: len(_running(kube, ns, pods)) == 3, 90, what="3 ring segments of 4 on inf2.48xlarge")
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    segments = sorted(
        sorted(int(d.rsplit("-", 1)[1]) for d in allocated_devices(pod_claim(core, res, ns, p), DRIVER))
        for p in _running(kube, ns, pods))
    assert segments == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_aligned_efa(local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'trn1.32xlarge'"}}
    _create(kube, ns, claim_template("aligned", [
        {"name": "neurons", "exactly": {"deviceClassName": DRIVER, "count": 4, "selectors": [sel]}},
        {"name": "efa", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 2}}],
        [{"requests": ["neurons", "efa"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]))
    _create(kube, ns, pod_with_template("aligned", "aligned", node=TRN1))
    eventually(lambda: _running(kube, ns, ["aligned"]), 90, what="aligned pod running")
    claim = pod_claim(client.CoreV1Api(kube), client.ResourceV1Api(kube), ns, "aligned")
    neurons = sorted(int(d.rsplit("-", 1)[1]) for d in allocated_devices(claim, DRIVER))
    efas = allocated_devices(claim, "dra.net")
    assert len(neurons) == 4 and neurons[0] % 4 == 0 and len(efas) == 2  # trn1: 2 EFAs per row of 4


def test_ultraserver_config(local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    _create(kube, ns, claim_template("us", [{"name": "node", "exactly": {
        "deviceClassName": DRIVER, "count": 1,
        "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].resourceType == 'neuron_node'"}}]}}],
        config=[{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 4}}}]))
    _create(kube, ns, pod_with_template("us", "us"))
    eventually(lambda: _running(kube, ns, ["us"]), 90, what="UltraServer pod running")
    env = created_container(local_cluster.node_paths(TRN2U).cri_records, ns, "us")["env"]
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "4"
    assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == "0"
    assert env["NEURON_RT_ULTRASERVER_SERVER_ID"]


def _driver_pid(paths: Any) -> int:
    """The driver daemon's own pid: the child of the `timeout` process its pid file records (procs.spawn)."""
    ref = procs.running(paths.driver_pid)
    assert ref is not None, f"no live driver recorded in {paths.driver_pid}"
    # Between kill and restart the recorded `timeout` may not have forked its child yet: not an answer, so wait.
    children = procs.children(ref.pid)
    assert len(children) == 1, f"the driver's timeout process {ref.pid} has children {children}"
    return children[0]


def _registrations(driver_log: Path) -> int:
    """How many times kubelet has confirmed the driver's registration (the daemon logs each)."""
    count = 0
    for line in driver_log.read_text(errors="replace").splitlines():
        try:
            count += json.loads(line).get("msg") == "registered with kubelet"
        except json.JSONDecodeError:
            continue
    return count


def test_driver_kill9_with_pods_alive(local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == 'trn1.32xlarge'"}}
    _create(kube, ns, claim_template("row", [{"name": "n", "exactly": {
        "deviceClassName": DRIVER, "count": 4, "selectors": [sel]}}],
        [{"requests": ["n"], "matchAttribute": f"{DRIVER}/topology4_id"}]))
    _create(kube, ns, pod_with_template("before", "row", node=TRN1))
    eventually(lambda: _running(kube, ns, ["before"]), 90, what="pod running before the kill")
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    uid = pod_claim(core, res, ns, "before")["metadata"]["uid"]
    paths = local_cluster.node_paths(TRN1)
    old = _driver_pid(paths)
    registrations = _registrations(paths.driver_log)
    os.kill(old, signal.SIGKILL)
    eventually(lambda: _driver_pid(paths) != old, 30, what="driver restarted")
    # A pod that reaches kubelet before the new process has registered fails its prepare ("connection refused") and
    # kubelet retries it only at its next pod sync, up to ~90 s later: wait for kubelet to register the new process.
    eventually(lambda: _registrations(paths.driver_log) > registrations, 30, what="restarted driver registered")
    assert pod_phase(core, ns, "before") == "Running"
    _create(kube, ns, pod_with_template("after", "row", node=TRN1))
    eventually(lambda: _running(kube, ns, ["after"]), 90, what="a new pod prepared by the restarted driver")
    # The restarted driver unprepares the claim it prepared before the kill, from its checkpoint.
    core.delete_namespaced_pod("before", ns, grace_period_seconds=0)
    eventually(lambda: not cdi_specs_naming(paths.cdi_root, [uid]), 60,
               what="the claim prepared before the kill unprepared after its pod is deleted")
