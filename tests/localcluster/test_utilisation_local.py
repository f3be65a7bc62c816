"""Utilisation per pod and per claim, end to end on the local cluster (docs/utilisation.md): `cluster up
--prometheus` (fake runtime: the drivers as host processes, a real Prometheus built from the Go module proxy, a
neuron-monitor stand-in per node), a pod holding a Neuron device, its cores made busy with `neuron-dra
emulate-utilisation`, and every query of the emitted dashboard answered by that Prometheus with data; the
utilisation and memory panels give that pod's and claim's values and nothing for a busy core no pod holds. Then
neuron-monitor's DaemonSet as deploy renders it (deploy/exporter.py) beside pods holding every device: its claim
with admin access allocated and prepared all the same, its pod named in no attribution series and no panel.

The drivers publish whole devices only (`core_partitions="off"`, as EKS 1.34-1.36 by default): where the stack
deploys neuron-monitor (DriverDeployOptions.runs_neuron_monitor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.cli import main as cli_main
from neuron_dra.cli.emulate_utilisation import parse_cores
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import exporter
from neuron_dra.driver.deploy.dashboard import MEMORY_PER_POD, UTILISATION_PER_CLAIM, UTILISATION_PER_POD
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane.apply import apply_all
from neuron_dra.localcluster.controlplane.prometheus import query, targets_up
from tests.support import promql
from tests.support.e2e import NEURON_TOLERATION, create_namespace, created_container, device_claim, eventually, raw

pytestmark = [pytest.mark.cluster, pytest.mark.gobuild, pytest.mark.slow]

DRIVER = "neuron.aws.com"
NODE = "trn2-48xlarge-1"
NS = "util"
RATIO = 0.4
DEVICE_BYTES = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from neuron_dra.localcluster.cluster import up

    c = up(tmp_path_factory.mktemp("util"), ["trn2.48xlarge:1"], ttl=3600, timeout=1800, runtime="fake",
           prometheus=True, core_partitions="off")
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def holder(cluster: LocalCluster) -> dict[str, str]:
    """Pod `holder` with claim `device-3` (neuron-device-3): its attribution series as Prometheus has them."""
    api = config.new_client_from_config(str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    create_namespace(core, NS)
    res.create_namespaced_resource_claim(NS, device_claim("device-3", DRIVER, 3))  # type: ignore[arg-type]
    core.create_namespaced_pod(NS, {  # type: ignore[arg-type]
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder"}, "spec": {
            "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "neuron", "resourceClaimName": "device-3"}],
            "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                            "resources": {"claims": [{"name": "neuron"}]}}]}})
    assert cluster.prometheus
    url = cluster.prometheus
    (series,) = promql.series(url, 'neuron_dra_claim_device_info{pod="holder"}', 120,
                              what="the holder's attribution in Prometheus")
    api.close()
    labels: dict[str, str] = series["metric"]
    return labels


def emulate(cluster_dir: Path, *args: str) -> None:
    assert cli_main(["emulate-utilisation", str(cluster_dir), "--node", NODE, *args]) == 0


def test_every_panel_returns_data_for_a_pod_holding_devices(cluster: LocalCluster, holder: dict[str, str]) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    assert (holder["node"], holder["device"], holder["claim"]) == (NODE, "neuron-device-3", "device-3")
    cores = parse_cores(holder["neuroncores"])
    assert cores  # the NeuronCores the pod sees
    # A runtime on the holder's cores, and a busier one on a core of a device nobody holds (neuron-device-0's
    # first core: not the holder's): the joins must leave the latter out.
    emulate(cluster.dir, "--runtime-tag", "101", "--cores", holder["neuroncores"], "--ratio", str(RATIO),
            "--device-memory", str(DEVICE_BYTES * len(cores)))
    assert 0 not in cores
    emulate(cluster.dir, "--runtime-tag", "202", "--cores", "0", "--ratio", "0.9", "--device-memory", "5")
    eventually(lambda: targets_up(url, "neuron-monitor") == {NODE: True} or None, 60,
               what="the node's neuron-monitor stand-in scraped")

    answers = promql.dashboard_answers(url, 120)
    assert promql.values(answers[UTILISATION_PER_POD], "namespace", "pod") == {(NS, "holder"): pytest.approx(RATIO)}
    assert promql.values(answers[UTILISATION_PER_CLAIM], "namespace", "claim") == {
        (NS, "device-3"): pytest.approx(RATIO)}
    assert promql.values(answers[MEMORY_PER_POD], "namespace", "pod") == {(NS, "holder"): DEVICE_BYTES * len(cores)}

    # The stand-in follows its state: cleared, the utilisation panels go empty.
    emulate(cluster.dir, "--clear", "--all")
    promql.gone(url, UTILISATION_PER_POD, 60, what="utilisation gone after --clear")


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "neuron", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                        "resources": {"claims": [{"name": "neuron"}]}}]}}


def test_neuron_monitors_admin_claim_is_prepared_beside_holders_of_every_device_and_holds_nothing(
        cluster: LocalCluster, holder: dict[str, str]) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    api = config.new_client_from_config(str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    # Pod `rest` takes every device but the holder's: the node's every device is held.
    res.create_namespaced_resource_claim(NS, {  # type: ignore[arg-type]
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "the-rest"},
        "spec": {"devices": {"requests": [{"name": "neuron", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "All",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].deviceId != 3'}}]}}]}}})
    core.create_namespaced_pod(NS, claim_pod("rest", "the-rest"))  # type: ignore[arg-type]
    eventually(lambda: raw(core.read_namespaced_pod("rest", NS, _preload_content=False))["status"].get(
        "phase") == "Running", 120, what="pod rest Running")
    every = {f"neuron-device-{i}" for i in range(16)}

    # neuron-monitor as the stack deploys it on this minor without NeuronCores: the namespace's admin-access
    # label and the exporter's objects (its image runs in the fake runtime like any other).
    options = deploy.DriverDeployOptions(kubernetes_version=DEFAULT_MINOR, core_partitions="off")
    assert options.runs_neuron_monitor
    objects = [m for m in deploy.manifests(options)
               if m["kind"] == "Namespace" or m["metadata"]["name"] == "neuron-monitor"]
    assert {m["kind"] for m in objects} == {"Namespace", "ServiceAccount", "NetworkPolicy", "ResourceClaimTemplate",
                                            "DaemonSet"}
    apply_all(api, objects)
    selector = ",".join(f"{k}={v}" for k, v in exporter.POD_SELECTOR.items())

    def monitor_running() -> dict[str, Any] | None:
        pods = raw(core.list_namespaced_pod(options.namespace, label_selector=selector, _preload_content=False))
        return next((p for p in pods["items"] if p["status"].get("phase") == "Running"), None)

    pod = eventually(monitor_running, 180, what="neuron-monitor's pod Running")
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == NODE
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = raw(res.read_namespaced_resource_claim(status["resourceClaimName"], options.namespace,
                                                   _preload_content=False))
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["device"] for r in results} == every and all(r.get("adminAccess") is True for r in results)
    # Prepared: the runtime gave its container every device node (the driver's CDI spec for the claim).
    created = created_container(cluster.node_paths(NODE).cri_records, options.namespace, name, "neuron-monitor")
    assert sorted(n["path"] for n in created["deviceNodes"]) == sorted(f"/dev/neuron{i}" for i in range(16))

    # The attribution: the three claims prepared, the holders named, neuron-monitor's pod nowhere.
    eventually(lambda: [float(s["value"][1]) for s in query(url, f'neuron_dra_claims{{node="{NODE}",'
                                                                 'state="prepared"}')] == [3.0] or None, 60,
               what="the three claims prepared, scraped")
    info = query(url, f'neuron_dra_claim_device_info{{node="{NODE}"}}')
    assert {s["metric"]["device"] for s in info} == every
    assert {s["metric"]["pod"] for s in info} == {"holder", "rest"}
    (allocated,) = query(url, f'neuron_dra_node_devices{{node="{NODE}",state="allocated"}}')
    assert float(allocated["value"][1]) == 16

    # Every panel still returns data, and names no pod but the holders.
    emulate(cluster.dir, "--runtime-tag", "303", "--cores", holder["neuroncores"], "--ratio", str(RATIO),
            "--device-memory", str(DEVICE_BYTES))
    for expr, answer in promql.dashboard_answers(url, 120).items():
        assert name not in {s["metric"].get("pod") for s in answer}, (expr, answer)
    api.close()
