"""End-to-end: the real kubelet (the cluster's version) as the node agent, and what it does with the DRA driver.

Registration through kubelet's own plugin watcher, NodePrepareResources called by kubelet, the CDI ids kubelet
passes to the container runtime (recorded by the fake runtime), default-grace deletion (unprepare, then the pod
is gone within seconds), a kubelet restart with a prepared claim, and two DRA drivers on one node.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from neuron_dra.localcluster.build import DEFAULT_MINOR, kube_version
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.processes import procs
from tests.support.e2e import (
    NEURON_TOLERATION,
    cdi_specs_naming,
    claim_template,
    created_container,
    eventually,
    pod_claim,
    pod_phase,
    raw,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
DRIVER = "neuron.aws.com"
TRN2_A, TRN1, INF2 = "trn2-48xlarge-1", "trn1-32xlarge-1", "inf2-48xlarge-1"


def _template(kube: client.ApiClient, ns: str, name: str, instance_type: str, count: int) -> None:
    sel = {"cel": {"expression": f"device.attributes['{DRIVER}'].instanceType == '{instance_type}'"}}
    body: Any = claim_template(name, [{"name": "neurons", "exactly": {
        "deviceClassName": DRIVER, "count": count, "selectors": [sel]}}])
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(ns, body)


def _pod(name: str, template: str, node: str, grace: int | None = None) -> Any:
    """A pod using a claim from `template` on `node`; `grace` None keeps the API default (30 s)."""
    spec: dict[str, Any] = {
        "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": node},
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                        "resources": {"claims": [{"name": "neuron"}]}}],
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _driver_log_lines(path: Path, msg: str, claim_uid: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if claim_uid not in line:
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("msg") == msg:
            out.append(entry)
    return out


def _slices(kube: client.ApiClient, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw(client.ResourceV1Api(kube).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={driver}", _preload_content=False))["items"]
    return items


def test_nodes_are_registered_by_kubelets_of_the_cluster_version(local_cluster: LocalCluster,
                                                                 kube: client.ApiClient) -> None:
    version = kube_version(DEFAULT_MINOR)
    assert raw(client.VersionApi(kube).get_code(_preload_content=False))["gitVersion"] == version
    for node in local_cluster.nodes:
        obj = raw(client.CoreV1Api(kube).read_node(node.name, _preload_content=False))
        assert obj["status"]["nodeInfo"]["kubeletVersion"] == version
        assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("fakeRuntime://")
        labels = obj["metadata"]["labels"]
        assert labels["node.kubernetes.io/instance-type"] == node.instance_type
        assert labels["eks.amazonaws.com/compute-type"] == "ec2"
        assert {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"} in obj["spec"]["taints"]
        assert obj["spec"]["providerID"].endswith(node.name)
        ready = {c["type"]: c for c in obj["status"]["conditions"]}["Ready"]
        assert ready["status"] == "True" and ready["reason"] == "KubeletReady"


def test_drivers_register_through_the_kubelets_plugin_watcher(local_cluster: LocalCluster) -> None:
    """Both DRA drivers of the trn1 node (ours and the emulated EFA driver) register through the kubelet's plugin
    watcher in its own registry directory, and kubelet chooses the v1 DRA service."""
    paths = local_cluster.node_paths(TRN1)
    log = paths.kubelet.log.read_text(errors="replace")
    for driver in (DRIVER, "dra.net"):
        sock = paths.registry_dir / f"{driver}-reg.sock"
        assert f'"OperationExecutor.RegisterPlugin started" plugin={{"SocketPath":"{sock}"' in log, driver
        registered = re.findall(rf'"Registered DRA plugin".*driverName="{re.escape(driver)}".*', log)
        assert registered, f"kubelet did not register {driver}"
        assert 'chosenService="v1.DRAPlugin"' in registered[0]


def test_kubelet_prepares_and_passes_every_devices_cdi_ids(local_cluster: LocalCluster, kube: client.ApiClient,
                                                            ns: str) -> None:
    """kubelet calls NodePrepareResources and hands CreateContainer each device's CDI ids in order, without
    de-duplication: the claim's per-request id comes once per device. Every id resolved in the node's CDI dir."""
    _template(kube, ns, "two", "trn2.48xlarge", 2)
    client.CoreV1Api(kube).create_namespaced_pod(ns, _pod("p", "two", TRN2_A, grace=0))
    eventually(lambda: pod_phase(client.CoreV1Api(kube), ns, "p") == "Running", 90, what="pod running")
    claim = pod_claim(client.CoreV1Api(kube), client.ResourceV1Api(kube), ns, "p")
    uid = claim["metadata"]["uid"]
    devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    paths = local_cluster.node_paths(TRN2_A)
    assert len(_driver_log_lines(paths.driver_log, "prepared claim", uid)) == 1
    record = created_container(paths.cri_records, ns, "p")
    request_id = f"aws.amazon.com/neuron={uid}-request-neurons"
    expected: list[str] = []
    for device in devices:
        expected += [f"aws.amazon.com/neuron={uid}-{device}", request_id]
    assert record["cdiDevices"] == expected
    assert record["cdiDevices"].count(request_id) == 2
    assert sorted(n["path"] for n in record["deviceNodes"]) == sorted(
        f"/dev/neuron{d.rsplit('-', 1)[1]}" for d in devices)
    assert record["env"]["NEURON_RT_VISIBLE_CORES"]


def test_default_grace_deletion_unprepares_then_the_pod_is_gone_within_seconds(
        local_cluster: LocalCluster, kube: client.ApiClient, ns: str) -> None:
    """`kubectl delete pod` with the default grace period (30 s; the fake runtime stops containers at once):
    kubelet unprepares the claim, and only then the pod object goes, within seconds."""
    core = client.CoreV1Api(kube)
    _template(kube, ns, "one", "trn1.32xlarge", 1)
    core.create_namespaced_pod(ns, _pod("graceful", "one", TRN1))
    eventually(lambda: pod_phase(core, ns, "graceful") == "Running", 90, what="pod running")
    uid = pod_claim(core, client.ResourceV1Api(kube), ns, "graceful")["metadata"]["uid"]
    paths = local_cluster.node_paths(TRN1)
    assert cdi_specs_naming(paths.cdi_root, [uid])
    began = time.monotonic()
    core.delete_namespaced_pod("graceful", ns)  # no options: the pod's grace period applies

    def gone() -> bool:
        return not [p for p in core.list_namespaced_pod(ns).items if p.metadata is not None
                    and p.metadata.name == "graceful"]

    eventually(gone, 20, interval=0.1, what="the pod gone")
    took = time.monotonic() - began
    assert took < 10, f"deletion took {took:.1f} s"
    # kubelet unprepared before it let the pod object go: the driver's CDI spec of the claim is already removed
    assert not cdi_specs_naming(paths.cdi_root, [uid])
    assert len(_driver_log_lines(paths.driver_log, "unprepared claim", uid)) == 1


def test_kubelet_restart_keeps_a_prepared_claim_and_slices_come_back(local_cluster: LocalCluster,
                                                                     kube: client.ApiClient, ns: str) -> None:
    """A kubelet restart with a running pod: kubelet wipes the node's ResourceSlices at start, the drivers publish
    them again, the pod keeps running, and the claim is not prepared a second time (kubelet's checkpoint)."""
    core = client.CoreV1Api(kube)
    _template(kube, ns, "ring", "inf2.48xlarge", 2)
    core.create_namespaced_pod(ns, _pod("kept", "ring", INF2, grace=0))
    eventually(lambda: pod_phase(core, ns, "kept") == "Running", 90, what="pod running")
    uid = pod_claim(core, client.ResourceV1Api(kube), ns, "kept")["metadata"]["uid"]
    paths = local_cluster.node_paths(INF2)
    before = {s["metadata"]["name"] for s in _slices(kube, INF2)}
    assert before
    old = procs.running(paths.kubelet.pid_file)
    assert old is not None
    assert procs.signal_group(old, signal.SIGTERM)
    new = eventually(lambda: (r := procs.running(paths.kubelet.pid_file)) is not None and r != old and r, 60,
                     what="kubelet restarted by the supervisor")
    assert new != old

    def republished() -> bool:
        names = {s["metadata"]["name"] for s in _slices(kube, INF2)}
        return bool(names) and names.isdisjoint(before)

    eventually(republished, 60, what="slices wiped by the restarted kubelet and published again")
    time.sleep(3)  # give a (wrong) second prepare the time to happen
    assert pod_phase(core, ns, "kept") == "Running"
    assert len(_driver_log_lines(paths.driver_log, "prepared claim", uid)) == 1
    core.delete_namespaced_pod("kept", ns)
    eventually(lambda: not core.list_namespaced_pod(ns).items, 30, what="pod deleted after the restart")
    # Grace period 0: the API object goes at once, kubelet unprepares right after (7 ms later in one CI run).
    eventually(lambda: not cdi_specs_naming(paths.cdi_root, [uid]), 30,
               what="the claim unprepared by the restarted kubelet")
