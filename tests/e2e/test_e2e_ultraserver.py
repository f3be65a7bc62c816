"""End-to-end: `cluster up --node trn2u.48xlarge:4 --node trn2u.48xlarge:2` (fake runtime) against the real
kube-apiserver, kube-scheduler and kubelets: the group controller publishes one group device per UltraServer whose
node selector names exactly its members; a 4-pod `UltraServerJob` runs one pod per node of the 4-node UltraServer
with the UltraServer environment in every container (prepared by each member's driver from the shared claim); a
second such job binds no pod while the first runs and runs there once it is gone; a 2-pod job takes the 2-node
UltraServer; the whole and a half of one UltraServer exclude each other through shared counters (1.36); a
member's device fault taints its groups. The controller labels each member Node with its UltraServer's and its
2-node pair's server ids, and the jobs carry `UltraServerJob`'s pod affinity on those labels (docs/ultraserver.md)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.claim_templates.ultraserver import GROUP_CLAIM_REF, NODE_CLAIM_REF, UltraServerJob
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.emulate import clear_faults, inject_fault
from neuron_dra.driver.model.k8s_names import ultraserver_label_keys
from neuron_dra.localcluster.cluster import LocalCluster, up
from neuron_dra.localcluster.nodes.topology import ultraservers
from neuron_dra.localcluster.processes import procs
from tests.support.e2e import NEURON_TOLERATION, created_container, eventually, raw, unschedulable

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DRIVER = "neuron.aws.com"
FOUR = [f"trn2u-48xlarge-{i}" for i in (1, 2, 3, 4)]
TWO = ["trn2u-48xlarge-5", "trn2u-48xlarge-6"]
KLASS = "sys/class/neuron_device"
WHOLE_LABEL, PAIR_LABEL = ultraserver_label_keys(DRIVER)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = up(tmp_path_factory.mktemp("ultra") / "cluster", ["trn2u.48xlarge:4", "trn2u.48xlarge:2"], ttl=1800,
           timeout=600, runtime="fake")
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    a = config.new_client_from_config(str(cluster.kubeconfig))
    yield a
    a.close()


@pytest.fixture
def ns(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = "ultra-jobs"
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(name).items), 30, what="service account")
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(name).items, 90, what="pods gone")
    core.delete_namespace(name)


def _class_file(cluster: LocalCluster, node: str, name: str) -> str:
    return (cluster.node_paths(node).host_root / KLASS / name).read_text().strip()


def _group_slices(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    """The group slices by name: on 1.36 the 4-node UltraServer's pool holds its counter slice and the slices of
    its whole and its two halves."""
    items = raw(client.ResourceV1Api(api).list_resource_slice(_preload_content=False))["items"]
    return {s["metadata"]["name"]: s for s in items if us.is_group_slice(s, DRIVER)}


def _groups_ready(api: client.ApiClient) -> dict[str, dict[str, Any]] | None:
    """The group slices once there are the two UltraServers and the two halves of the 4-node one, none tainted,
    and the 4-node one's counters."""
    found = _group_slices(api)
    devices = [d for s in found.values() for d in s["spec"].get("devices") or ()]
    counters = [s for s in found.values() if s["spec"].get("sharedCounters")]
    return found if len(found) == 5 and len(devices) == 4 and len(counters) == 1 and not any(
        d.get("taints") for d in devices) else None


def test_one_group_device_per_ultraserver_selects_exactly_its_members(cluster: LocalCluster,
                                                                      api: client.ApiClient) -> None:
    assert sorted(ultraservers(list(cluster.nodes)).values()) == [FOUR, TWO]
    found = eventually(lambda: _groups_ready(api), 120, what="the group slices of both UltraServers")
    whole = {s["spec"]["devices"][0]["attributes"]["nodeCount"]["int"]: s for s in found.values()
             if s["spec"].get("devices") and s["spec"]["devices"][0]["name"] == us.WHOLE_DEVICE}
    assert sorted(whole) == [2, 4]
    assert us.selected_nodes(whole[4]["spec"]["nodeSelector"]) == FOUR
    assert us.selected_nodes(whole[2]["spec"]["nodeSelector"]) == TWO
    assert whole[4]["spec"]["pool"]["name"] == f"ultraserver-4/{_class_file(cluster, FOUR[0], 'server_id_4')}"
    attrs = whole[4]["spec"]["devices"][0]["attributes"]
    assert attrs["instanceType"] == {"string": "trn2u.48xlarge"} and attrs["ultraserverMode"] == {"int": 4}
    halves = sorted((us.selected_nodes(s["spec"]["nodeSelector"]), s["spec"]["devices"][0]["name"],
                     s["spec"]["pool"]["name"]) for s in found.values()
                    if s["spec"].get("devices") and s["spec"]["devices"][0]["name"].startswith(us.HALF_DEVICE))
    pool = whole[4]["spec"]["pool"]["name"]
    assert halves == [(FOUR[:2], f"{us.HALF_DEVICE}-0", pool), (FOUR[2:], f"{us.HALF_DEVICE}-1", pool)]
    (counters,) = [s for s in found.values() if s["spec"].get("sharedCounters")]
    assert counters["spec"]["pool"]["name"] == pool and us.selected_nodes(counters["spec"]["nodeSelector"]) == FOUR
    device_class = raw(client.ResourceV1Api(api).read_device_class(f"ultraserver.{DRIVER}", _preload_content=False))
    assert "ultraserver" in device_class["spec"]["selectors"][0]["cel"]["expression"]

    # The members' labels: the set's server id (the whole device's) and the pair's (a half's, or the 2-node set's)
    def server_id(s: dict[str, Any]) -> str:
        return str(s["spec"]["devices"][0]["attributes"]["ultraserverServerId"]["string"])

    by_members = {tuple(us.selected_nodes(s["spec"]["nodeSelector"])): s for s in found.values()
                  if s["spec"].get("devices")}
    want = {n: {WHOLE_LABEL: server_id(whole[4]), PAIR_LABEL: server_id(by_members[tuple(half)])}
            for half in (FOUR[:2], FOUR[2:]) for n in half}
    want.update({n: {WHOLE_LABEL: server_id(whole[2]), PAIR_LABEL: server_id(whole[2])} for n in TWO})
    assert want[FOUR[0]][PAIR_LABEL] != want[FOUR[2]][PAIR_LABEL]
    assert want[FOUR[0]][WHOLE_LABEL] == _class_file(cluster, FOUR[0], "server_id_4")

    def labels() -> dict[str, dict[str, str]] | None:
        nodes = raw(client.CoreV1Api(api).list_node(_preload_content=False))["items"]
        got = {n["metadata"]["name"]: {k: v for k, v in (n["metadata"].get("labels") or {}).items()
                                       if k in (WHOLE_LABEL, PAIR_LABEL)} for n in nodes}
        return got if {n: v for n, v in got.items() if v} == want else None

    assert set(eventually(labels, 60, what="the members' UltraServer labels")) >= set(FOUR + TWO)


def _start_job(api: client.ApiClient, ns: str, name: str, nodes: int) -> list[str]:
    job = UltraServerJob(name, nodes=nodes, instance_types="trn2u.48xlarge", namespace=ns)
    res = client.ResourceV1Api(api)
    res.create_namespaced_resource_claim(ns, job.group_claim())  # type: ignore[arg-type]
    res.create_namespaced_resource_claim_template(ns, job.node_template().to_manifest())  # type: ignore[arg-type]
    pods = [f"{name}-{i}" for i in range(nodes)]
    for pod in pods:
        client.CoreV1Api(api).create_namespaced_pod(ns, {  # type: ignore[arg-type]
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {"job": name, **job.pod_labels()}},
            "spec": {"tolerations": [NEURON_TOLERATION], "resourceClaims": job.pod_claims(),
                     "affinity": job.affinity(),
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                                     "resources": {"claims": [{"name": GROUP_CLAIM_REF}, {"name": NODE_CLAIM_REF}]}}]}})
    return pods


def _placed(api: client.ApiClient, ns: str, pods: list[str]) -> dict[str, str] | None:
    """Pod -> node once every pod runs."""
    out = {}
    for pod in pods:
        p = raw(client.CoreV1Api(api).read_namespaced_pod(pod, ns, _preload_content=False))
        if p.get("status", {}).get("phase") != "Running":
            return None
        out[pod] = p["spec"]["nodeName"]
    return out


def _check_env(cluster: LocalCluster, ns: str, placed: dict[str, str], mode: int) -> None:
    for pod, node in placed.items():
        env = created_container(cluster.node_paths(node).cri_records, ns, pod)["env"]
        assert env["NEURON_RT_ULTRASERVER_MODE"] == str(mode), (pod, node, env)
        assert env["NEURON_RT_ULTRASERVER_SERVER_ID"] == _class_file(cluster, node, f"server_id_{mode}")
        assert env["NEURON_RT_ULTRASERVER_NODE_ID"] == _class_file(cluster, node, f"node_id_{mode}")
        assert env["NEURON_RT_VISIBLE_CORES"] == "0-63"  # and all of the node's devices, from its own claim


def test_jobs_land_one_pod_per_node_of_one_ultraserver(cluster: LocalCluster, api: client.ApiClient,
                                                        ns: str) -> None:
    eventually(lambda: _groups_ready(api), 120, what="the group slices")
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    first = _start_job(api, ns, "first", 4)
    placed = eventually(lambda: _placed(api, ns, first), 180, what="the first job's 4 pods running")
    assert sorted(placed.values()) == FOUR  # one pod per node of the 4-node UltraServer
    _check_env(cluster, ns, placed, 4)
    claim = raw(res.read_namespaced_resource_claim("first", ns, _preload_content=False))
    assert us.selected_nodes(claim["status"]["allocation"]["nodeSelector"]) == FOUR
    assert len(claim["status"]["reservedFor"]) == 4

    second = _start_job(api, ns, "second", 4)
    eventually(lambda: all(unschedulable(core, ns, p) for p in second), 90, what="the second job waiting")
    pair = _start_job(api, ns, "pair", 2)
    placed_pair = eventually(lambda: _placed(api, ns, pair), 180, what="the 2-pod job running")
    assert sorted(placed_pair.values()) == TWO
    _check_env(cluster, ns, placed_pair, 2)
    assert all(unschedulable(core, ns, p) for p in second)  # still none bound while the first job runs

    core.delete_collection_namespaced_pod(ns, label_selector="job=first", grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(ns, label_selector="job=first").items, 90, what="first gone")
    # The first job's claim stays (a Job's deletion leaves the ResourceClaim it names): unreserved, it is
    # deallocated by kube-controller-manager, which frees the group for the second job.
    placed_second = eventually(lambda: _placed(api, ns, second), 180, what="the second job running")
    assert sorted(placed_second.values()) == FOUR
    _check_env(cluster, ns, placed_second, 4)
    assert not raw(res.read_namespaced_resource_claim("first", ns, _preload_content=False))["status"].get("allocation")


def _controller_leads(cluster: LocalCluster) -> int:
    log = cluster.dir / "ultraserver" / "controller.log"
    return log.read_text().count("became the leader") if log.exists() else 0


def test_a_members_device_fault_taints_its_groups_after_a_controller_crash(cluster: LocalCluster,
                                                                          api: client.ApiClient) -> None:
    """The controller is killed (-9, its Lease not released) and restarted by the supervisor; the new one takes
    over without rewriting the slices that did not change, and taints the groups of a member whose device
    faults."""
    before = eventually(lambda: _groups_ready(api), 120, what="the group slices")
    versions = {pool: s["metadata"]["resourceVersion"] for pool, s in before.items()}
    leads = eventually(lambda: _controller_leads(cluster), 60, what="the controller leading")
    ref = procs.read_pid_file(cluster.dir / "ultraserver" / "pids" / "controller.pid")
    assert ref is not None and procs.signal_group(ref, signal.SIGKILL)
    eventually(lambda: _controller_leads(cluster) > leads, 120, what="the restarted controller leading")
    node = FOUR[2]
    root = cluster.node_paths(node).host_root
    inject_fault(root, 5)

    def tainted() -> list[tuple[str, str]] | None:
        names = sorted((s["spec"]["pool"]["name"], d["name"]) for s in _group_slices(api).values()
                       for d in s["spec"].get("devices") or ()
                       if any(t["key"] == f"{DRIVER}/unhealthy" for t in d.get("taints") or ()))
        return names if len(names) == 2 else None

    found = eventually(tainted, 90, what="the member's groups tainted")
    pool = f"ultraserver-4/{_class_file(cluster, node, 'server_id_4')}"
    assert found == [(pool, us.WHOLE_DEVICE), (pool, f"{us.HALF_DEVICE}-1")]  # the whole and the member's half
    after = _group_slices(api)
    others = [n for n, s in before.items() if s["spec"]["pool"]["name"] != pool]
    assert others and {n: after[n]["metadata"]["resourceVersion"] for n in others} == {
        n: versions[n] for n in others}  # the other UltraServer's pool was not rewritten by either controller
    clear_faults(root, 5)
    eventually(lambda: _groups_ready(api), 120, what="the taints cleared once the device is healthy again")


def test_a_member_that_leaves_taints_its_group(cluster: LocalCluster, api: client.ApiClient) -> None:
    """The Node of a member of the 2-node UltraServer is deleted: its group is tainted member-missing (the
    controller remembers the member from the slice's annotation)."""
    eventually(lambda: _groups_ready(api), 120, what="the group slices")
    client.CoreV1Api(api).delete_node(TWO[1])

    def missing() -> str | None:
        (pair,) = [s for s in _group_slices(api).values() if us.selected_nodes(s["spec"]["nodeSelector"]) == TWO]
        taints = [t for d in pair["spec"].get("devices") or () for t in d.get("taints") or ()
                  if t["key"] == f"{DRIVER}/{us.MISSING_TAINT}"]
        return taints[0]["value"] if taints else None

    assert eventually(missing, 90, what="the 2-node group tainted member-missing") == "1-of-2"


def _group_claim(name: str, nodes: int, ultraserver_id: str) -> dict[str, Any]:
    """A claim for one group device of `nodes` nodes of one UltraServer (by its ultraserverId)."""
    d = f'device.attributes["{DRIVER}"]'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "group", "exactly": {
                "deviceClassName": f"ultraserver.{DRIVER}",
                "selectors": [{"cel": {"expression": f"{d}.nodeCount == {nodes} && "
                                                     f"{d}.ultraserverId == '{ultraserver_id}'"}}]}}]}}}


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod holding only the group claim (no node device), so only the group device can keep it out."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [NEURON_TOLERATION], "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "group", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                                     "resources": {"claims": [{"name": "group"}]}}]}}


def test_the_whole_and_a_half_of_one_ultraserver_exclude_each_other(api: client.ApiClient) -> None:
    """Shared counters (1.36): with the 4-node group allocated, a claim for a half of the same UltraServer stays
    unallocated, its pod unschedulable; once the whole is released the half is allocated, and then a claim for the
    whole stays unallocated."""
    def four_ready() -> dict[str, Any] | None:
        """The 4-node UltraServer's whole slice, once its pool's four slices are there and untainted (the 2-node
        UltraServer may have lost a member to an earlier test)."""
        found = _group_slices(api).values()
        whole = [s for s in found if s["spec"].get("devices") and us.selected_nodes(s["spec"]["nodeSelector"]) == FOUR]
        if len(whole) != 1:
            return None
        pool = [s for s in found if s["spec"]["pool"]["name"] == whole[0]["spec"]["pool"]["name"]]
        if len(pool) != 4 or any(d.get("taints") for s in pool for d in s["spec"].get("devices") or ()):
            return None
        return whole[0]

    four = eventually(four_ready, 120, what="the 4-node UltraServer's group slices")
    ultraserver_id = four["spec"]["devices"][0]["attributes"]["ultraserverId"]["string"]
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    ns = "ultra-counters"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    try:
        eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                               for sa in core.list_namespaced_service_account(ns).items), 30, what="service account")

        def allocation(claim: str) -> dict[str, Any] | None:
            found: dict[str, Any] | None = raw(res.read_namespaced_resource_claim(
                claim, ns, _preload_content=False)).get("status", {}).get("allocation")
            return found

        def running(pod: str) -> bool:
            return bool(raw(core.read_namespaced_pod(pod, ns, _preload_content=False)).get(
                "status", {}).get("phase") == "Running")

        for claim, nodes in (("whole", 4), ("half", 2), ("whole-again", 4)):
            res.create_namespaced_resource_claim(ns, _group_claim(claim, nodes, ultraserver_id))  # type: ignore[arg-type]
        core.create_namespaced_pod(ns, _claim_pod("whole", "whole"))  # type: ignore[arg-type]
        eventually(lambda: running("whole"), 120, what="the whole's pod running")
        core.create_namespaced_pod(ns, _claim_pod("half", "half"))  # type: ignore[arg-type]
        eventually(lambda: unschedulable(core, ns, "half"), 90, what="the half's pod unschedulable")
        assert allocation("half") is None
        (result,) = allocation("whole")["devices"]["results"]  # type: ignore[index]
        assert (result["pool"], result["device"]) == (four["spec"]["pool"]["name"], us.WHOLE_DEVICE)

        core.delete_namespaced_pod("whole", ns, grace_period_seconds=0)
        eventually(lambda: running("half"), 180, what="the half's pod running once the whole is released")
        (half,) = allocation("half")["devices"]["results"]  # type: ignore[index]
        assert half["pool"] == four["spec"]["pool"]["name"] and half["device"].startswith(f"{us.HALF_DEVICE}-")
        assert us.selected_nodes(allocation("half")["nodeSelector"]) in (FOUR[:2], FOUR[2:])  # type: ignore[index]

        core.create_namespaced_pod(ns, _claim_pod("whole-again", "whole-again"))  # type: ignore[arg-type]
        eventually(lambda: unschedulable(core, ns, "whole-again"), 90, what="the whole's pod unschedulable")
        assert allocation("whole-again") is None
    finally:
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        eventually(lambda: not core.list_namespaced_pod(ns).items, 90, what="pods gone")
        core.delete_namespace(ns)
