"""Utilisation per pod and per claim, end to end on the local cluster (docs/utilisation.md): `cluster up
--prometheus` (fake runtime: the drivers as host processes, a real Prometheus built from the Go module proxy, a
neuron-monitor stand-in per node), a pod holding a Neuron device, its cores made busy with `neuron-dra
emulate-utilisation`, and every query of the emitted dashboard answered by that Prometheus with data; the
utilisation and memory panels give that pod's and claim's values and nothing for a busy core no pod holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from neuron_dra.cli import main as cli_main
from neuron_dra.cli.emulate_utilisation import parse_cores
from neuron_dra.driver.deploy.dashboard import MEMORY_PER_POD, UTILISATION_PER_CLAIM, UTILISATION_PER_POD
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane.prometheus import targets_up
from tests.support import promql
from tests.support.e2e import NEURON_TOLERATION, eventually

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
           prometheus=True)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def holder(cluster: LocalCluster) -> dict[str, str]:
    """Pod `holder` with claim `device-3` (neuron-device-3): its attribution series as Prometheus has them."""
    api = config.new_client_from_config(str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(NS).items), 30, what="default SA")
    res.create_namespaced_resource_claim(NS, {  # type: ignore[arg-type]
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "device-3"},
        "spec": {"devices": {"requests": [{"name": "neuron", "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].deviceId == 3'}}]}}]}}})
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
