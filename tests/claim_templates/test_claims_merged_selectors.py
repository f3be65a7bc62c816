"""One CEL expression per request (requests.merged_selectors): the same devices as the parts one by one, one
evaluation per device instead of one per part, and claim checks that still name the part that failed."""

from __future__ import annotations

import pytest

from neuron_dra.claim_templates import (
    AtLeast,
    Checker,
    ClaimTemplate,
    Connected,
    Efa,
    Neuron,
    NeuronCores,
    UltraServerNode,
)
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.scale import selector_evaluations

TRN2 = "trn2.48xlarge"
D = "device.attributes['neuron.aws.com']"


def _selectors(template: ClaimTemplate) -> list[list[str]]:
    out = []
    for r in template.claim_spec()["devices"]["requests"]:
        bodies = r.get("firstAvailable") or [r["exactly"]]
        out += [[s["cel"]["expression"] for s in b.get("selectors", [])] for b in bodies]
    return out


RICH = ClaimTemplate("rich", Neuron(2, families=("trn1", "trn2"), kernel_driver=AtLeast("2.25"), min_memory="64Gi",
                                    min_cores=2, selectors=(f"{D}.deviceId < 8 || {D}.deviceId > 12",
                                                            f"{D}.family != 'trn1'")))


def test_every_request_renders_one_selector_with_the_raw_ones_last_in_parentheses() -> None:
    (merged,) = _selectors(RICH)[0]
    parts = CelEnvironment().parts(CelEnvironment().compile(merged))
    texts = [p.expression for p in parts]
    assert texts[0].startswith(f"{D}.instanceType in [")  # cheap and selective first
    assert texts[-2:] == [f"({D}.deviceId < 8 || {D}.deviceId > 12)", f"({D}.family != 'trn1')"]
    assert len(texts) == 8  # instanceType, version, memory guard + test, cores guard + test, the 2 raw ones
    ultra = ClaimTemplate("u", UltraServerNode(4, selectors=f"{D}.ultraserverNodeId4 == 0"))
    assert _selectors(ultra) == [[f"{D}.resourceType == 'neuron_node' && ({D}.ultraserverNodeId4 == 0)"]]
    # A lone raw selector is not wrapped; a request with nothing to test has no selectors at all.
    efa = ClaimTemplate("e", Neuron(4, topology=Connected(), instance_types=TRN2), Efa(4, selectors="true"))
    assert _selectors(efa) == [[f"{D}.instanceType == '{TRN2}'"], ["true"]]
    assert _selectors(ClaimTemplate("e", Neuron(4, instance_types=TRN2), Efa(4)))[1] == []
    cores = ClaimTemplate("c", NeuronCores(2, instance_types=TRN2, node_lnc=2))
    # instanceType, lnc and the core group in one (the NeuronCore class tests resourceType itself)
    assert len(_selectors(cores)[0]) == 1 and _selectors(cores)[0][0].count(" && ") == 2


@pytest.mark.parametrize("template", [
    RICH,
    ClaimTemplate("min", Neuron(1, min_memory="64Gi", kernel_driver="2.25.4.0")),
    ClaimTemplate("cores", NeuronCores(2, families="trn2", node_lnc=2)),
    ClaimTemplate("us", UltraServerNode(2, selectors=f"{D}.deviceCount == 16")),
], ids=lambda t: t.name)
def test_the_merged_expression_selects_what_its_parts_select_one_by_one(template: ClaimTemplate) -> None:
    env = CelEnvironment()
    classes = {c["metadata"]["name"]: [s["cel"]["expression"] for s in c["spec"]["selectors"]]
               for c in DEFAULT_DRIVERS.device_classes()}
    (request,) = template.claim_spec()["devices"]["requests"]
    devices = [d for node in NodeCatalog(partitionable=True).nodes() for d in node.devices
               if all(env.evaluate(e, d) for e in classes[request["exactly"]["deviceClassName"]])]
    for (merged,) in _selectors(template):
        compiled = env.compile(merged)
        parts = env.parts(compiled)
        assert len(parts) > 1
        chosen = [d.name for d in devices if env.evaluate(compiled, d)]
        one_by_one = [d.name for d in devices if all(env.evaluate(p, d) for p in parts)]
        assert chosen == one_by_one and chosen  # and some device of the catalog matches


def test_one_evaluation_per_device_and_request_whatever_the_parts() -> None:
    trn2 = NodeCatalog().node(TRN2)
    several = ClaimTemplate("s", Neuron(1, instance_types=TRN2, min_memory="64Gi", kernel_driver=AtLeast("2.25")))
    # 16 EFAs x the class selector (their pool comes first), then device 0: the class and the one request selector.
    assert selector_evaluations(several, trn2) == 16 + 2


@pytest.mark.parametrize(("expression", "parts"), [
    ("a == 1", ["a == 1"]),
    ("a == 1 || b && c", ["a == 1 || b && c"]),  # || binds looser: one part
    ("(a && b) && c == 'x && y'", ["a", "b", "c == 'x && y'"]),
    ("a && (b || c)", ["a", "(b || c)"]),
    ("cel.bind(v, s.split('.'), v.size() > 1 && v[0] == '2') && z", ["cel.bind(v, s.split('.'), v.size() > 1 && "
                                                                      "v[0] == '2')", "z"]),
    ("x && true", ["x && true"]),  # a keyword literal carries no position: kept whole
])
def test_conjuncts_split_only_the_top_level_and(expression: str, parts: list[str]) -> None:
    import celpy

    from neuron_dra.claim_templates.cel_analysis import conjuncts

    assert conjuncts(expression, celpy.Environment().compile(expression)) == parts


def _reason(template: ClaimTemplate, instance_type: str) -> str:
    fit = Checker().check(template, [instance_type]).fit(instance_type)
    assert fit.claims_per_node == 0
    return fit.reason or ""


def test_the_check_names_the_part_of_the_merged_selector_that_failed() -> None:
    memory = ClaimTemplate("m", Neuron(2, families=("trn1", "trn2"), min_memory="64Gi"))
    assert ("selector #0 part `device.capacity['neuron.aws.com'].memory.compareTo(quantity('64Gi')) >= 0` "
            "rejects 16") in _reason(memory, "trn1.32xlarge")
    raw = ClaimTemplate("r", Neuron(2, instance_types=TRN2, selectors=f"{D}.deviceId > 99"))
    assert f"selector #0 part `({D}.deviceId > 99)` rejects 16" in _reason(raw, TRN2)
    version = ClaimTemplate("v", Neuron(1, instance_types=TRN2, kernel_driver="9.9.9.9"))
    assert f"part `{D}.neuronDriverVersion == '9.9.9.9'` rejects 16" in _reason(version, TRN2)


def test_a_failed_instance_type_part_still_means_not_for_this_type() -> None:
    report = Checker().check(ClaimTemplate("t", Neuron(1, instance_types=TRN2, min_memory="64Gi")),
                             ["trn1.32xlarge", TRN2])
    other = report.fit("trn1.32xlarge")
    assert other.claims_per_node == 0 and not other.targeted  # its instanceType part, not its memory part
    assert report.fit(TRN2).claims_per_node == 16
    # When the instanceType part passes and the memory part fails, the type is a target the claim misses.
    small = Checker().check(ClaimTemplate("s", Neuron(1, families=("trn1", "trn2"), min_memory="64Gi")),
                            ["trn1.32xlarge"]).fit("trn1.32xlarge")
    assert small.claims_per_node == 0 and small.targeted


def test_the_device_classes_carry_one_selector_each() -> None:
    for cls in DEFAULT_DRIVERS.device_classes():
        assert len(cls["spec"]["selectors"]) == 1, cls["metadata"]["name"]


@pytest.mark.parametrize("dropped", ["deviceName", "neighbors"])
def test_a_claim_reading_a_dropped_attribute_is_told_before_deploy(dropped: str) -> None:
    # docs/upgrades.md: deviceName and neighbors only repeated family and the catalog's neighbours of deviceId.
    report = Checker().check(ClaimTemplate("old", Neuron(1, selectors=f"{D}.{dropped} != ''")), [TRN2])
    assert not report.ok
    assert any(f"reads device.attributes['neuron.aws.com'].{dropped}, which the driver does not publish" in i.message
               for i in report.issues), report.issues


def test_raw_selectors_too_large_to_merge_stay_separate() -> None:
    # Each under Kubernetes' 10 KiB per expression, together over it: merged, the API server would refuse it.
    big = [f"{D}.instanceType != '{'x' * 40}{i}' && " * 60 + "true" for i in range(3)]
    assert all(len(b) < 10 * 1024 for b in big) and len(" && ".join(big)) > 10 * 1024
    (selectors,) = _selectors(ClaimTemplate("b", Neuron(1, instance_types=TRN2, selectors=big)))
    assert selectors == [f"{D}.instanceType == '{TRN2}'", *big]
