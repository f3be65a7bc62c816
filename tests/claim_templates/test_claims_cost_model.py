"""The control-plane cost model of `claims check --nodes N` (claim_templates/scale.py): the scheduler's filter
work plus the other components per claim pod, the cores a rate needs, and the same count of evaluations for our
templates as for the claims AWS's documentation gives (bench_scale's comparison)."""

from __future__ import annotations

import pytest

from neuron_dra.claim_templates import ALL, ClaimTemplate, Connected, Efa, Neuron
from neuron_dra.claim_templates.examples import neuron_1x4_connected, one_neuron_device
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.scale import CONTROL_PLANE_MS, estimate, estimate_spec, selector_evaluations

CATALOG = NodeCatalog(partitionable=False)
TRN2 = 'device.attributes["neuron.aws.com"].instanceType == "trn2.48xlarge"'


def _aws(count: int, selector: str | None, cls: str = "neuron.aws.com", name: str = "neurons") -> dict[str, object]:
    exactly: dict[str, object] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


@pytest.mark.parametrize(("ours", "aws"), [
    (one_neuron_device, {"devices": {"requests": [_aws(1, TRN2)]}}),
    (neuron_1x4_connected, {"devices": {"requests": [_aws(4, TRN2)],
                                        "constraints": [{"matchAttribute": "resource.aws.com/devicegroup4_id"}]}}),
    (ClaimTemplate("e", Neuron(8, topology=Connected()), Efa(8)),
     {"devices": {"requests": [_aws(8, None, name="neuron"), _aws(8, None, "efa.networking.k8s.aws", "efa")],
                  "constraints": [{"requests": ["neuron", "efa"],
                                   "matchAttribute": "resource.aws.com/devicegroup8_id"}]}}),
], ids=["1-device", "4-connected", "8-connected-efa"])
def test_our_templates_make_as_many_evaluations_as_aws_claims(ours: ClaimTemplate, aws: dict[str, object]) -> None:
    trn2 = CATALOG.node("trn2.48xlarge")
    assert selector_evaluations(ours, trn2) == selector_evaluations(aws, trn2)
    assert estimate(ours, 1000, catalog=CATALOG).cpu_ms_per_pod == \
        estimate_spec("aws", aws, 1000, catalog=CATALOG).cpu_ms_per_pod


def test_the_other_components_grow_with_the_devices_a_claim_gets() -> None:
    one = estimate(one_neuron_device, 1000, catalog=CATALOG)
    eight = estimate(ClaimTemplate("e", Neuron(8, topology=Connected()), Efa(8)), 1000, catalog=CATALOG)
    assert set(one.others_ms_per_pod) == set(CONTROL_PLANE_MS) == {"kube-apiserver", "etcd",
                                                                    "kube-controller-manager"}
    for name, (base, per_device) in CONTROL_PLANE_MS.items():
        assert one.others_ms_per_pod[name] == pytest.approx(base + per_device)
        assert eight.others_ms_per_pod[name] == pytest.approx(base + 16 * per_device)  # 8 Neuron devices + 8 EFAs
    total = (one.cpu_ms_per_pod + sum(one.others_ms_per_pod.values())) / 1e3
    assert one.control_plane_s_per_pod == pytest.approx(total)
    assert one.cores_for(50) == pytest.approx(50 * total)
    json = one.to_json()
    assert json["controlPlaneCpuSPerPod"] == round(total, 4)
    assert set(json["controlPlaneCpuMsPerPod"]) == {"kube-scheduler", *CONTROL_PLANE_MS}


def test_all_mode_counts_the_nodes_whole_devices() -> None:
    every = estimate(ClaimTemplate("a", Neuron(ALL, instance_types="trn2.48xlarge")), 100, catalog=CATALOG)
    base, per_device = CONTROL_PLANE_MS["etcd"]
    assert every.others_ms_per_pod["etcd"] == pytest.approx(base + 16 * per_device)
