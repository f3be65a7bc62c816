"""End-to-end NeuronCores on Kubernetes 1.36 with real kubelets (docs/neuron-cores.md): core claims sharing a
device on disjoint cores, pods written for the Neuron device plugin (only `resources.limits`) running unchanged,
and exactly as many of them fitting a node as its published counters allow and `claims check` predicts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client

from neuron_dra.claim_templates import Checker, ClaimTemplate, NeuronCores
from neuron_dra.claim_templates.allocator import simulate
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.driver.model.partitions import parse_core_device
from neuron_dra.localcluster.cluster import LocalCluster
from tests.support.e2e import (
    NEURON_TOLERATION,
    allocated_devices,
    created_container,
    eventually,
    pod_phase,
    pod_with_template,
    raw,
    unschedulable,
)

pytestmark = pytest.mark.cluster

DRIVER = "neuron.aws.com"
NODE = "trn2-48xlarge-2"  # trn2.48xlarge at LNC=2: 16 devices, 64 NeuronCores


def _partitionable(kube: client.ApiClient) -> bool:
    version: Any = client.VersionApi(kube).get_code()
    return int(re.sub(r"\D.*", "", version.minor)) >= 36


@pytest.fixture(autouse=True)
def _needs_136(kube: client.ApiClient) -> None:
    if not _partitionable(kube):
        pytest.skip("NeuronCores need partitionable devices and extended-resource mapping (Kubernetes 1.36+)")


def _limits_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    """A pod as written for the Neuron device plugin: only resources.limits, no claims."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                        "resources": {"limits": {resource: str(count)}}}]}}


def _pod(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    return raw(core.read_namespaced_pod(name, ns, _preload_content=False))


def _claim_of(kube: client.ApiClient, ns: str, pod: str) -> dict[str, Any]:
    """The pod's claim: from a template, or the one the scheduler made for its extended resources."""
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    status = _pod(core, ns, pod)["status"]
    name = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if name is None:
        (entry,) = status["resourceClaimStatuses"]
        name = entry["resourceClaimName"]
    return raw(res.read_namespaced_resource_claim(name, ns, _preload_content=False))


def _visible(local_cluster: LocalCluster, ns: str, pod: str) -> tuple[set[int], list[str]]:
    created = created_container(local_cluster.node_paths(NODE).cri_records, ns, pod)
    ids: set[int] = set()
    for part in created["env"]["NEURON_RT_VISIBLE_CORES"].split(","):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return ids, sorted(n["path"] for n in created["deviceNodes"])


def _running(core: client.CoreV1Api, ns: str, pods: list[str]) -> list[str]:
    return [p for p in pods if pod_phase(core, ns, p) == "Running"]


def test_two_core_claims_share_one_device_on_disjoint_cores(local_cluster: LocalCluster, kube: client.ApiClient,
                                                           ns: str) -> None:
    core = client.CoreV1Api(kube)
    template = ClaimTemplate("two-cores", NeuronCores(2, instance_types="trn2.48xlarge"), namespace=ns)
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(ns, template.to_manifest())  # type: ignore[arg-type]
    for p in ("a", "b"):
        core.create_namespaced_pod(ns, pod_with_template(p, "two-cores", node=NODE))  # type: ignore[arg-type]
    eventually(lambda: len(_running(core, ns, ["a", "b"])) == 2, 120, what="both core pods running")
    held = {p: allocated_devices(_claim_of(kube, ns, p), DRIVER) for p in ("a", "b")}
    parsed = {p: sorted(parse_core_device(d) or (-1, -1) for d in devs) for p, devs in held.items()}
    # One device, two aligned pairs: (0, 1) and (2, 3) of the same Neuron device.
    assert {i for p in parsed.values() for i, _ in p} == {parsed["a"][0][0]}, held
    assert sorted(c for p in parsed.values() for _, c in p) == [0, 1, 2, 3], held
    va, nodes_a = _visible(local_cluster, ns, "a")
    vb, nodes_b = _visible(local_cluster, ns, "b")
    device = parsed["a"][0][0]
    assert len(va) == len(vb) == 2 and not va & vb and va | vb == set(range(device * 4, device * 4 + 4))
    assert nodes_a == nodes_b == [f"/dev/neuron{device}"]  # exactly the device of the cores, nothing else


def test_device_plugin_pods_run_unchanged_and_fill_exactly_the_counters(local_cluster: LocalCluster,
                                                                       kube: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(kube)
    # What `claims check` predicts for aws.amazon.com/neuroncore: 8 (the scheduler's claim: 8 NeuronCores).
    catalog = NodeCatalog()
    node = catalog.node("trn2.48xlarge")
    raw_claim = {"metadata": {"name": "c", "namespace": ns}, "spec": {"devices": {"requests": [{
        "name": "container-0-request-0", "exactly": {"deviceClassName": "neuroncore.aws.com", "count": 8}}]}}}
    predicted = simulate(node.slices, node.device_classes, [raw_claim], node_name=node.node_name, mode="count").count
    assert predicted == 8
    assert {f.instance_type: f.claims_per_node for f in Checker().check(
        ClaimTemplate("one", NeuronCores(1)), ["trn2.48xlarge"]).fits} == {"trn2.48xlarge": 64}
    pods = [f"cores-{i}" for i in range(predicted + 1)]
    for p in pods:
        core.create_namespaced_pod(ns, _limits_pod(p, "aws.amazon.com/neuroncore", 8))  # type: ignore[arg-type]
    eventually(lambda: len(_running(core, ns, pods)) == predicted, 240, what=f"{predicted} core pods running")
    pending = [p for p in pods if p not in _running(core, ns, pods)]
    assert len(pending) == 1
    eventually(lambda: unschedulable(core, ns, pending[0]), 60, what="the pod past the counters unschedulable")
    seen: set[int] = set()
    for p in _running(core, ns, pods):
        ids, nodes = _visible(local_cluster, ns, p)
        assert len(ids) == 8 and not ids & seen, (p, ids)
        seen |= ids
        assert nodes == sorted({f"/dev/neuron{i // 4}" for i in ids})
    assert seen == set(range(64))
    # Every device is touched: a whole device does not fit (no untouched device), not even one.
    core.create_namespaced_pod(ns, _limits_pod("device", "aws.amazon.com/neuron", 1))  # type: ignore[arg-type]
    eventually(lambda: unschedulable(core, ns, "device"), 60, what="whole-device pod unschedulable")
    # One core pod leaves (the pending one first, so it cannot take the freed cores): its devices are untouched
    # again and the whole-device pod gets one of them.
    core.delete_namespaced_pod(pending[0], ns, grace_period_seconds=0)
    pods.remove(pending[0])
    leaving = _running(core, ns, pods)[0]
    freed = {i // 4 for i in _visible(local_cluster, ns, leaving)[0]}
    core.delete_namespaced_pod(leaving, ns, grace_period_seconds=0)
    eventually(lambda: pod_phase(core, ns, "device") == "Running", 180, what="whole-device pod running")
    (device,) = allocated_devices(_claim_of(kube, ns, "device"), DRIVER)
    assert int(device.rsplit("-", 1)[1]) in freed
    env = created_container(local_cluster.node_paths(NODE).cri_records, ns, "device")["env"]
    index = int(device.rsplit("-", 1)[1])
    assert env["NEURON_RT_VISIBLE_CORES"] == f"{index * 4}-{index * 4 + 3}"
