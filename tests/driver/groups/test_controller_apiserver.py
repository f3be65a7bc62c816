"""The UltraServer group controller against a real kube-apiserver (the module's control plane), with its own
identity: a service account token, the deployed RBAC and admission policy (driver/deploy/ultraserver.py).

Nodes and the nodes' slices are created as the node drivers would publish them (the daemon's own model); the
controller's passes are run one by one, so every assertion follows a completed pass, never a wait on time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.deploy import ultraserver as deploy_us
from neuron_dra.driver.groups.controller import ControllerOptions, GroupController
from neuron_dra.driver.groups.lease import LeaderElector, LeaseOptions
from neuron_dra.driver.kubeletplugin.toolkit import RESOURCE_SLICES, ApiException, KubeApi, api_client
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.emulate import EmulationOptions
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.k8s_names import ultraserver_label_keys
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices
from neuron_dra.localcluster.controlplane.plane import ControlPlane

pytestmark = pytest.mark.cluster

DRIVER = "neuron.aws.com"
OPTIONS = deploy_us.UltraServerControllerOptions()
NS = OPTIONS.namespace
# Names that say nothing about membership: the class-file ids decide.
WHOLE, PAIR = ultraserver_label_keys(DRIVER)
FOUR = (("zeta", 2), ("alpha", 0), ("us-b-0", 3), ("mid", 1))
TWO = (("us-a-0", 0), ("us-a-1", 1))

_PATHS = {"ServiceAccount": f"/api/v1/namespaces/{NS}/serviceaccounts",
          "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
          "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
          "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles",
          "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings",
          "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
          "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
          "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses"}


@pytest.fixture(scope="module")
def admin(plane: ControlPlane) -> Iterator[KubeApi]:
    client = api_client(str(plane.kubeconfig))
    yield KubeApi(client)
    client.close()


@pytest.fixture(scope="module")
def controller_api(plane: ControlPlane, admin: KubeApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    """The controller's identity with its deployed RBAC and admission policy."""
    admin.call("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    for obj in deploy_us.manifests(OPTIONS):
        if obj["kind"] in _PATHS:
            admin.call("POST", _PATHS[obj["kind"]], body=obj)
    token = plane.service_account_token(NS, OPTIONS.name, create=False)
    path = plane.token_kubeconfig(token, OPTIONS.service_account_user,
                                  Path(tmp_path_factory.mktemp("sa")) / "kubeconfig")
    client = api_client(str(path))
    yield KubeApi(client)
    client.close()


def heartbeat(admin: KubeApi, name: str) -> None:
    """The Node, Ready now (created if missing): no kubelet runs here, so the test reports for it. The node
    lifecycle controller writes the Node too (its taints): a conflict reads it again."""
    for _ in range(20):
        try:
            node = admin.call("GET", f"/api/v1/nodes/{name}")
        except ApiException as e:
            assert e.status == 404
            node = admin.call("POST", "/api/v1/nodes", body={"metadata": {
                "name": name, "labels": {"kubernetes.io/hostname": f"host-{name}"}}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                          "lastHeartbeatTime": now, "lastTransitionTime": now}]}
        try:
            admin.call("PUT", f"/api/v1/nodes/{name}/status", body=node)
            return
        except ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError(f"Node {name}: status conflicted 20 times in a row")


def publish_node(admin: KubeApi, name: str, host_id: str, position: int, mode: int) -> None:
    host = emulated_host("trn2u.48xlarge", EmulationOptions(host_id=host_id, ultraserver_node=position,
                                                            ultraserver_mode=mode))
    for s in resource_slices(build_pool(host, NodeFacts(name)), generation=1):
        admin.call("POST", RESOURCE_SLICES, body=s)


def unpublish_node(admin: KubeApi, name: str) -> None:
    for s in admin.list(RESOURCE_SLICES, query={"fieldSelector": f"spec.nodeName={name}"})["items"]:
        admin.call("DELETE", f"{RESOURCE_SLICES}/{s['metadata']['name']}")


def groups(admin: KubeApi) -> dict[str, dict[str, Any]]:
    """The group slices by name (with shared counters a 4-node set's pool has four)."""
    items = admin.list(RESOURCE_SLICES, query={"fieldSelector": f"spec.driver={DRIVER}"})["items"]
    return {s["metadata"]["name"]: s for s in items if us.is_group_slice(s, DRIVER)}


def device_slices(admin: KubeApi) -> dict[tuple[str, ...], dict[str, Any]]:
    """The group slices with a device, by the members they select."""
    return {tuple(members(s)): s for s in groups(admin).values() if "sharedCounters" not in s["spec"]}


def members(s: dict[str, Any]) -> list[str]:
    """The member names a group slice selects (the Nodes here carry hostname labels `host-<name>`)."""
    return [h.removeprefix("host-") for h in us.selected_nodes(s["spec"]["nodeSelector"])]


def beat_all(admin: KubeApi) -> None:
    for name, _ in (*FOUR, *TWO):
        heartbeat(admin, name)


def test_the_controller_publishes_one_group_per_ultraserver_and_keeps_it_true(admin: KubeApi,
                                                                              controller_api: KubeApi) -> None:
    beat_all(admin)
    for name, pos in FOUR:
        publish_node(admin, name, "us-a", pos, 4)
    for name, pos in TWO:
        publish_node(admin, name, "us-b", pos, 2)
    controller = GroupController(controller_api, ControllerOptions(DRIVER, shared_counters="auto"))
    first = controller.reconcile()
    # 1.36 serves shared counters: the 4-node set's pool is its counter slice, the whole's and the two halves'.
    assert controller.counters_served
    assert (first.created, first.updated, first.deleted, first.problems) == (5, 0, 0, ())
    stored = groups(admin)
    by_members = device_slices(admin)
    assert set(by_members) == {("alpha", "mid", "us-b-0", "zeta"), ("alpha", "mid"), ("us-b-0", "zeta"),
                               ("us-a-0", "us-a-1")}
    four = by_members["alpha", "mid", "us-b-0", "zeta"]
    assert "nodeName" not in four["spec"]
    assert four["spec"]["devices"][0]["attributes"]["nodeCount"] == {"int": 4}
    pool = four["spec"]["pool"]["name"]
    in_pool = [s for s in stored.values() if s["spec"]["pool"]["name"] == pool]
    assert len(in_pool) == 4 and {s["spec"]["pool"]["resourceSliceCount"] for s in in_pool} == {4}
    (counter,) = [s for s in in_pool if "sharedCounters" in s["spec"]]  # kept by the API server
    assert sorted(counter["spec"]["sharedCounters"][0]["counters"]) == [f"node-{i}" for i in range(4)]
    assert sorted(by_members["us-b-0", "zeta"]["spec"]["devices"][0]["consumesCounters"][0]["counters"]) == [
        "node-2", "node-3"]
    versions = {p: s["metadata"]["resourceVersion"] for p, s in stored.items()}

    # Nothing changed: nothing written, by this controller or by a restarted one.
    beat_all(admin)
    assert controller.reconcile().writes == 0
    assert GroupController(controller_api, ControllerOptions(DRIVER, shared_counters="auto")).reconcile().writes == 0
    assert {p: s["metadata"]["resourceVersion"] for p, s in groups(admin).items()} == versions

    # A member's driver is gone (kubelet wiped its slices): the group and its half are tainted, still naming it.
    unpublish_node(admin, "zeta")
    beat_all(admin)
    restarted = GroupController(controller_api, ControllerOptions(DRIVER, shared_counters="auto"))
    gone = restarted.reconcile()
    # the whole and zeta's half are tainted; their pool is written whole at its next generation, the 2-node
    # UltraServer's pool not at all
    assert (gone.updated, gone.created, gone.deleted) == (4, 0, 0)
    after = groups(admin)
    four = after[four["metadata"]["name"]]
    assert members(four) == ["alpha", "mid", "us-b-0", "zeta"]
    (taint,) = four["spec"]["devices"][0]["taints"]
    assert taint["key"] == f"{DRIVER}/member-missing" and taint["timeAdded"]  # 1.36 serves device taints
    assert {s["spec"]["pool"]["generation"] for s in after.values() if s["spec"]["pool"]["name"] == pool} == {2}
    assert "taints" not in device_slices(admin)["alpha", "mid"]["spec"]["devices"][0]
    assert {n: s["metadata"]["resourceVersion"] for n, s in after.items() if s["spec"]["pool"]["name"] != pool} == {
        n: v for n, v in versions.items() if stored[n]["spec"]["pool"]["name"] != pool}
    assert restarted.reconcile().writes == 0  # the stored taint time is not a difference

    # Back: cleared.
    publish_node(admin, "zeta", "us-a", 2, 4)
    beat_all(admin)
    back = restarted.reconcile()
    assert back.updated == 4 and "taints" not in groups(admin)[four["metadata"]["name"]]["spec"]["devices"][0]


def test_members_carry_their_ultraserver_labels_and_the_node_policy_bounds_the_patch(
        admin: KubeApi, controller_api: KubeApi) -> None:
    beat_all(admin)
    controller = GroupController(controller_api, ControllerOptions(DRIVER, shared_counters="auto"))
    controller.reconcile()  # labels whatever the earlier passes left to do
    labels = {n: admin.call("GET", f"/api/v1/nodes/{n}")["metadata"].get("labels", {}) for n, _ in (*FOUR, *TWO)}
    by_members = device_slices(admin)
    four = by_members["alpha", "mid", "us-b-0", "zeta"]["spec"]["devices"][0]["attributes"]
    half = by_members["alpha", "mid"]["spec"]["devices"][0]["attributes"]
    two = by_members["us-a-0", "us-a-1"]["spec"]["devices"][0]["attributes"]
    for name, _ in FOUR:
        assert labels[name][WHOLE] == four["ultraserverServerId"]["string"]
    assert labels["alpha"][PAIR] == labels["mid"][PAIR] == half["ultraserverServerId"]["string"]
    assert labels["zeta"][PAIR] == labels["us-b-0"][PAIR] != labels["alpha"][PAIR]
    for name, _ in TWO:
        assert labels[name][WHOLE] == labels[name][PAIR] == two["ultraserverServerId"]["string"]
    assert controller.reconcile().labelled == 0  # patched only when something changes

    # The policy: the controller's account may change those labels, nothing else of a Node.
    path = "/api/v1/nodes/alpha"
    for refused in ({"metadata": {"labels": {"team": "ml"}}},
                    {"metadata": {"labels": {us.HOSTNAME_LABEL: "elsewhere"}}},
                    {"metadata": {"annotations": {"a": "b"}}},
                    {"metadata": {"labels": {WHOLE: "moved"}, "annotations": {"a": "b"}}},
                    {"spec": {"unschedulable": True}},
                    {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}):
        with pytest.raises(ApiException) as e:
            controller_api.merge_patch(path, refused)
        assert e.value.status == 403 and "may only change the labels" in e.value.body, refused
    with pytest.raises(ApiException) as e:  # RBAC: no status, no delete, no create
        controller_api.merge_patch(f"{path}/status", {"status": {"conditions": []}})
    assert e.value.status == 403
    with pytest.raises(ApiException) as e:
        controller_api.call("DELETE", path)
    assert e.value.status == 403
    controller_api.merge_patch(path, {"metadata": {"labels": {WHOLE: "moved", PAIR: None}}})
    after = admin.call("GET", path)["metadata"]["labels"]
    assert after[WHOLE] == "moved" and PAIR not in after
    admin.merge_patch(path, {"metadata": {"annotations": {"a": "b"}}})  # others are not bound by it
    fixed = controller.reconcile()  # a wrong value is corrected, a missing one restored
    assert fixed.labelled == 1 and admin.call("GET", path)["metadata"]["labels"] == labels["alpha"]


def test_the_admission_policy_keeps_the_controller_off_node_slices(admin: KubeApi, controller_api: KubeApi) -> None:
    node_slice = admin.list(RESOURCE_SLICES, query={"fieldSelector": "spec.nodeName=alpha"})["items"][0]
    node_slice["spec"]["devices"] = []
    with pytest.raises(ApiException) as e:
        controller_api.call("PUT", f"{RESOURCE_SLICES}/{node_slice['metadata']['name']}", body=node_slice)
    assert e.value.status == 403 and "may only write" in e.value.body
    with pytest.raises(ApiException) as e:
        controller_api.call("DELETE", f"{RESOURCE_SLICES}/{node_slice['metadata']['name']}")
    assert e.value.status == 403


def test_a_group_a_claim_holds_is_kept_with_an_event_until_released(admin: KubeApi, controller_api: KubeApi) -> None:
    beat_all(admin)
    controller = GroupController(controller_api, ControllerOptions(DRIVER, shared_counters="auto"))
    controller.reconcile()
    held = next(n for n, s in groups(admin).items() if members(s) == ["us-a-0", "us-a-1"])
    pool = groups(admin)[held]["spec"]["pool"]["name"]
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    claim = admin.call("POST", claims, body={"metadata": {"name": "job"}, "spec": {"devices": {"requests": [
        {"name": "ultraserver", "exactly": {"deviceClassName": f"ultraserver.{DRIVER}"}}]}}})
    pod = admin.call("POST", "/api/v1/namespaces/default/pods", body={
        "metadata": {"name": "job-0"},
        "spec": {"nodeName": "us-a-0", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                        "resources": {"claims": [{"name": "us"}]}}],
                 "resourceClaims": [{"name": "us", "resourceClaimName": "job"}]}})
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "ultraserver", "driver": DRIVER, "pool": pool,
                                 "device": us.WHOLE_DEVICE}]},
        "nodeSelector": groups(admin)[held]["spec"]["nodeSelector"]},
        "reservedFor": [{"resource": "pods", "name": "job-0", "uid": pod["metadata"]["uid"]}]}
    admin.call("PUT", f"{claims}/job/status", body=claim)

    for name, _ in TWO:  # the whole 2-node UltraServer leaves
        unpublish_node(admin, name)
    beat_all(admin)
    kept = controller.reconcile()
    assert (kept.kept_for_claims, kept.events, kept.deleted) == (1, 1, 0)
    taints = groups(admin)[held]["spec"]["devices"][0]["taints"]
    assert {"key": f"{DRIVER}/member-missing", "value": "group-gone"} in [
        {k: t[k] for k in ("key", "value")} for t in taints]
    events = admin.list("/api/v1/namespaces/default/events",
                        query={"fieldSelector": "involvedObject.name=job"})["items"]
    assert [e["reason"] for e in events] == ["UltraServerGroupGone"]
    assert controller.reconcile().writes == 0  # kept as it is, told once

    admin.call("DELETE", "/api/v1/namespaces/default/pods/job-0", query={"gracePeriodSeconds": 0})
    admin.call("DELETE", f"{claims}/job")
    for _ in range(100):  # the claim's finalizers (if any) go with the controller-manager's pass
        try:
            admin.call("GET", f"{claims}/job")
        except ApiException as e:
            assert e.status == 404
            break
        time.sleep(0.1)
    released = controller.reconcile()
    assert released.deleted == 1 and held not in groups(admin)


def test_one_leader_at_a_time_and_a_successor_after_release_or_expiry(controller_api: KubeApi) -> None:
    now = [1000.0]
    a = LeaderElector(controller_api, LeaseOptions(NS, OPTIONS.name, "a"), clock=lambda: now[0])
    b = LeaderElector(controller_api, LeaseOptions(NS, OPTIONS.name, "b"), clock=lambda: now[0])
    assert a.step() and not b.step()
    a.release()
    assert b.step() and not a.step()
    # b stops renewing; a takes over only once the record has stood still for the lease duration.
    now[0] += 5
    assert not a.step()
    now[0] += 16
    assert a.step()
    assert not b.step()  # b's renewal failed and its deadline passed: it knows it lost
