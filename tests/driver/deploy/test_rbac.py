"""Issue 14 item 11: the RBAC grants exactly what the daemon calls.

Every API call of the driver goes through `KubeApi.request` (kube.py). Here the daemon's API-facing parts
(publisher: create, update, delete, list, watch; claim lookup; device health events) run against the real
kube-apiserver with the driver's own identity (a token bound to a pod on the node, the deployed ClusterRole
and admission policy), every call is recorded, and the (group, resource, verb) set must equal the ClusterRole's:
nothing used is missing (no call is refused) and nothing granted is unused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver import deploy
from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.daemon.health.reporting import HealthReporter
from neuron_dra.driver.daemon.publisher import slice_publisher
from neuron_dra.driver.kubeletplugin._kube import ApiException as DriverApiException
from neuron_dra.driver.kubeletplugin._kube import KubeApi, KubeClaimLookup
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.health_source import DeviceHealth, Health
from neuron_dra.driver.model.slices import PublishOptions
from neuron_dra.localcluster.controlplane.plane import BoundObject, ControlPlane
from tests.support.driver import DRIVER, wait_until

pytestmark = pytest.mark.cluster

NODE = "rbac-node"
Access = tuple[str, str, str]  # (API group, resource, verb)
_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def access_of(method: str, path: str, query: Mapping[str, Any] | None) -> Access:
    """The RBAC (group, resource, verb) the API server checks for one request."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    else:  # /apis/<group>/<version>/...
        group, rest = parts[1], parts[3:]
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if method == "GET":
        verb = "get" if named else ("watch" if (query or {}).get("watch") == "true" else "list")
    else:
        verb = _METHOD_VERBS[method]
    return group, resource, verb


def test_access_of_maps_requests_like_the_api_server() -> None:
    assert access_of("GET", "/api/v1/nodes/n", None) == ("", "nodes", "get")
    assert access_of("GET", "/apis/resource.k8s.io/v1/resourceslices", {"watch": "true"}) == (
        "resource.k8s.io", "resourceslices", "watch")
    assert access_of("GET", "/apis/resource.k8s.io/v1/resourceslices", {}) == (
        "resource.k8s.io", "resourceslices", "list")
    assert access_of("PUT", "/apis/resource.k8s.io/v1/resourceslices/x", None)[2] == "update"
    assert access_of("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c", None) == (
        "resource.k8s.io", "resourceclaims", "get")
    assert access_of("POST", "/api/v1/namespaces/default/events", None) == ("", "events", "create")


def granted() -> set[Access]:
    return {(g, r, v) for rule in deploy.RBAC_RULES for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


@pytest.fixture(scope="module")
def driver_api(plane: ControlPlane, api: Any) -> Iterator[client.ApiClient]:
    """An API client with the deployed identity: RBAC and admission policy applied, token bound to a pod on NODE."""
    options = deploy.DriverDeployOptions()
    dyn = dynamic.DynamicClient(api)
    for m in deploy.manifests(options):
        if m["kind"] == "DaemonSet":
            continue
        resource = dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])
        kwargs = {"namespace": m["metadata"]["namespace"]} if resource.namespaced else {}
        try:
            resource.create(body=m, **kwargs)
        except ApiException as e:
            if e.status != 409:
                raise
    core = client.CoreV1Api(api)
    node: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
    core.create_node(node)
    pod: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "driver-rbac"},
                "spec": {"nodeName": NODE, "serviceAccountName": options.service_account,
                         "containers": [{"name": "c", "image": "example.com/x:1"}]}}
    wait_until(lambda: _create_pod(core, options.namespace, pod), 30, "the driver's service account")
    created = core.read_namespaced_pod("driver-rbac", options.namespace)
    assert created.metadata is not None and created.metadata.uid
    token = plane.service_account_token(options.namespace, options.service_account, create=False,
                                        bound_object=BoundObject("Pod", "driver-rbac", created.metadata.uid))
    path = plane.dir / "kubeconfigs" / "driver-rbac.kubeconfig"
    driver = config.new_client_from_config(str(plane.token_kubeconfig(token, "driver", path)))
    yield driver
    driver.close()


def _create_pod(core: client.CoreV1Api, namespace: str, pod: Any) -> bool:
    try:
        core.create_namespaced_pod(namespace, pod)
    except ApiException as e:
        if e.status == 409:
            return True
        if e.status == 403:  # the service account does not exist yet
            return False
        raise
    return True


def test_rbac_grants_exactly_the_calls_the_daemon_makes(driver_api: Any, api: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Access, int]] = []
    original = KubeApi.request

    def recording(self: KubeApi, method: str, path: str, **kw: Any) -> Any:
        access = access_of(method, path, kw.get("query"))
        try:
            response = original(self, method, path, **kw)
        except DriverApiException as e:
            calls.append((access, int(e.status or 0)))
            raise
        calls.append((access, 200))
        return response

    monkeypatch.setattr(KubeApi, "request", recording)
    host_root = emulate("trn2.48xlarge", tmp_path / "host")
    host = discover(host_root)
    res = client.ResourceV1Api(api)

    # Publishing: create, then an extra slice of ours appears (deleted), then our slice is edited (updated),
    # with the watch running in the loop.
    pub = slice_publisher(driver_api, host, NODE, PublishOptions(driver_name=DRIVER), resync_seconds=5)
    stop = threading.Event()
    thread = pub.start(stop)
    try:
        assert pub.published.wait(20)
        extra: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "rbac-extra"},
                      "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 0,
                                                                             "resourceSliceCount": 1},
                               "devices": []}}
        res.create_resource_slice(extra)

        def ours() -> list[Any]:
            return [s for s in res.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
                    if s.spec.pool.name == NODE]

        # One of the two is obsolete and deleted, the other updated to the full pool.
        wait_until(lambda: len(ours()) == 1 and len(ours()[0].spec.devices or ()) == 16, 20, "one slice of 16 devices")
        [own] = ours()
        own.spec.devices = own.spec.devices[:2]  # someone edits it: updated back
        res.replace_resource_slice(own.metadata.name, own)
        wait_until(lambda: len(ours()[0].spec.devices or ()) == 16, 20, "the edited slice restored")
        time.sleep(1)
    finally:
        stop.set()
        thread.join(timeout=30)

    # prepare's claim GET (a missing claim is a 404, which RBAC allowed).
    assert KubeClaimLookup(driver_api).get("default", "no-such-claim") is None
    # A device health event on the Node.
    monitor = HealthMonitor(host_root, [d.index for d in host.devices])
    reporter = HealthReporter(monitor, host, NODE, DRIVER, "NoSchedule", api=driver_api)
    reporter.on_change({0: DeviceHealth(0, Health.UNHEALTHY, {"sram_ecc_uncorrected": 1}, "test", time.time())})
    events = client.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={NODE}")
    assert any(e.reason == "DeviceUnhealthy" for e in events.items)

    refused = sorted({a for a, status in calls if status in (401, 403)})
    used = {a for a, _ in calls}
    print(f"recorded {len(calls)} API calls of the driver: {sorted(used)}")
    assert refused == [], f"calls the RBAC refuses: {refused}"
    assert used == granted(), f"granted but never used: {sorted(granted() - used)}; used but not granted: " \
                              f"{sorted(used - granted())}"
