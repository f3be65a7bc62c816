"""DRANET's names, DeviceClass and device attributes: one definition the checks, components and emulator share."""

from __future__ import annotations

from neuron_dra.claim_templates import ClaimTemplate, Efa, Neuron
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.checks import Checker
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.claim_templates.node_model import NodeModel, build_node
from neuron_dra.driver.model import efa
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.localcluster.nodes import efa_emulator


def _trn2_node(drivers: Drivers = DEFAULT_DRIVERS) -> NodeModel:
    return build_node(emulated_host("trn2.48xlarge", catalog=BUILTIN), "n1", drivers)


def test_the_checks_and_the_emulator_use_the_charts_device_class() -> None:
    classes = {c["metadata"]["name"]: c for c in DEFAULT_DRIVERS.device_classes()}
    assert classes[efa.EFA_DEVICE_CLASS] == efa.efa_device_class() == efa_emulator.efa_device_class()
    assert classes[efa.EFA_DEVICE_CLASS]["spec"]["selectors"] == [{"cel": {"expression": (
        'device.driver == "dra.net" &&\n'
        "device.attributes[\"dra.net\"].pciDevice == 'Elastic Fabric Adapter (EFA)'\n")}}]


def test_emulated_efa_devices_carry_what_dranet_publishes() -> None:
    host = emulated_host("trn2.48xlarge", catalog=BUILTIN)
    devices = efa_emulator.efa_devices(host)
    assert len(devices) == 16
    attrs = devices[0]["attributes"]
    assert attrs["dra.net/pciDevice"] == {"string": "Elastic Fabric Adapter (EFA)"}
    assert attrs["dra.net/rdma"] == {"bool": True}
    bdf = attrs["dra.net/pciAddress"]["string"]
    assert attrs["resource.aws.com/devicegroup1_id"] == {"string": bdf}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": f"pci{bdf.split(':')[0]}:{bdf.split(':')[1]}"}
    assert {"resource.aws.com/devicegroup4_id", "resource.aws.com/devicegroup8_id",
            "resource.aws.com/devicegroup16_id"} <= set(attrs)


def test_the_class_selector_matches_every_modelled_efa_and_nothing_else() -> None:
    node = _trn2_node()
    cel = CelEnvironment()
    selector = cel.compile(efa.efa_device_class_expression())
    matched = [d for d in node.devices if cel.evaluate(selector, d)]
    assert len(matched) == 16
    assert {d.driver for d in matched} == {"dra.net"}


def test_an_aligned_efa_template_passes_the_check_with_the_charts_selector() -> None:
    result = Checker().check(ClaimTemplate("aligned", Neuron(4), Efa(4)), ["trn2.48xlarge"])
    assert result.ok, result


def test_a_renamed_efa_driver_carries_into_class_and_devices() -> None:
    drivers = Drivers(efa_driver="efa.example.com")
    node = _trn2_node(drivers)
    efa_slices = [s for s in node.slices if s["spec"]["driver"] == "efa.example.com"]
    assert efa_slices and all("efa.example.com/pciDevice" in d["attributes"]
                              for d in efa_slices[0]["spec"]["devices"])
    cls = next(c for c in drivers.device_classes() if c["metadata"]["name"] == drivers.efa_class)
    assert 'device.attributes["efa.example.com"].pciDevice' in cls["spec"]["selectors"][0]["cel"]["expression"]
    result = Checker(drivers).check(ClaimTemplate("aligned", Neuron(4), Efa(4)), ["trn2.48xlarge"])
    assert result.ok, result
