"""End-to-end: `cluster up --node trn3.48xlarge:1` and a node of an instance type from a catalog file, against the
real kube-apiserver, kube-scheduler and kubelet: the slices the drivers publish, and claims the scheduler allocates
exactly as the claim checks predict (16 connected Trainium3 devices once per node)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron
from neuron_dra.claim_templates.checks import Checker
from neuron_dra.driver.model.catalog_file import load_catalog
from neuron_dra.localcluster.cluster import LocalCluster, up
from neuron_dra.localcluster.nodes.topology import NodePaths
from tests.support.e2e import (
    allocated_devices,
    created_container,
    eventually,
    pod_claim,
    pod_phase,
    pod_with_template,
    raw,
    unschedulable,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DRIVER = "neuron.aws.com"
TRN3, ACME = "trn3-48xlarge-1", "acme1-24xlarge-1"
CATALOG = {"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "instanceTypes": {
    "acme1.24xlarge": {"family": "trn3", "devices": 8, "topology": "all-to-all", "hbmGiB": 128}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    base = tmp_path_factory.mktemp("trn3")
    catalog = base / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG), encoding="utf-8")
    c = up(base / "cluster", ["trn3.48xlarge:1", "acme1.24xlarge:1"], ttl=1800, timeout=600, catalog_file=catalog,
           runtime="fake")
    try:
        yield c, catalog
    finally:
        c.down()


@pytest.fixture(scope="module")
def api(cluster: tuple[LocalCluster, Path]) -> Iterator[client.ApiClient]:
    a = config.new_client_from_config(str(cluster[0].kubeconfig))
    yield a
    a.close()


WHOLE_DEVICE = re.compile(r"^neuron-device-\d+$")  # not the NeuronCore partitions published beside them


def _devices(res: client.ResourceV1Api, node: str, count: int) -> list[dict[str, Any]] | None:
    slices = raw(res.list_resource_slice(_preload_content=False))["items"]
    found = [d for s in slices if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER
             for d in s["spec"].get("devices") or [] if WHOLE_DEVICE.match(d["name"])]
    return found if len(found) == count else None


def test_the_drivers_publish_trn3_and_the_catalog_type(api: client.ApiClient) -> None:
    res = client.ResourceV1Api(api)
    trn3 = eventually(lambda: _devices(res, TRN3, 16), what="trn3 slices")
    for d in trn3:
        assert d["capacity"]["memory"]["value"] == "144Gi" and d["capacity"]["cores"]["value"] == "8"
        assert d["attributes"]["topologyKind"] == {"string": "all-to-all"}
        assert not {"topology_x", "topology_y", "topology4_id", "topology8_id"} & set(d["attributes"])
    acme = eventually(lambda: _devices(res, ACME, 8), what="catalog-type slices")
    assert {d["capacity"]["memory"]["value"] for d in acme} == {"128Gi"}
    assert {d["attributes"]["instanceType"]["string"] for d in acme} == {"acme1.24xlarge"}


@pytest.mark.parametrize(("node", "count", "instance_type"), [(TRN3, 16, "trn3.48xlarge"),
                                                               (ACME, 8, "acme1.24xlarge")])
def test_connected_claims_run_as_predicted(cluster: tuple[LocalCluster, Path], api: client.ApiClient, node: str,
                                           count: int, instance_type: str) -> None:
    hardware = load_catalog(cluster[1])
    template = ClaimTemplate(f"all-{count}", Neuron(count, topology=Connected(), instance_types=instance_type,
                                                    catalog=hardware))
    predicted = Checker(hardware=hardware).check(template, [instance_type]).fit(instance_type).claims_per_node
    assert predicted == 1
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    ns = f"trn3-{count}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(ns).items),
               what="the namespace's default service account")
    manifest = template.to_manifest()
    manifest["metadata"]["namespace"] = ns
    res.create_namespaced_resource_claim_template(ns, manifest)  # type: ignore[arg-type]
    core.create_namespaced_pod(ns, pod_with_template("first", template.name, node=node))  # type: ignore[arg-type]
    try:
        eventually(lambda: pod_phase(core, ns, "first") == "Running", timeout=120, what="the first pod to run")
    except AssertionError:
        pod = raw(core.read_namespaced_pod("first", ns, _preload_content=False))
        events = [e.message for e in core.list_namespaced_event(ns).items]
        raise AssertionError(f"pod status {pod.get('status')}; events {events}") from None
    claim = pod_claim(core, res, ns, "first")
    assert sorted(allocated_devices(claim, DRIVER)) == sorted(f"neuron-device-{i}" for i in range(count))
    # Only after the first runs: created together, the scheduler may pick either one first.
    core.create_namespaced_pod(ns, pod_with_template("second", template.name, node=node))  # type: ignore[arg-type]
    eventually(lambda: unschedulable(core, ns, "second"), timeout=60, what="the second pod to stay unschedulable")
    created = created_container(NodePaths.of(cluster[0].dir, node).cri_records, ns, "first")
    assert len(created["deviceNodes"]) == count
    assert created["env"]["NEURON_RT_VISIBLE_CORES"] == f"0-{count * 4 - 1}"  # LNC 2: 4 logical cores per device
