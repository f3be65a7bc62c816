"""A clean stop, end to end with real containers (issue 40's judgement; docs/upgrades.md, "A clean stop"): `cluster
up --runtime containerd` (the driver as the DaemonSet of `deploy.manifests()` from the built image), the DaemonSet
deleted, so kubelet stops the only driver pod of the node with SIGTERM. Within 60 s the node has no ResourceSlice
of the driver left, and the driver withdrew them itself (before its pod was gone, not kubelet's wipe about 30 s
after the plugin unregistered); a claim pod created then stays unscheduled with its claim unallocated; the
DaemonSet created again, the new driver republishes and that pod is bound to the node and runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch

from neuron_dra.localcluster.cluster import LocalCluster
from tests.e2e.test_e2e_containerd import (
    DAEMONSET,
    DRIVER_NS,
    DRIVER_SELECTOR,
    driver_pods,
    images,
    ready,
    wait_running,
    workload_pod,
)
from tests.support.e2e import allocated_devices, claim_template, eventually, pod_claim, raw, unschedulable

pytestmark = [pytest.mark.cluster, pytest.mark.containerd, pytest.mark.slow]

DRIVER = "neuron.aws.com"
NODE = "trn1-32xlarge-1"
NS = "stop"
WITHDRAW_WITHIN_S = 60  # the bound: no schedulable device of the node this long after the delete


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from neuron_dra.localcluster.cluster import up

    cluster = up(tmp_path_factory.mktemp("stop"), ["trn1.32xlarge:1"], ttl=3600, timeout=1800,
                 runtime="containerd")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def kapi(ctrd: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(ctrd.kubeconfig))
    yield api
    api.close()


def node_slices(res: client.ResourceV1Api) -> dict[str, Any]:
    return raw(res.list_resource_slice(field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}",
                                       _preload_content=False))


def deletions(list_fn: Any, since: str, names: set[str], timeout: int, **selectors: str) -> dict[str, int]:
    """Watch from resourceVersion `since` (the events after it, replayed in order) until every object of `names`
    is DELETED: name -> the resourceVersion of its deletion (one etcd's revisions: comparable across resources on
    this cluster). AssertionError naming those left when `timeout` s pass first."""
    left, out = set(names), {}
    w = watch.Watch()
    for event in w.stream(list_fn, resource_version=since, timeout_seconds=timeout, **selectors):
        obj = event["raw_object"]
        name = obj["metadata"]["name"]
        if event["type"] == "DELETED" and name in left:
            left.discard(name)
            out[name] = int(obj["metadata"]["resourceVersion"])
            if not left:
                w.stop()
    assert not left, f"still present {timeout} s after the DaemonSet's deletion: {sorted(left)}"
    return out


def test_a_driver_stopped_by_deleting_its_daemonset_withdraws_its_devices_until_one_is_back(
        ctrd: LocalCluster, kapi: client.ApiClient) -> None:
    core, res, apps = client.CoreV1Api(kapi), client.ResourceV1Api(kapi), client.AppsV1Api(kapi)
    core.create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(NS).items), 30, what="default SA")
    res.create_namespaced_resource_claim_template(NS, claim_template(  # type: ignore[arg-type]
        "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
    driver = eventually(lambda: p if (p := driver_pods(core).get(NODE)) and ready(p) else None, 300,
                        what="the driver pod Ready")
    published = eventually(lambda: s if (s := node_slices(res))["items"] else None, 120, what="the node's slices")
    pods = raw(core.list_namespaced_pod(DRIVER_NS, label_selector=DRIVER_SELECTOR, _preload_content=False))
    since = pods["metadata"]["resourceVersion"]  # before the delete: both watches below replay from here
    daemonset = raw(apps.read_namespaced_daemon_set(DAEMONSET, DRIVER_NS, _preload_content=False))

    apps.delete_namespaced_daemon_set(DAEMONSET, DRIVER_NS, propagation_policy="Background")
    gone = deletions(res.list_resource_slice, since, {s["metadata"]["name"] for s in published["items"]},
                     WITHDRAW_WITHIN_S, field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}")
    assert not node_slices(res)["items"]  # and no new one: nothing of the node is schedulable
    # The driver withdrew them as it stopped: every slice was deleted before its pod (the pod object goes once
    # kubelet saw the container exit), not by kubelet's wipe after the plugin unregistered.
    pod_gone = deletions(core.list_namespaced_pod, since, {driver["metadata"]["name"]}, 120, namespace=DRIVER_NS,
                         label_selector=DRIVER_SELECTOR)
    assert max(gone.values()) < pod_gone[driver["metadata"]["name"]], (gone, pod_gone)

    # A claim pod created while no driver runs: not bound to the node, its claim not allocated.
    core.create_namespaced_pod(NS, workload_pod("waits", images(ctrd)["workload"], NODE))  # type: ignore[arg-type]
    eventually(lambda: unschedulable(core, NS, "waits"), 120, what="pod waits found unschedulable")
    assert not pod_claim(core, res, NS, "waits").get("status", {}).get("allocation")

    # The DaemonSet back: the new driver republishes, and the waiting pod is bound to the node and runs there.
    meta = daemonset["metadata"]
    apps.create_namespaced_daemon_set(DRIVER_NS, {  # type: ignore[arg-type]
        "apiVersion": "apps/v1", "kind": "DaemonSet", "spec": daemonset["spec"],
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}})
    pod = wait_running(core, NS, "waits", timeout=300)
    assert pod["spec"]["nodeName"] == NODE
    claim = pod_claim(core, res, NS, "waits")
    assert len(allocated_devices(claim, DRIVER)) == 1
    assert {r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]} == {NODE}
    assert node_slices(res)["items"]
