"""NeuronCores claims: the typed request, the counters in the allocator simulation, and claims per node."""

from __future__ import annotations

from typing import Any

import pytest

from neuron_dra.claim_templates import Checker, ClaimTemplate, Neuron, NeuronCores, TemplateError
from neuron_dra.claim_templates.allocator import DeviceId, Simulator, simulate
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.driver.model.partitions import parse_core_device

DRIVER = "neuron.aws.com"


@pytest.fixture(scope="module")
def catalog() -> NodeCatalog:
    return NodeCatalog()


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker()


def _claim(template: ClaimTemplate, name: str = "c") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": template.claim_spec()}


def test_neuron_cores_renders_one_aligned_group_of_the_core_class() -> None:
    spec = ClaimTemplate("t", NeuronCores(4, instance_types="trn2.48xlarge")).claim_spec()
    (request,) = spec["devices"]["requests"]
    assert request["name"] == "cores" and request["exactly"]["deviceClassName"] == "neuroncore.aws.com"
    assert request["exactly"]["count"] == 4
    assert spec["devices"]["constraints"] == [{"requests": ["cores"], "matchAttribute": "neuron.aws.com/coreGroup4_id"}]
    one = ClaimTemplate("t", NeuronCores(1)).claim_spec()
    assert "constraints" not in one["devices"]


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    ({"count": 3}, "NeuronCores.count", "the aligned core group sizes of"),
    ({"count": 8, "node_lnc": 2, "instance_types": "trn2.48xlarge"}, "NeuronCores.count", "trn2.48xlarge: 1, 2, 4$"),
    ({"count": 4, "instance_types": "trn1.32xlarge"}, "NeuronCores.count", "trn1.32xlarge: 1, 2$"),
    ({"node_lnc": 2, "instance_types": "inf2.xlarge"}, "NeuronCores.node_lnc",
     "no node_lnc on inf2.xlarge.*drop node_lnc"),
    ({"instance_types": "trn9.huge"}, "NeuronCores.instance_types", "trn2.48xlarge"),
])
def test_neuron_cores_refuses_what_cannot_fit(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(TemplateError, match=allowed) as e:
        NeuronCores(**kwargs)
    assert e.value.field == field


def test_claims_per_node_follow_the_counters(checker: Checker) -> None:
    cases = {
        ClaimTemplate("one", NeuronCores(1)): {"trn2.48xlarge": 64, "trn1.32xlarge": 32, "inf2.xlarge": 2},
        ClaimTemplate("two", NeuronCores(2)): {"trn2.48xlarge": 32, "trn1.32xlarge": 16, "inf2.xlarge": 1},
        ClaimTemplate("four", NeuronCores(4, families="trn2")): {"trn2.48xlarge": 16},
        ClaimTemplate("device", Neuron(1)): {"trn2.48xlarge": 16, "trn1.32xlarge": 16, "inf2.xlarge": 1},
    }
    for template, want in cases.items():
        report = checker.check(template, list(want))
        assert {f.instance_type: f.claims_per_node for f in report.fits} == want, template.name


def test_whole_devices_and_cores_never_overlap_in_the_allocator(catalog: NodeCatalog) -> None:
    node = catalog.node("trn2.48xlarge")
    sim = Simulator(node.slices, node.device_classes, node.node_name)
    one_core = _claim(ClaimTemplate("one", NeuronCores(1)))
    device = _claim(ClaimTemplate("dev", Neuron(1)))
    # One core taken on device 0: 15 whole devices left, and 63 cores.
    first = sim.allocate([one_core])
    assert first is not None
    (taken,) = first[0]
    assert taken.device == "neuron-device-0-core-0"  # first fit: the first slice by name holds device 0's cores
    allocated = [DeviceId(DRIVER, node.node_name, taken.device)]
    devices = simulate(node.slices, node.device_classes, [device], node_name=node.node_name, allocated=allocated,
                       mode="count")
    assert devices.count == 15
    assert all(r.device != "neuron-device-0" for round_ in devices.allocation for r in round_)
    cores = simulate(node.slices, node.device_classes, [one_core], node_name=node.node_name, allocated=allocated,
                     mode="count")
    assert cores.count == 63
    # A whole device taken: none of its 4 cores.
    taken_device = [DeviceId(DRIVER, node.node_name, "neuron-device-5")]
    cores = simulate(node.slices, node.device_classes, [one_core], node_name=node.node_name,
                     allocated=taken_device, mode="count")
    got = {parse_core_device(r.device) for round_ in cores.allocation for r in round_}
    assert cores.count == 60 and not any(c is not None and c[0] == 5 for c in got)


def test_core_groups_are_aligned_ranges_and_fill_around_taken_cores(catalog: NodeCatalog) -> None:
    node = catalog.node("trn2.48xlarge")
    pair = _claim(ClaimTemplate("pair", NeuronCores(2)))
    # Core 1 of device 0 taken: the pair (0, 1) is gone, (2, 3) is not.
    allocated = [DeviceId(DRIVER, node.node_name, "neuron-device-0-core-1")]
    r = simulate(node.slices, node.device_classes, [pair], node_name=node.node_name, allocated=allocated)
    assert sorted(d.device for d in r.allocation[0]) == ["neuron-device-0-core-2", "neuron-device-0-core-3"]
    r = simulate(node.slices, node.device_classes, [pair], node_name=node.node_name, allocated=allocated,
                 mode="count")
    assert r.count == 31


def test_without_partitionable_devices_nothing_consuming_counters_is_allocated(catalog: NodeCatalog) -> None:
    node = catalog.node("trn2.48xlarge")
    sim = Simulator(node.slices, node.device_classes, node.node_name, partitionable=False)
    assert sim.allocate([_claim(ClaimTemplate("one", NeuronCores(1)))]) is None
    assert sim.allocate([_claim(ClaimTemplate("dev", Neuron(1)))]) is None  # whole devices consume counters too
