"""The local control plane: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

Builds the binaries first when they are not cached (minutes on a fresh machine, then seconds).
Verifies: the API serves resource.k8s.io/v1 (create/get/watch ResourceSlices, streaming lists, which
need etcd >= 3.5's progress notifications), the controller-manager and scheduler are healthy and hold
their leader leases, the scheduler allocates a DRA claim that the controller-manager made from a
template, Node authorization + NodeRestriction, bound service-account tokens, that nothing listens
beyond loopback, and that `stop(DIR)` ends every process.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from neuron_dra.localcluster.build import kube_version
from neuron_dra.localcluster.controlplane.plane import BoundObject, ControlPlane, running, stop
from tests.support.e2e import eventually, raw

# Every test here runs a control plane.
pytestmark = pytest.mark.cluster

DRIVER = "neuron.aws.com"
NODE = "cp-test-node"


def admin_https(plane: ControlPlane) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    ctx.load_cert_chain(str(plane.dir / "pki" / "admin.crt"), str(plane.dir / "pki" / "admin.key"))
    return ctx


def get(plane: ControlPlane, url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=admin_https(plane)))
    with opener.open(url, timeout=20) as resp:
        body: bytes = resp.read()
        return body


def watch_events(plane: ControlPlane, url: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in get(plane, url).splitlines() if line.strip()]


# Bodies are plain dicts typed Any: the client sends them as they are (its signatures name model classes).
def resource_slice(name: str, node: str, generation: int = 1, n: int = 4) -> Any:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"neuron-{i}", "attributes": {"index": {"int": i}}} for i in range(n)]}}


def ready_node(name: str) -> Any:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def mark_ready(core: Any, name: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    status: Any = {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    core.patch_node_status(name, status)


def test_serves_the_built_version(plane: ControlPlane) -> None:
    version = json.loads(get(plane, f"{plane.server}/version"))
    assert version["gitVersion"] == kube_version()
    assert plane.kubeconfig == plane.dir / "kubeconfig" and plane.kubeconfig.exists()
    assert plane.server.startswith("https://127.0.0.1:")


def test_controller_manager_and_scheduler_are_healthy_and_lead(plane: ControlPlane, api: Any) -> None:
    for port in (plane.ports.controller_manager, plane.ports.scheduler):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=admin_https(plane)))
        with opener.open(f"https://127.0.0.1:{port}/healthz", timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b"ok"
    coordination = client.CoordinationV1Api(api)

    def leases() -> dict[str, Any]:
        items = raw(coordination.list_namespaced_lease("kube-system", _preload_content=False))["items"]
        return {i["metadata"]["name"]: i["spec"] for i in items if i["spec"].get("holderIdentity")}

    held: Any = eventually(lambda: {"kube-controller-manager", "kube-scheduler"} <= leases().keys() and leases(),
                      what="leader leases of the controller-manager and scheduler")
    first = {k: held[k]["renewTime"] for k in ("kube-controller-manager", "kube-scheduler")}
    # Leases are renewed every 2 s by default: a renewal proves the components are alive, not just started.
    eventually(lambda: all(leases()[k]["renewTime"] != first[k] for k in first), 20, what="lease renewals")


def test_node_and_resource_slice_create_get_watch(api: Any) -> None:
    core = client.CoreV1Api(api)
    res = client.ResourceV1Api(api)
    core.create_node(ready_node(NODE))
    res.create_resource_slice(resource_slice(f"{NODE}-neuron", NODE))
    got: Any = raw(res.read_resource_slice(f"{NODE}-neuron", _preload_content=False))
    assert [d["name"] for d in got["spec"]["devices"]] == [f"neuron-{i}" for i in range(4)]
    listed = raw(res.list_resource_slice(field_selector=f"spec.nodeName={NODE}", _preload_content=False))
    assert [i["metadata"]["name"] for i in listed["items"]] == [f"{NODE}-neuron"]

    # A watch from the list's resourceVersion sees a later update.
    got["spec"]["pool"]["generation"] = 2
    res.replace_resource_slice(f"{NODE}-neuron", got)
    w = watch.Watch()
    events = []
    for event in w.stream(res.list_resource_slice, resource_version=listed["metadata"]["resourceVersion"],
                          timeout_seconds=10, _preload_content=False):
        events.append((event["type"], event["raw_object"]["spec"]["pool"]["generation"]))
        w.stop()
    assert events == [("MODIFIED", 2)]


def test_streaming_list_needs_and_has_watch_progress(plane: ControlPlane) -> None:
    """sendInitialEvents fails with etcd 3.4 ("RequestWatchProgress is disabled"); see localcluster/BUILD.md."""
    url = (f"{plane.server}/apis/resource.k8s.io/v1/resourceslices?watch=1&sendInitialEvents=true"
           "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=3")
    events = watch_events(plane, url)
    # The initial events end with a bookmark annotated initial-events-end (later periodic bookmarks may follow).
    ends = [i for i, e in enumerate(events) if e["type"] == "BOOKMARK"
            and (e["object"]["metadata"].get("annotations") or {}).get("k8s.io/initial-events-end") == "true"]
    assert ends, events
    assert all(e["type"] in ("ADDED", "BOOKMARK") for e in events[: ends[0] + 1]), events


def test_scheduler_allocates_a_claim_made_from_a_template(api: Any) -> None:
    core = client.CoreV1Api(api)
    res = client.ResourceV1Api(api)
    node = "cp-dra-node"
    core.create_node(ready_node(node))
    mark_ready(core, node)
    res.create_resource_slice(resource_slice(f"{node}-neuron", node, n=8))
    device_class: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": "cp-test.neuron.aws.com"},
                         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}
    res.create_device_class(device_class)
    ns = "cp-test"
    namespace: Any = {"metadata": {"name": ns}}
    core.create_namespace(namespace)
    # Pods are refused until kube-controller-manager has made the namespace's default service account.
    deadline = time.monotonic() + 60
    while not any(sa.metadata and sa.metadata.name == "default"
                  for sa in core.list_namespaced_service_account(ns).items):
        assert time.monotonic() < deadline, "no default service account in 60 s"
        time.sleep(0.2)
    template: Any = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "two"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "neurons", "exactly": {"deviceClassName": "cp-test.neuron.aws.com", "count": 2}}]}}}}
    res.create_namespaced_resource_claim_template(ns, template)
    pod: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": "two"}],
        "containers": [{"name": "c", "image": "example.invalid/none", "resources": {"claims": [{"name": "neuron"}]}}]}}
    core.create_namespaced_pod(ns, pod)

    def bound() -> dict[str, Any] | None:
        p = raw(core.read_namespaced_pod("p", ns, _preload_content=False))
        return p if p["spec"].get("nodeName") else None

    p = eventually(bound, 90, what="the scheduler to bind the pod")
    assert p["spec"]["nodeName"] == node
    (status,) = p["status"]["resourceClaimStatuses"]  # written by the controller-manager's claim controller
    claim = raw(res.read_namespaced_resource_claim(status["resourceClaimName"], ns, _preload_content=False))
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["pool"] for r in results} == {node}
    assert all(r["driver"] == DRIVER and r["request"] == "neurons" for r in results)
    assert claim["metadata"]["ownerReferences"][0]["name"] == "p"


def test_minted_node_identity_is_restricted(plane: ControlPlane) -> None:
    from kubernetes import config

    kubeconfig = plane.client_kubeconfig(f"system:node:{NODE}", ["system:nodes"])
    node_api = config.new_client_from_config(str(kubeconfig))
    try:
        core = client.CoreV1Api(node_api)
        assert raw(core.read_node(NODE, _preload_content=False))["metadata"]["name"] == NODE
        with pytest.raises(ApiException) as denied:
            patch: Any = {"metadata": {"labels": {"x": "y"}}}
            core.patch_node("cp-dra-node", patch)
        assert denied.value.status == 403  # NodeRestriction: a node may modify only itself
    finally:
        node_api.close()


def test_bound_service_account_token_carries_the_node(plane: ControlPlane, api: Any) -> None:
    from kubernetes import config

    core = client.CoreV1Api(api)
    token = plane.service_account_token("cp-sa", "driver")  # creates namespace and service account
    pod: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "driver"},
                "spec": {"nodeName": NODE, "serviceAccountName": "driver",
                         "containers": [{"name": "c", "image": "example.invalid/none"}]}}
    created = raw(core.create_namespaced_pod("cp-sa", pod, _preload_content=False))
    bound = plane.service_account_token("cp-sa", "driver", bound_object=BoundObject(
        "Pod", "driver", created["metadata"]["uid"]))
    for tok, node in ((token, None), (bound, NODE)):
        kubeconfig = plane.token_kubeconfig(tok, "driver", plane.dir / "kubeconfigs" / "driver-test.kubeconfig")
        sa_api = config.new_client_from_config(str(kubeconfig))
        try:
            review: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            info = raw(client.AuthenticationV1Api(sa_api).create_self_subject_review(
                review, _preload_content=False))["status"]["userInfo"]
        finally:
            sa_api.close()
        assert info["username"] == "system:serviceaccount:cp-sa:driver"
        assert info.get("extra", {}).get("authentication.kubernetes.io/node-name") == ([node] if node else None)


def listening_addresses(pids: list[int]) -> list[str]:
    """Local addresses of the LISTEN TCP sockets that the given processes hold (from /proc)."""
    inodes = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(fields[1])
    return addresses


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_nothing_listens_beyond_loopback(plane: ControlPlane) -> None:
    pids = [c for p in plane.processes for c in children(p.popen.pid)]
    assert len(pids) == 4
    addresses = listening_addresses(pids)
    # etcd client + peer, apiserver, controller-manager, scheduler.
    assert len(addresses) == 5, addresses
    loopback_v4 = "0100007F"  # 127.0.0.1 in /proc/net/tcp's little-endian hex
    assert all(a.split(":")[0] == loopback_v4 for a in addresses), addresses


def test_stop_dir_ends_every_process(tmp_path: Path) -> None:
    with ControlPlane.start(tmp_path / "cp2", max_lifetime_s=600) as cp:
        assert sorted(running(cp.dir)) == sorted(["etcd", "kube-apiserver", "kube-controller-manager",
                                                  "kube-scheduler"])
        pids = [p.popen.pid for p in cp.processes]
        assert stop(cp.dir) is True  # from the pid files, as another process would
        assert running(cp.dir) == []
        for p in cp.processes:
            p.popen.wait(5)
        assert not any(Path(f"/proc/{pid}").exists() and p.popen.poll() is None
                       for pid, p in zip(pids, cp.processes, strict=True))
    assert stop(cp.dir) is False


def test_processes_die_at_their_max_lifetime(tmp_path: Path) -> None:
    """The bound holds without anyone calling stop: each process runs under `timeout`."""
    cp = ControlPlane.start(tmp_path / "cp3", max_lifetime_s=20)
    try:
        assert len(running(cp.dir)) == 4
        eventually(lambda: not running(cp.dir), 45, what="processes to reach their lifetime")
        # timeout's exit status, or SIGKILL from its --kill-after when a process (the 1.36 apiserver under
        # load, with etcd going away at the same moment) takes more than 10 s to stop after TERM.
        assert all(p.popen.wait(5) in (124, -9) for p in cp.processes)
    finally:
        cp.stop()
