"""The objects `neuron-dra plan -o yaml` prints, against the real kube-apiserver of the local control plane.

Everything the default stack applies (driver objects including the DaemonSet, and the claim templates) is
created for real: the API server's own validation and admission run, and the admission policy's CEL is compiled
and type-checked there. Then the driver's service account, with a token bound to a pod on a node (as the
DaemonSet's pods get), meets the RBAC and the node-restricting policy: its own node's slices are allowed, any
other node's are denied, and nothing beyond the kubelet-plugin minimum is granted.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from neuron_dra.components import plan
from neuron_dra.driver import deploy
from neuron_dra.localcluster.controlplane.plane import BoundObject, ControlPlane

# Every test here runs a control plane.
pytestmark = pytest.mark.cluster

NODE = "trn2-node-a"
OTHER = "trn2-node-b"
IMAGE = "registry.example.com/neuron-dra-driver:0.1.0"


@pytest.fixture(scope="module")
def planned(api: Any) -> list[dict[str, Any]]:
    run = plan.plan({"neuron-dra:driverImage": IMAGE})
    manifests: list[dict[str, Any]] = plan.kubernetes_manifests(run)
    dyn = dynamic.DynamicClient(api)
    for m in manifests:
        resource = dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])
        kwargs = {"namespace": m["metadata"].get("namespace", "default")} if resource.namespaced else {}
        resource.create(body=m, **kwargs)
    return manifests


def test_the_real_apiserver_accepts_every_planned_object(api: Any, planned: list[dict[str, Any]]) -> None:
    dyn = dynamic.DynamicClient(api)
    kinds = [m["kind"] for m in planned]
    # The driver's and neuron-monitor's (on by default; its admin-access claim template accepted in the labelled
    # namespace: docs/utilisation.md §3).
    assert kinds.count("DaemonSet") == 2 and kinds.count("ResourceClaimTemplate") >= 9
    for m in planned:
        resource = dyn.resources.get(api_version=m["apiVersion"], kind=m["kind"])
        kwargs = {"namespace": m["metadata"]["namespace"]} if resource.namespaced else {}
        stored = resource.get(name=m["metadata"]["name"], **kwargs).to_dict()
        assert m["metadata"].get("labels", {}).items() <= (stored["metadata"].get("labels") or {}).items()
    ds = dyn.resources.get(api_version="apps/v1", kind="DaemonSet").get(
        name=deploy.DEFAULT_DAEMONSET, namespace=deploy.DEFAULT_NAMESPACE).to_dict()
    mounts = {m["name"]: m for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["host-sys"]["recursiveReadOnly"] == "IfPossible"
    # The API server type-checks the policy's CEL and reports problems in its status.
    policy_api = dyn.resources.get(api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy")
    name = deploy.DriverDeployOptions().admission_policy_name
    deadline = time.monotonic() + 30
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = policy_api.get(name=name).to_dict().get("status") or {}
        if "typeChecking" in status:
            break
        time.sleep(0.5)
    assert "typeChecking" in status, status
    assert not (status["typeChecking"] or {}).get("expressionWarnings"), status


def driver_client(plane: ControlPlane, api: Any, node: str | None) -> Any:
    """An API client with the driver service account's token, bound to a pod on `node` (or unbound)."""
    options = deploy.DriverDeployOptions()
    bound = None
    if node is not None:
        pod: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"driver-{node}"},
                    "spec": {"nodeName": node, "serviceAccountName": options.service_account,
                             "containers": [{"name": "c", "image": IMAGE}]}}
        core = client.CoreV1Api(api)
        try:
            created = core.create_namespaced_pod(options.namespace, pod)
        except ApiException as e:  # an earlier test of the module made it
            if e.status != 409:
                raise
            created = core.read_namespaced_pod(f"driver-{node}", options.namespace)
        assert created.metadata is not None and created.metadata.name and created.metadata.uid
        bound = BoundObject("Pod", created.metadata.name, created.metadata.uid)
    token = plane.service_account_token(options.namespace, options.service_account, bound_object=bound,
                                        create=False)
    path = plane.dir / "kubeconfigs" / f"driver-{node or 'unbound'}.kubeconfig"
    return config.new_client_from_config(str(plane.token_kubeconfig(token, "driver", path)))


def resource_slice(node: str | None, name: str, driver: str = "neuron.aws.com") -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": node or "shared", "generation": 1,
                                                                 "resourceSliceCount": 1}, "devices": []}
    spec.update({"nodeName": node} if node else {"allNodes": True})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def status_of(call: Any) -> tuple[int, str]:
    try:
        call()
    except ApiException as e:
        return e.status, json.loads(e.body or "{}").get("message", "")
    return 200, ""


def test_rbac_and_the_node_restriction_hold_for_the_drivers_identity(plane: ControlPlane, api: Any,
                                                                      planned: list[dict[str, Any]]) -> None:
    driver = driver_client(plane, api, NODE)
    unbound = driver_client(plane, api, None)
    try:
        slices = dynamic.DynamicClient(driver).resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
        # Its own node: create, update, list/watch, delete.
        created = slices.create(body=resource_slice(NODE, "own"))
        assert created.spec.nodeName == NODE
        body = resource_slice(NODE, "own")
        body["metadata"]["resourceVersion"] = created.metadata.resourceVersion
        body["spec"]["pool"]["generation"] = 2
        slices.replace(body=body)
        assert [s.metadata.name for s in slices.get().items] == ["own"]
        # Another node's slice, or a slice for no node: denied by the admission policy, with its message.
        code, message = status_of(lambda: slices.create(body=resource_slice(OTHER, "other")))
        assert code == 403 and f"may not modify ResourceSlices of node {OTHER}" in message
        code, message = status_of(lambda: slices.create(body=resource_slice(None, "all")))
        assert code == 403 and "ResourceSlices without a node" in message
        slices.delete(name="own")
        # A token not bound to a pod on a node may not write slices at all.
        unbound_slices = dynamic.DynamicClient(unbound).resources.get(api_version="resource.k8s.io/v1",
                                                                      kind="ResourceSlice")
        code, message = status_of(lambda: unbound_slices.create(body=resource_slice(NODE, "unbound")))
        assert code == 403 and "bound to a pod on a node" in message

        # RBAC: exactly the kubelet-plugin minimum.
        core = client.CoreV1Api(driver)
        assert status_of(lambda: core.read_node(NODE))[0] == 404  # allowed (the node object does not exist)
        assert status_of(lambda: core.list_node())[0] == 403
        assert status_of(lambda: core.list_namespaced_pod("default"))[0] == 403
        claims = dynamic.DynamicClient(driver).resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        assert status_of(lambda: claims.get(name="missing", namespace="default"))[0] == 404  # get: allowed
        assert status_of(lambda: claims.get(namespace="default"))[0] == 403  # list: not granted
        assert status_of(lambda: claims.patch(name="missing", namespace="default", body={},
                                              content_type="application/merge-patch+json"))[0] == 403
    finally:
        driver.close()
        unbound.close()


def test_the_drivers_identity_may_write_only_its_own_drivers_slices(plane: ControlPlane, api: Any,
                                                                    planned: list[dict[str, Any]]) -> None:
    """Issue 14 item 2: node A's token could patch or delete node A's EFA slice and create slices of other drivers
    on node A. Now the policy checks spec.driver as well (oldObject for DELETE, both for UPDATE)."""
    admin = dynamic.DynamicClient(api).resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    admin.create(body=resource_slice(NODE, "efa-a", driver="efa.amazonaws.com"))
    admin.create(body=resource_slice(OTHER, "neuron-b"))
    driver = driver_client(plane, api, NODE)
    try:
        slices = dynamic.DynamicClient(driver).resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
        for other_driver in ("gpu.nvidia.com", "dra.net", "efa.amazonaws.com"):
            code, message = status_of(lambda d=other_driver: slices.create(
                body=resource_slice(NODE, f"x-{d.replace('.', '-')}", driver=d)))
            assert code == 403 and f"may not modify ResourceSlices of driver {other_driver}" in message, message
        efa = admin.get(name="efa-a")
        body = resource_slice(NODE, "efa-a", driver="efa.amazonaws.com")
        body["metadata"]["resourceVersion"] = efa.metadata.resourceVersion
        body["spec"]["pool"]["generation"] = 5
        code, message = status_of(lambda: slices.replace(body=body))
        assert code == 403 and "of driver efa.amazonaws.com" in message, message
        code, message = status_of(lambda: slices.patch(name="efa-a", body={"spec": {"pool": {"generation": 6}}},
                                                       content_type="application/merge-patch+json"))
        assert code == 403, message  # patch is not even granted
        code, message = status_of(lambda: slices.delete(name="efa-a"))
        assert code == 403 and "of driver efa.amazonaws.com" in message, message
        # DELETE is judged by the old object: another node's slice of our own driver stays.
        code, message = status_of(lambda: slices.delete(name="neuron-b"))
        assert code == 403 and f"ResourceSlices of node {OTHER}" in message, message
        assert admin.get(name="efa-a").spec.pool.generation == 1
        assert admin.get(name="neuron-b").metadata.name == "neuron-b"
        # Its own driver on its own node still works end to end.
        slices.create(body=resource_slice(NODE, "own-2"))
        slices.delete(name="own-2")
    finally:
        driver.close()
        admin.delete(name="efa-a")
        admin.delete(name="neuron-b")
