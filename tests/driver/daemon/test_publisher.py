"""The driver against the real kube-apiserver of the local control plane (localcluster/controlplane.py):
ResourceSlice publishing with the reference publisher's semantics, and the daemon's prepare with the real
claim GET (UID check, allocation, configs) over its sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.daemon.publisher import slice_publisher
from neuron_dra.driver.kubeletplugin._claimref import ClaimLookupError
from neuron_dra.driver.kubeletplugin._kube import KubeClaimLookup, api_client
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.slices import NETWORK_NODE_LABELS, NodeFacts, PublishOptions, build_pool
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from tests.support import pluginclient
from tests.support.driver import DRIVER, NEURON_CONFIG, NODE, DaemonDirs, opaque, short_dir, wait_until
from tests.support.e2e import raw
from tests.support.pluginclient import ClaimRef

pytestmark = pytest.mark.cluster

OTHER_NODE = "node-b"


def ensure_node(api: Any, name: str, labels: dict[str, str]) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    try:
        return raw(core.create_node(body, _preload_content=False))
    except ApiException as e:
        if e.status != 409:
            raise
        patch: Any = {"metadata": {"labels": labels}}
        return raw(core.patch_node(name, patch, _preload_content=False))


def slices(api: Any, node: str = NODE) -> list[dict[str, Any]]:
    resp = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}",
                                                          _preload_content=False)
    return sorted(raw(resp)["items"], key=lambda s: s["metadata"]["name"])


def wipe(api: Any, node: str = NODE) -> None:
    """What kubelet does at its start."""
    client.ResourceV1Api(api).delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")


def foreign_slice(node: str, name: str, generation: int = 0, pool: str | None = None) -> Any:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": pool or node, "generation": generation,
                                                                    "resourceSliceCount": 1},
                     "devices": [{"name": "stale-device"}]}}


LAYERS = {k: f"nn-{i}" for i, k in enumerate(NETWORK_NODE_LABELS, start=1)}


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    return emulate("trn2.48xlarge", tmp_path / "host")


def test_publish_semantics(api: Any, host_root: Path) -> None:
    node = ensure_node(api, NODE, LAYERS)
    wipe(api)
    pub = slice_publisher(api, discover(host_root), NODE, PublishOptions(driver_name=DRIVER), Metrics())
    result, _ = pub.reconcile()
    assert (result.created, result.updated, result.deleted, result.generation) == (1, 0, 0, 1)
    [s] = slices(api)
    assert s["metadata"]["name"].startswith(f"{NODE}-{DRIVER}-")
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                 "uid": node["metadata"]["uid"], "controller": True}]
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    host = discover(host_root)
    assert s["spec"]["devices"] == [d.to_api() for d in build_pool(host, NodeFacts.from_labels(NODE, LAYERS)).devices]
    devs = {d["name"]: d for d in s["spec"]["devices"]}
    assert sorted(devs) == sorted(f"neuron-device-{i}" for i in range(16))
    assert devs["neuron-device-0"]["attributes"]["networkNodeLayer3"] == {"string": "nn-3"}
    assert devs["neuron-device-0"]["capacity"]["memory"] == {"value": "96Gi"}
    # what the API server returns compares equal to what we send: no rewrite loop
    again, _ = pub.reconcile()
    assert not again.changed and again.generation == 1

    # a stale extra slice of this node and driver: deleted first; the rest updated with a new generation
    client.ResourceV1Api(api).create_resource_slice(foreign_slice(NODE, "zz-stale"))
    client.ResourceV1Api(api).create_resource_slice(foreign_slice(OTHER_NODE, "other-node-slice"))
    changed, _ = pub.reconcile()
    assert (changed.deleted, changed.updated, changed.created, changed.generation) == (1, 1, 0, 2)
    [s] = slices(api)
    assert s["spec"]["pool"]["generation"] == 2 and len(s["spec"]["devices"]) == 16
    assert [o["metadata"]["name"] for o in slices(api, OTHER_NODE)] == ["other-node-slice"]  # never touched

    # node labels change (EC2 topology): republished with a bumped generation
    ensure_node(api, NODE, {**LAYERS, NETWORK_NODE_LABELS[2]: "nn-3b"})
    changed, _ = pub.reconcile()
    assert changed.updated == 1 and changed.generation == 3
    [s] = slices(api)
    assert {d["attributes"]["networkNodeLayer3"]["string"] for d in s["spec"]["devices"]} == {"nn-3b"}
    client.ResourceV1Api(api).delete_resource_slice("other-node-slice")


def test_watch_republishes_after_kubelet_wipes_the_slices(api: Any, host_root: Path) -> None:
    ensure_node(api, NODE, LAYERS)
    wipe(api)
    metrics = Metrics()
    pub = slice_publisher(api, discover(host_root), NODE, PublishOptions(driver_name=DRIVER), metrics,
                         resync_seconds=30)
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        assert pub.published.wait(20)
        first = wait_until(lambda: slices(api), 20, "the first slice")[0]
        start = time.monotonic()
        wipe(api)
        again = wait_until(lambda: [s for s in slices(api) if s["metadata"]["uid"] != first["metadata"]["uid"]],
                           10, "republished slices")
        elapsed = time.monotonic() - start
        assert elapsed < 5, f"republished after {elapsed:.1f} s"
        assert again[0]["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]
        # someone edits our slice: restored
        s = again[0]
        s["spec"]["devices"] = s["spec"]["devices"][:3]
        client.ResourceV1Api(api).replace_resource_slice(s["metadata"]["name"], s)
        wait_until(lambda: [x for x in slices(api) if len(x["spec"]["devices"]) == 16 and
                            x["spec"]["pool"]["generation"] > s["spec"]["pool"]["generation"]], 10,
                   "the edited slice restored")
        assert metrics.published_devices._value.get() == 16
    finally:
        stop.set()
        thread.join(timeout=40)


def test_a_slice_of_another_pool_never_stalls_publishing(api: Any, host_root: Path) -> None:
    """Issue 14 item 3: a slice for (this node, this driver) in another pool. Before, the publisher deleted its own
    correct slice and retried forever to update the foreign one (pool names cannot change: 422)."""
    ensure_node(api, NODE, LAYERS)
    wipe(api)
    res = client.ResourceV1Api(api)
    pub = slice_publisher(api, discover(host_root), NODE, PublishOptions(driver_name=DRIVER), Metrics(),
                         resync_seconds=30)
    first, _ = pub.reconcile()
    assert first.created == 1
    [own] = slices(api)
    # Sorted before ours by name, so it would be the one "reused" for the update.
    res.create_resource_slice(foreign_slice(NODE, "aaa-foreign", generation=7, pool="someone-elses-pool"))
    again, _ = pub.reconcile()
    assert not again.changed, again
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        assert pub.published.wait(10)
        wipe_own = own["metadata"]["name"]
        res.delete_resource_slice(wipe_own)  # kubelet-style wipe of ours only: republished despite the foreign one
        republished = wait_until(lambda: [s for s in slices(api) if s["spec"]["pool"]["name"] == NODE
                                          and s["metadata"]["uid"] != own["metadata"]["uid"]], 10,
                                 "our slice republished next to the foreign one")
        assert len(republished[0]["spec"]["devices"]) == 16
        foreign = res.read_resource_slice("aaa-foreign", _preload_content=False)
        spec = raw(foreign)["spec"]
        assert spec["pool"] == {"name": "someone-elses-pool", "generation": 7, "resourceSliceCount": 1}
        assert [d["name"] for d in spec["devices"]] == ["stale-device"]  # left exactly as it was
    finally:
        stop.set()
        thread.join(timeout=40)
        res.delete_resource_slice("aaa-foreign")


# --- the daemon with the real claim GET --------------------------------------------------------------------------

def create_claim(api: Any, name: str, results: list[dict[str, Any]] | None,
                 configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    res = client.ResourceV1Api(api)
    request = {"name": "neurons", "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount",
                                              "count": max(1, len(results or []))}}
    body: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": [request]}}}
    created: Any = raw(res.create_namespaced_resource_claim("default", body, _preload_content=False))
    if results is None:
        return dict(created)
    created["status"] = {"allocation": {"devices": {"results": results, "config": configs or []}}}
    return raw(res.replace_namespaced_resource_claim_status(name, "default", created, _preload_content=False))


def delete_claim(api: Any, name: str) -> None:
    try:
        client.ResourceV1Api(api).delete_namespaced_resource_claim(name, "default")
    except ApiException as e:
        if e.status != 404:
            raise


def results_for(*indexes: int, pool: str = NODE) -> list[dict[str, Any]]:
    return [{"request": "neurons", "driver": DRIVER, "pool": pool, "device": f"neuron-device-{i}"} for i in indexes]


def test_claim_lookup_reads_claims_and_reports_missing_ones(api: Any) -> None:
    delete_claim(api, "lookup")
    created = create_claim(api, "lookup", results_for(1))
    lookup = KubeClaimLookup(api)
    got = lookup.get("default", "lookup")
    assert got is not None and got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["status"]["allocation"]["devices"]["results"][0]["device"] == "neuron-device-1"
    assert lookup.get("default", "no-such-claim") is None
    delete_claim(api, "lookup")


def test_claim_lookup_reports_api_errors_as_lookup_errors(plane: ControlPlane) -> None:
    nobody = api_client(str(plane.client_kubeconfig("nobody")))  # authenticated, but no RBAC at all
    try:
        with pytest.raises(ClaimLookupError, match="403"):
            KubeClaimLookup(nobody).get("default", "anything")
    finally:
        nobody.close()


@pytest.mark.process
def test_daemon_prepares_with_the_real_claim_get(api: Any, plane: ControlPlane, host_root: Path) -> None:
    ensure_node(api, NODE, LAYERS)
    for name in ("e2e-1", "e2e-16", "e2e-unallocated", "e2e-other-node"):
        delete_claim(api, name)
    one = create_claim(api, "e2e-1", results_for(6), [opaque({**NEURON_CONFIG, "logicalNeuronCore": 1})])
    sixteen = create_claim(api, "e2e-16", results_for(*range(8, 16)))
    unallocated = create_claim(api, "e2e-unallocated", None)
    other = create_claim(api, "e2e-other-node", results_for(0, pool=OTHER_NODE))
    with short_dir() as base:
        dirs = DaemonDirs(base)
        log = (base / "daemon.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_dra.driver", "--node-name", NODE, "--kubeconfig", str(plane.kubeconfig),
             "--plugins-dir", str(dirs.plugins), "--registry-dir", str(dirs.registry), "--cdi-root", str(dirs.cdi),
             "--host-root", str(host_root)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: dirs.registration_socket.exists() or proc.poll() is not None, 30, "registration")
            assert proc.poll() is None, (base / "daemon.log").read_text()
            reg = pluginclient.register(dirs.registration_socket)
            dra = pluginclient.DraClient(reg.endpoint, reg.version)
            refs = {name: ClaimRef("default", c["metadata"]["name"], c["metadata"]["uid"])
                    for name, c in (("one", one), ("sixteen", sixteen), ("unallocated", unallocated),
                                    ("other", other))}
            results = dra.prepare(list(refs.values()))
            assert results[refs["one"].uid].error == ""
            assert [d.device_name for d in results[refs["sixteen"].uid].devices] == \
                [f"neuron-device-{i}" for i in range(8, 16)]
            assert "not allocated" in results[refs["unallocated"].uid].error
            assert f"pool {OTHER_NODE}" in results[refs["other"].uid].error
            spec = json.loads((dirs.cdi / f"{DRIVER}_{refs['one'].uid}.json").read_text())
            env = next(d for d in spec["devices"] if d["name"].endswith("request-neurons"))["containerEdits"]["env"]
            assert "NEURON_RT_VISIBLE_CORES=48-55" in env and "NEURON_LOGICAL_NC_CONFIG=1" in env
            # the claim is deleted and re-created under the same name: kubelet's old UID is refused
            assert dra.unprepare([refs["one"]]) == {refs["one"].uid: ""}
            delete_claim(api, "e2e-1")
            create_claim(api, "e2e-1", results_for(6))
            replaced = dra.prepare([refs["one"]])[refs["one"].uid]
            assert "replaced" in replaced.error
            # unprepare after the claim object is gone
            delete_claim(api, "e2e-16")
            assert dra.unprepare([refs["sixteen"]]) == {refs["sixteen"].uid: ""}
            # and the daemon published this node's slices
            assert wait_until(lambda: slices(api), 20, "the daemon's slices")[0]["spec"]["driver"] == DRIVER
            dra.close()
        finally:
            proc.terminate()
            assert proc.wait(20) == 0
            log.close()
        assert not dirs.dra_socket.exists() and not dirs.registration_socket.exists()
