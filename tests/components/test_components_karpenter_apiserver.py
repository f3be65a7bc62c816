"""The Karpenter objects `neuron-dra plan -o yaml` prints, against a real kube-apiserver serving Karpenter's own CRDs.

The CRDs come from the pinned Karpenter release (tests/support/karpenter.py); the NodePools and EC2NodeClasses of
Pulumi.karpenter-example.yaml (a static trn2.48xlarge Capacity Block pool, a dynamic trn1 pool) are created with
strict field validation, so their schemas and CEL rules judge every field as they would on EKS; objects with a
wrong field are refused there, each for its own reason.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from neuron_dra.components import plan
from tests.support import karpenter

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PLURALS = {"NodePool": ("karpenter.sh", "v1", "nodepools"),
           "EC2NodeClass": ("karpenter.k8s.aws", "v1", "ec2nodeclasses")}


@pytest.fixture(scope="module")
def crds(api: Any) -> list[str]:
    ext = client.ApiextensionsV1Api(api)
    definitions = dynamic.DynamicClient(api).resources.get(api_version="apiextensions.k8s.io/v1",
                                                           kind="CustomResourceDefinition")
    names = []
    for crd in karpenter.crds():
        definitions.create(body=crd)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + 60
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                pending.discard(name)
        time.sleep(0.5)
    assert not pending, f"CRDs not established: {pending}"
    return names


@pytest.fixture(scope="module")
def planned() -> list[dict[str, Any]]:
    run = plan.plan(plan.load_config_file(ROOT / "Pulumi.karpenter-example.yaml"))
    return [m for m in plan.kubernetes_manifests(run) if m["kind"] in PLURALS]


def create(api: Any, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    group, version, plural = PLURALS[manifest["kind"]]
    created = client.CustomObjectsApi(api).create_cluster_custom_object(
        group, version, plural, manifest, field_validation="Strict", dry_run="All" if dry_run else None)
    assert isinstance(created, dict)
    return created


def test_karpenter_accepts_every_planned_pool_and_node_class(api: Any, crds: list[str],
                                                             planned: list[dict[str, Any]]) -> None:
    assert sorted(m["kind"] for m in planned) == ["EC2NodeClass", "EC2NodeClass", "NodePool", "NodePool"]
    stored = {(m["kind"], m["metadata"]["name"]): create(api, m) for m in planned}
    static = stored[("NodePool", "trn2-block")]["spec"]
    assert static["replicas"] == 2 and static["template"]["spec"]["expireAfter"] == "Never"
    dynamic = stored[("NodePool", "trn1")]["spec"]
    assert dynamic["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert dynamic["disruption"]["budgets"] == [{"nodes": "10%"}]  # the CRD's default, applied by the apiserver
    node_class = stored[("EC2NodeClass", "trn2-block")]["spec"]
    assert len(node_class["networkInterfaces"]) == 17
    assert node_class["capacityReservationSelectorTerms"] == [{"id": "cr-0123456789abcdef0"}]
    assert node_class["metadataOptions"]["httpPutResponseHopLimit"] == 1


def _static_pool(planned: list[dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(next(m for m in planned if m["kind"] == "NodePool" and "replicas" in m["spec"]))


def _efa_class(planned: list[dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(next(m for m in planned if m["kind"] == "EC2NodeClass" and "networkInterfaces" in m["spec"]))


def _weight(m: dict[str, Any]) -> None:
    m["spec"]["weight"] = 10


def _karpenter_label(m: dict[str, Any]) -> None:
    m["spec"]["template"]["metadata"]["labels"]["karpenter.sh/team"] = "x"


def _cpu_limit(m: dict[str, Any]) -> None:
    m["spec"]["limits"]["cpu"] = "1000"


def _efa_type(m: dict[str, Any]) -> None:
    m["spec"]["networkInterfaces"][1]["interfaceType"] = "efa"


def _efa_only_primary(m: dict[str, Any]) -> None:
    m["spec"]["networkInterfaces"][0]["interfaceType"] = "efa-only"


def _two_efa_on_one_card(m: dict[str, Any]) -> None:
    m["spec"]["networkInterfaces"][2]["networkCardIndex"] = 0
    m["spec"]["networkInterfaces"][2]["deviceIndex"] = 2


def _misspelt(m: dict[str, Any]) -> None:
    m["spec"]["metadataOption"] = m["spec"].pop("metadataOptions")


def _reservation(m: dict[str, Any]) -> None:
    m["spec"]["capacityReservationSelectorTerms"] = [{"id": "reservation-1"}]


def _hop_limit(m: dict[str, Any]) -> None:
    m["spec"]["metadataOptions"]["httpPutResponseHopLimit"] = 65


REFUSED = [
    ("pool", _weight, "'weight' is not supported on static NodePools", 422),
    ("pool", _karpenter_label, 'label domain \\"karpenter.sh\\" is restricted', 422),
    ("pool", _cpu_limit, "only 'limits.nodes' is supported on static NodePools", 422),
    ("class", _efa_type, "Unsupported value: \\\"efa\\\"", 422),
    ("class", _efa_only_primary, "must include a primary interface with interfaceType='interface'", 422),
    ("class", _two_efa_on_one_card, "at most one efa device per network card", 422),
    # Strict decoding refuses an unknown field as a bad request, before any validation.
    ("class", _misspelt, 'unknown field \\"spec.metadataOption\\"', 400),
    ("class", _reservation, "spec.capacityReservationSelectorTerms[0].id", 422),
    ("class", _hop_limit, "should be less than or equal to 64", 422),
]


@pytest.mark.parametrize(("which", "change", "message", "status"), REFUSED,
                         ids=[r[1].__name__.strip("_") for r in REFUSED])
def test_karpenters_schemas_refuse_a_wrong_field(api: Any, crds: list[str], planned: list[dict[str, Any]],
                                                 which: str, change: Any, message: str, status: int) -> None:
    manifest = _static_pool(planned) if which == "pool" else _efa_class(planned)
    manifest["metadata"]["name"] = f"refused-{change.__name__.strip('_').replace('_', '-')}"
    create(api, copy.deepcopy(manifest), dry_run=True)  # the unchanged object passes
    change(manifest)
    with pytest.raises(ApiException) as err:
        create(api, manifest, dry_run=True)
    body = str(err.value.body)
    assert err.value.status == status, body
    assert message in body, body
