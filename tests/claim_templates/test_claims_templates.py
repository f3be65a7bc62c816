"""Typed claim template classes: what they render, and bad input refused at construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import (
    ALL,
    AtLeast,
    ClaimTemplate,
    Connected,
    Drivers,
    Efa,
    FirstAvailable,
    GroupAttribute,
    Neuron,
    NeuronCores,
    OpaqueConfig,
    RingSegment,
    TemplateError,
    UltraServerNode,
    to_yaml_documents,
)
from neuron_dra.claim_templates.cel_env import CelDevice, CelEnvironment
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.node_model import NodeCatalog

D = "device.attributes['neuron.aws.com']"


def devices_of(t: ClaimTemplate) -> dict[str, Any]:
    return dict(t.to_manifest()["spec"]["spec"]["devices"])


def test_manifest_shape() -> None:
    t = ClaimTemplate("train", Neuron(4, topology=Connected(), instance_types="trn2.48xlarge", lnc=1),
                      namespace="ml", labels={"team": "a"}, claim_labels={"app": "x"})
    m = t.to_manifest()
    assert m["apiVersion"] == "resource.k8s.io/v1" and m["kind"] == "ResourceClaimTemplate"
    assert m["metadata"] == {"name": "train", "namespace": "ml", "labels": {"team": "a"}}
    assert m["spec"]["metadata"] == {"labels": {"app": "x"}}
    assert m["spec"]["spec"]["devices"] == {
        "requests": [{"name": "neurons", "exactly": {
            "deviceClassName": "neuron.aws.com",
            # No resourceType selector: trn2.48xlarge publishes no UltraServer pseudo-device and the class keeps
            # NeuronCores out, so it would only be one more CEL evaluation per device.
            "selectors": [{"cel": {"expression": f"{D}.instanceType == 'trn2.48xlarge'"}}],
            "allocationMode": "ExactCount", "count": 4}}],
        "constraints": [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}],
        "config": [{"opaque": {"driver": "neuron.aws.com", "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}},
            "requests": ["neurons"]}],
    }
    assert yaml.safe_load(t.to_yaml()) == m
    assert list(yaml.safe_load_all(to_yaml_documents([t, t]))) == [m, m]
    with pytest.raises(FrozenInstanceError):
        t.name = "other"  # type: ignore[misc]


def test_group_attribute_is_aws_compatible_where_every_target_publishes_it() -> None:
    def attribute(n: Neuron) -> str:
        return str(devices_of(ClaimTemplate("t", n))["constraints"][0]["matchAttribute"])

    assert attribute(Neuron(8, topology=Connected(), families=("trn1", "trn2"))) == "resource.aws.com/devicegroup8_id"
    # inf2.48xlarge offers groups of 4 but no devicegroup ids: our topology ids work on both kinds.
    assert attribute(Neuron(4, topology=Connected())) == "neuron.aws.com/topology4_id"
    assert attribute(Neuron(4, topology=Connected(attribute=GroupAttribute.NEURON), instance_types="trn2.48xlarge")
                     ) == "neuron.aws.com/topology4_id"
    assert attribute(Neuron(3, topology=RingSegment(), families="inf2")) == "neuron.aws.com/topology3_id"
    assert attribute(Neuron(2, topology=Connected(4), instance_types="trn2.48xlarge")
                     ) == "resource.aws.com/devicegroup4_id"
    # One device is always connected: no constraint, so it also works where no topology id is published.
    assert "constraints" not in devices_of(ClaimTemplate("t", Neuron(1, topology=Connected())))
    custom = Drivers(neuron_driver="neuron.example.com", neuron_class="neurons")
    d = devices_of(ClaimTemplate("t", Neuron(4, topology=Connected()), drivers=custom))
    assert d["constraints"][0]["matchAttribute"] == "neuron.example.com/topology4_id"
    assert d["requests"][0]["exactly"]["deviceClassName"] == "neurons"
    assert "selectors" not in d["requests"][0]["exactly"]  # the group constraint keeps the pseudo-device out
    one = devices_of(ClaimTemplate("t", Neuron(1), drivers=custom))["requests"][0]["exactly"]
    assert "device.attributes['neuron.example.com']" in one["selectors"][0]["cel"]["expression"]


def test_every_neuron_request_guards_against_the_ultraserver_pseudo_device() -> None:
    node = NodeCatalog().node("trn2u.48xlarge")
    pseudo = next(d for d in node.devices if d.name.endswith("/neuron-node"))
    env = CelEnvironment()
    for n in (Neuron(ALL), Neuron(16), Neuron(1, kernel_driver="2.25.4.0"), Neuron(2, families="trn2u")):
        selectors = devices_of(ClaimTemplate("t", n))["requests"][0]["exactly"]["selectors"]
        assert not all(env.evaluate(s["cel"]["expression"], pseudo) for s in selectors)


def test_efa_alignment_and_first_available_render() -> None:
    d = devices_of(ClaimTemplate("t", Neuron(8, topology=Connected(), instance_types="trn2.48xlarge"), Efa(8)))
    assert d["constraints"] == [{"requests": ["neurons", "efa"], "matchAttribute": "resource.aws.com/devicegroup8_id"}]
    assert d["requests"][1] == {"name": "efa", "exactly": {"deviceClassName": "efa.networking.k8s.aws",
                                                           "allocationMode": "ExactCount", "count": 8}}
    assert devices_of(ClaimTemplate("t", Neuron(1), Efa(1)))["constraints"][0]["matchAttribute"] == \
        "resource.aws.com/devicegroup1_id"
    assert "constraints" not in devices_of(ClaimTemplate("t", Neuron(2), Efa(1, aligned_to=None)))
    fa = devices_of(ClaimTemplate("t", FirstAvailable(
        Neuron(8, topology=Connected(), instance_types="trn2.48xlarge", lnc=1), Neuron(16, families="trn1"))))
    assert [s["name"] for s in fa["requests"][0]["firstAvailable"]] == ["option1", "option2"]
    assert fa["constraints"] == [{"requests": ["neurons/option1"],
                                  "matchAttribute": "resource.aws.com/devicegroup8_id"}]
    assert fa["config"][0]["requests"] == ["neurons/option1"]


def test_generated_selectors_select_what_they_say() -> None:
    catalog = NodeCatalog()
    env = CelEnvironment()

    classes = {c["metadata"]["name"]: c for c in DEFAULT_DRIVERS.device_classes()}

    def selected(n: Neuron, instance_type: str) -> list[CelDevice]:
        exactly = devices_of(ClaimTemplate("t", n))["requests"][0]["exactly"]
        # The class's selectors first, as the scheduler evaluates them (they keep NeuronCores out).
        exprs = [s["cel"]["expression"] for s in classes[exactly["deviceClassName"]]["spec"]["selectors"]]
        exprs += [s["cel"]["expression"] for s in exactly["selectors"]]
        return [d for d in catalog.node(instance_type).devices
                if d.driver == "neuron.aws.com" and all(env.evaluate(e, d) for e in exprs)]

    assert len(selected(Neuron(1, kernel_driver=AtLeast("2.25")), "trn2.48xlarge")) == 16
    assert len(selected(Neuron(1, kernel_driver=AtLeast("2.25.4.0")), "trn2.48xlarge")) == 16
    assert selected(Neuron(1, kernel_driver=AtLeast("2.25.4.1")), "trn2.48xlarge") == []
    assert selected(Neuron(1, kernel_driver=AtLeast("3")), "trn2.48xlarge") == []
    assert len(selected(Neuron(1, min_memory="64Gi"), "trn2.48xlarge")) == 16
    assert selected(Neuron(1, min_memory="64Gi"), "inf2.48xlarge") == []
    assert selected(Neuron(1, min_cores=8), "trn1.32xlarge") == []
    assert len(selected(Neuron(1, families="inf2"), "inf2.24xlarge")) == 6
    assert selected(Neuron(2, topology=RingSegment(2), families="inf2"), "trn2.48xlarge") == []


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: Neuron(6, topology=Connected(), instance_types="trn2.48xlarge"),
     "Connected.size: 6 is not allowed; allowed: the connected group sizes of trn2.48xlarge: 1, 4, 8, 16"),
    (lambda: Neuron(4, topology=RingSegment(), instance_types="inf2.24xlarge"), "1, 2, 3, 6"),
    (lambda: Neuron(2, topology=RingSegment(), instance_types="trn2.48xlarge"), "RingSegment on ring hosts only"),
    (lambda: Neuron(8, topology=Connected(4)), "Neuron.count: 8"),
    (lambda: Neuron(ALL, topology=Connected(4)), "Neuron.count: 'ALL'"),
    (lambda: Neuron(0), "Neuron.count: 0"),
    (lambda: Neuron(33), "an integer from 1 to 32"),
    (lambda: Neuron(17, instance_types="trn2.48xlarge"), "1 to 16 on trn2.48xlarge"),
    (lambda: Neuron(True), "Neuron.count: True"),
    (lambda: Neuron(1, name="Neurons"), "Neuron.name: 'Neurons'"),
    (lambda: Neuron(1, instance_types="trn9.48xlarge"), "Neuron.instance_types: 'trn9.48xlarge'"),
    (lambda: Neuron(1, families="p5"), "Neuron.families: 'p5'"),
    (lambda: Neuron(1, instance_types="trn1.2xlarge", families="inf2"), "families that contain"),
    (lambda: Neuron(1, lnc=1), "LNC only on Trainium2"),
    (lambda: Neuron(1, lnc=1, families="trn1"), "trn1.2xlarge"),
    (lambda: Neuron(1, lnc=1, families="inf2"), "inf2.xlarge"),
    (lambda: Neuron(1, lnc=3, families="trn2"), "Neuron.lnc: 3"),
    (lambda: Neuron(1, kernel_driver="2.25"), "a 4-part version"),
    (lambda: AtLeast("2.x"), "AtLeast.version"),
    (lambda: Neuron(1, min_memory="lots"), "Neuron.min_memory: 'lots'"),
    (lambda: Neuron(1, min_memory="160Gi"), "at most 144Gi"),
    (lambda: Neuron(1, min_memory="128Gi", families="trn2"), "at most 96Gi"),
    (lambda: Neuron(1, min_cores=9), "1 to 8"),
    (lambda: Neuron(1, selectors="device.attributes['neuron.aws.com'].x =="), "a valid device selector"),
    (lambda: Connected(attribute="aws"), "Connected.attribute"),  # type: ignore[arg-type]
    (lambda: Neuron(4, topology=Connected(attribute=GroupAttribute.AWS), families="inf2"), "'aws' needs"),
    (lambda: UltraServerNode(3), "UltraServerNode.mode: 3 is not allowed; allowed: 1 or 2 or 4"),
    (lambda: UltraServerNode(4, lnc=0), "UltraServerNode.lnc"),
    (lambda: Efa(0), "Efa.count"),
    (lambda: Efa(1, group=2), "Efa.group"),
    (lambda: FirstAvailable(), "1 to 8 alternatives"),
    (lambda: FirstAvailable(*[Neuron(1)] * 9), "1 to 8 alternatives"),
    (lambda: FirstAvailable(Neuron(1, name="a"), Neuron(2, name="a")), "distinct alternative names"),
    (lambda: ClaimTemplate("t"), "1 to 32 requests"),
    (lambda: ClaimTemplate("t", *[Neuron(1, name=f"r{i}") for i in range(33)]), "1 to 32 requests"),
    (lambda: ClaimTemplate("t", Neuron(16), Neuron(16, name="more"), Efa(1)),
     "ClaimTemplate 't' requests: '33 devices (neurons 16, more 16, efa 1)' is not allowed; allowed: at most 32 "
     "devices per claim (the API's limit on a claim's results); split the requests over two templates"),
    (lambda: Neuron(1, min_memory="64"), "Neuron.min_memory: '64' is not allowed; allowed: a quantity with a unit "
     "such as '64Gi' (a bare number is bytes)"),
    (lambda: ClaimTemplate("t", Neuron(1), Neuron(2)), "distinct request names"),
    (lambda: ClaimTemplate("Bad", Neuron(1)), "ClaimTemplate.name: 'Bad'"),
    (lambda: ClaimTemplate("t", Neuron(1), namespace="a.b"), "ClaimTemplate.namespace"),
    (lambda: ClaimTemplate("t", Neuron(1), labels={"bad key!": "x"}), "ClaimTemplate.labels key"),
    (lambda: ClaimTemplate("t", Neuron(1), labels={"k": "-x"}), "ClaimTemplate.labels['k']"),
    (lambda: ClaimTemplate("t", Neuron(1), Efa(1, aligned_to="gpus")), "Efa.aligned_to: 'gpus'"),
    (lambda: ClaimTemplate("t", Neuron(1), configs=[OpaqueConfig(
        {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCoreCount": 1})]),
     "OpaqueConfig.parameters.logicalNeuronCoreCount"),
    (lambda: ClaimTemplate("t", Neuron(1), configs=[OpaqueConfig({"kind": "NeuronConfig"}, requests=("x",))]),
     "OpaqueConfig.requests: 'x'"),
    (lambda: Drivers(neuron_driver="Not_A_Domain"), "Drivers.neuron_driver"),
]


@pytest.mark.parametrize(("make", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_at_construction(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(TemplateError) as err:
        make()
    assert message in str(err.value)
    assert err.value.field and err.value.allowed  # names the field and what is allowed


def test_a_template_moved_to_another_namespace_still_follows_its_driver() -> None:
    from neuron_dra.claim_templates import ClaimTemplate, Drivers, Neuron

    follows = ClaimTemplate("t", Neuron(1)).in_namespace("ml")
    assert follows.namespace == "ml" and follows.follows_driver
    own = ClaimTemplate("t", Neuron(1), drivers=Drivers()).in_namespace("ml")
    assert own.namespace == "ml" and not own.follows_driver
    with pytest.raises(TemplateError):
        ClaimTemplate("t", Neuron(1)).in_namespace("Not_A_Label")


def test_first_available_keeps_an_alternative_name_given_even_when_it_is_the_default() -> None:
    named = FirstAvailable(NeuronCores(4, name="cores"), Neuron(1), Neuron(2, name="neurons"))
    assert [o.name for o in named.options] == ["cores", "option2", "neurons"]
    assert [o.name for o in FirstAvailable(NeuronCores(4), Neuron(1)).options] == ["option1", "option2"]
