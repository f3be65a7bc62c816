"""Attribution metrics end to end: `cluster up --runtime containerd --prometheus` (the drivers as DaemonSet pods in
their nodes' network namespaces, a real Prometheus built from the Go module proxy scraping each of them), claim
pods in real containers, and the emitted dashboard's every query answered by that Prometheus.

"Which pod holds neuron-device-3 on node X, with which cores" is asked of Prometheus and compared with what the API
server says (the claim's allocation and reservedFor) and with the NeuronCores the container was given
(NEURON_RT_VISIBLE_CORES in its report). The utilisation panels join the node's stand-in for neuron-monitor's
exporter (localcluster/nodes/neuron_monitor_emulator.py, set with `neuron-dra emulate-utilisation`) with the
driver's per-core series.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.cli import main as cli_main
from neuron_dra.cli.emulate_utilisation import parse_cores
from neuron_dra.driver.deploy.dashboard import UTILISATION_PER_CLAIM, UTILISATION_PER_POD
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane.prometheus import query, targets_up
from neuron_dra.localcluster.processes.podlogs import container_log, workload_report
from tests.support import promql
from tests.support.e2e import NEURON_TOLERATION, claim_template, create_namespace, device_claim, eventually, raw

pytestmark = [pytest.mark.cluster, pytest.mark.containerd, pytest.mark.gobuild, pytest.mark.slow]

DRIVER = "neuron.aws.com"
CORES = "neuroncore.aws.com"
NODE1, NODE2 = "trn2-48xlarge-1", "trn2-48xlarge-2"
NS = "metrics"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from neuron_dra.localcluster.cluster import up

    c = up(tmp_path_factory.mktemp("metrics"), ["trn2.48xlarge:2"], ttl=3600, timeout=1800, runtime="containerd",
           prometheus=True)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def kapi(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(cluster.kubeconfig))
    yield api
    api.close()


def pod(name: str, image: str, node: str, claim: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 0, "resourceClaims": [{"name": "neuron", **claim}],
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                        "resources": {"claims": [{"name": "neuron"}]}}]}}


@pytest.fixture(scope="module")
def workloads(cluster: LocalCluster, kapi: client.ApiClient) -> dict[str, dict[str, str]]:
    """Pod `holder` on NODE1 with a claim for neuron-device-3; pod `small` on NODE2 with one NeuronCore."""
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    create_namespace(core, NS)
    res.create_namespaced_resource_claim(NS, device_claim("device-3", DRIVER, 3))  # type: ignore[arg-type]
    res.create_namespaced_resource_claim_template(NS, claim_template(  # type: ignore[arg-type]
        "one-core", [{"name": "neuron", "exactly": {"deviceClassName": CORES}}]))
    image = json.loads((cluster.dir / "images.json").read_text())["workload"]
    core.create_namespaced_pod(NS, pod("holder", image, NODE1, {"resourceClaimName": "device-3"}))  # type: ignore[arg-type]
    core.create_namespaced_pod(NS, pod("small", image, NODE2, {"resourceClaimTemplateName": "one-core"}))  # type: ignore[arg-type]
    reports = {}
    for name, node in (("holder", NODE1), ("small", NODE2)):
        logs = cluster.node_paths(node).kubelet.pod_logs

        def complete(name: str = name, logs: Any = logs) -> dict[str, str] | None:
            report = workload_report(container_log(logs, NS, name, "main"))
            return report if report.get("ready") == "yes" else None

        reports[name] = eventually(complete, 180, what=f"the report of {NS}/{name}")
    return reports


def claim_of(kapi: client.ApiClient, pod_name: str) -> dict[str, Any]:
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    p = raw(core.read_namespaced_pod(pod_name, NS, _preload_content=False))
    (use,) = p["spec"]["resourceClaims"]
    # A claim named in the pod is that claim; one from a template is named in the pod's status.
    name = use.get("resourceClaimName") or p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return raw(res.read_namespaced_resource_claim(name, NS, _preload_content=False))


def test_every_nodes_driver_is_scraped(cluster: LocalCluster) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    eventually(lambda: targets_up(url) if targets_up(url) == {NODE1: True, NODE2: True} else None, 60,
               what="both drivers scraped")


def test_prometheus_names_the_pod_holding_neuron_device_3_and_its_cores(
        cluster: LocalCluster, kapi: client.ApiClient, workloads: dict[str, dict[str, str]]) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    claim = claim_of(kapi, "holder")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [(NODE1, "neuron-device-3")]
    reserved = [r["name"] for r in claim["status"]["reservedFor"] if r["resource"] == "pods"]
    assert reserved == ["holder"]

    expr = f'neuron_dra_claim_device_info{{node="{NODE1}", device="neuron-device-3"}}'
    (series,) = promql.series(url, expr, 60)
    labels = series["metric"]
    assert (labels["namespace"], labels["pod"], labels["claim"]) == (NS, reserved[0], claim["metadata"]["name"])
    assert labels["request"] == "neuron"
    assert labels["neuroncores"] == workloads["holder"]["NEURON_RT_VISIBLE_CORES"]  # what the container sees

    small = claim_of(kapi, "small")
    (core_device,) = [r["device"] for r in small["status"]["allocation"]["devices"]["results"]]
    answer = promql.series(url, 'neuron_dra_claim_device_info{pod="small"}', 60, what="the small pod's series")
    assert [(s["metric"]["node"], s["metric"]["device"], s["metric"]["neuroncores"]) for s in answer] == [
        (NODE2, core_device, workloads["small"]["NEURON_RT_VISIBLE_CORES"])]


def test_every_query_of_the_dashboard_returns_data(cluster: LocalCluster,
                                                  workloads: dict[str, dict[str, str]]) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    # The node's neuron-monitor stand-in (localcluster/nodes/neuron_monitor_emulator.py), driven like the fault
    # emulation: a runtime on the holder's cores (the ids the container sees), each core's utilisation its id / 100.
    seen = workloads["holder"]["NEURON_RT_VISIBLE_CORES"]
    cores = parse_cores(seen)
    for c in cores:
        assert cli_main(["emulate-utilisation", str(cluster.dir), "--node", NODE1, "--runtime-tag", str(c),
                         "--cores", str(c), "--ratio", str(c / 100), "--device-memory", "64"]) == 0
    answers = promql.dashboard_answers(url, 90)
    # The join: the holder's utilisation is the mean of its cores' (neuron-monitor's ids are the cores it sees).
    mean = pytest.approx(sum(cores) / len(cores) / 100)
    assert promql.values(answers[UTILISATION_PER_POD], "namespace", "pod") == {(NS, "holder"): mean}
    assert promql.values(answers[UTILISATION_PER_CLAIM], "claim") == {("device-3",): mean}


def test_the_series_go_with_the_pod(cluster: LocalCluster, kapi: client.ApiClient,
                                    workloads: dict[str, dict[str, str]]) -> None:
    assert cluster.prometheus
    url = cluster.prometheus
    core = client.CoreV1Api(kapi)
    core.delete_namespaced_pod("holder", NS, grace_period_seconds=0)
    promql.gone(url, 'neuron_dra_claim_device_info{pod="holder"}', 90,
                what="the holder's series gone after its claim was unprepared")
    free = query(url, f'neuron_dra_node_devices{{node="{NODE1}", state="free"}}')
    assert [s["value"][1] for s in free] == ["16"]
