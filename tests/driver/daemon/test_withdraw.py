"""Issue 40 item 3: a clean stop. On SIGTERM that is no hand-over the driver deletes its node's ResourceSlices
before it exits (kubelet would wipe them only about 30 s later, and a pod scheduled onto them meanwhile can stay
stuck, kubernetes#141912); in a surge hand-over (another instance of the driver listening on the node) they stay.
The publisher's `withdraw` against a real API server, and two real daemons on one node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.daemon.publisher import slice_publisher
from neuron_dra.driver.kubeletplugin._kube import ApiClientError, ClientOptions
from neuron_dra.driver.kubeletplugin._ratelimit import Rate
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.slices import PublishOptions
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from tests.driver.daemon.test_publisher import ensure_node, foreign_slice, slices, wipe
from tests.localcluster.test_controlplane import mark_ready
from tests.support.driver import DRIVER, NODE, REPO, DaemonDirs, wait_until
from tests.support.fake_apiserver import FakeApiServer, Reply, Seen, ok_json, serve

NODE_OBJECT = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid", "labels": {}}}


def all_slices(api: Any) -> list[dict[str, Any]]:
    items: Any = client.ResourceV1Api(api).list_resource_slice(_preload_content=False)
    return sorted(json.loads(items.data)["items"], key=lambda s: s["metadata"]["name"])


@pytest.mark.cluster
@pytest.mark.process
def test_withdraw_deletes_exactly_this_nodes_slices_of_this_driver_and_publishes_nothing_after(
        api: Any, host_root: Path) -> None:
    ensure_node(api, NODE, {})
    ensure_node(api, "node-b", {})
    wipe(api)
    wipe(api, "node-b")
    metrics = Metrics()
    pub = slice_publisher(api, discover(host_root), NODE, PublishOptions(driver_name=DRIVER), metrics)
    pub.reconcile()
    ours = [s["metadata"]["name"] for s in slices(api)]
    assert len(ours) == 1
    resources = client.ResourceV1Api(api)
    other_driver = foreign_slice(NODE, "other-driver")
    other_driver["spec"]["driver"] = "efa.networking.k8s.aws"
    keep = [foreign_slice("node-b", "other-node"), other_driver, foreign_slice(NODE, "other-pool", pool="pool-x")]
    for s in keep:
        resources.create_resource_slice(s)
    before = {s["metadata"]["name"] for s in all_slices(api)}

    assert pub.withdraw(5.0) == 1
    after = {s["metadata"]["name"] for s in all_slices(api)}
    assert after == before - set(ours)
    assert {"other-node", "other-driver", "other-pool"} <= after
    assert metrics.published_devices._value.get() == 0
    # A health change or the publish loop after the withdrawal publishes nothing: the devices stay withdrawn.
    pub.refresh()
    result, _ = pub.reconcile()
    assert not result.changed
    assert {s["metadata"]["name"] for s in all_slices(api)} == after
    for s in keep:
        resources.delete_resource_slice(s["metadata"]["name"])


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    yield from serve(tmp_path)


@pytest.mark.attacks
@pytest.mark.process
def test_withdraw_against_a_dripping_api_server_ends_by_its_own_deadline(fake_api: FakeApiServer,
                                                                         host_root: Path) -> None:
    """The grace period bounds the stop: every request of the withdrawal gets what is left of its deadline."""
    def script(seen: Seen, reply: Reply) -> bool:
        if seen.target.startswith("/apis/resource.k8s.io/v1/resourceslices"):
            reply.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{")
            reply.drip(b" " * 400, 0.2, fake_api.stop)
            return False
        reply.write(ok_json(NODE_OBJECT))
        return True

    fake_api.script = script
    api = fake_api.client(options=ClientOptions(rate=Rate(1000, 1000), deadline=30))
    pub = slice_publisher(api, discover(host_root), NODE, PublishOptions(driver_name=DRIVER))
    with pytest.raises(ApiClientError, match=r"no complete answer within the request deadline of 1(\.0*)? s|"
                                             r"of 0\.\d+ s"):
        pub.withdraw(1.0)


# --- two real daemons on one node ------------------------------------------------------------------------------

def start_daemon(plane: ControlPlane, dirs: DaemonDirs, host_root: Path, pod_uid: str, log: Path,
                 names: str = "per-instance") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "neuron_dra.driver", "--node-name", NODE, "--kubeconfig", str(plane.kubeconfig),
             "--plugins-dir", str(dirs.plugins), "--registry-dir", str(dirs.registry), "--cdi-root", str(dirs.cdi),
             "--host-root", str(host_root), "--socket-names", names, "--pod-uid", pod_uid],
            stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.terminate()
    assert proc.wait(45) == 0, log.read_text()


@pytest.mark.cluster
@pytest.mark.process
@pytest.mark.parametrize("names", ["per-instance", "plain"])
def test_a_surge_hand_over_keeps_the_slices_and_the_last_instance_withdraws_them(
        api: Any, plane: ControlPlane, dirs: DaemonDirs, host_root: Path, names: str) -> None:
    """Per-instance names (kubelet 1.33+): the new instance listens beside the old one. Plain names (older
    kubelets): the new instance takes the names over, and the old one sees the file it bound replaced."""
    ensure_node(api, NODE, {})
    wipe(api)
    old_uid, new_uid = "0f8fad5b-d9cb-469f-a165-70867728950e", "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    log = dirs.base / "daemons.log"
    old = start_daemon(plane, dirs, host_root, old_uid, log, names)
    new = None
    try:
        first = wait_until(lambda: slices(api), 30, "the old instance's slices")
        new = start_daemon(plane, dirs, host_root, new_uid, log, names)
        wait_until(lambda: log.read_bytes().count(b'"serving"') == 2, 30, "the new instance to serve")
        stop(old, log)  # the DaemonSet stops the old pod once the new one is Ready: a hand-over
        assert [s["metadata"]["uid"] for s in slices(api)] == [s["metadata"]["uid"] for s in first]
        assert b"another instance of the driver serves this node" in log.read_bytes()
        stop(new, log)  # the DaemonSet is deleted: no instance is left to take over
        new = None
        assert slices(api) == [], "withdrawn before the process exited"
        assert b"withdrew this node's devices from scheduling" in log.read_bytes()

        if names == "plain":
            return
        # A claim pod created while no driver runs is not bound to the node; once a driver is back it is.
        pod = claim_pod(api)
        wait_until(lambda: unschedulable(api, pod), 60, "the scheduler to find no device for the pod")
        assert node_of(api, pod) is None
        new = start_daemon(plane, dirs, host_root, new_uid, log, names)
        assert wait_until(lambda: node_of(api, pod), 60, "the pod bound once a driver is back") == NODE
        stop(new, log)
        new = None
    finally:
        for p in (old, new):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


NS = "withdraw-test"
CLASS = "withdraw-test.neuron.aws.com"


def claim_pod(api: Any) -> str:
    """A pod of one Neuron device on NODE (the Node made schedulable, a DeviceClass of the driver, a template)."""
    core: Any = client.CoreV1Api(api)
    res: Any = client.ResourceV1Api(api)
    core.patch_node(NODE, {"metadata": {"labels": {"kubernetes.io/hostname": NODE}}})
    mark_ready(core, NODE)
    res.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
                             "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
    core.create_namespace({"metadata": {"name": NS}})
    wait_until(lambda: any(sa.metadata and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(NS).items), 60, "the default account")
    res.create_namespaced_resource_claim_template(NS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
        "spec": {"spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": CLASS}}]}}}})
    core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": NODE}, "tolerations": [{"operator": "Exists"}],
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": "one"}],
        "containers": [{"name": "c", "image": "example.invalid/none", "resources": {"claims": [{"name": "neuron"}]}}]}})
    return "p"


def _pod(api: Any, name: str) -> dict[str, Any]:
    resp: Any = client.CoreV1Api(api).read_namespaced_pod(name, NS, _preload_content=False)
    doc: dict[str, Any] = json.loads(resp.data)
    return doc


def unschedulable(api: Any, name: str) -> bool:
    """The scheduler found no devices for the pod's claim on any node (the node itself fits: it binds later)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               and "claim" in c.get("message", "") for c in _pod(api, name).get("status", {}).get("conditions") or ())


def node_of(api: Any, name: str) -> str | None:
    node: str | None = _pod(api, name)["spec"].get("nodeName")
    return node
