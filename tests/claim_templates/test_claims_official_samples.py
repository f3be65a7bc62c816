"""AWS's eight official Neuron DRA samples: each typed expression renders semantically equal to AWS's YAML.

Semantically equal: same requests (mode, count, class, in order), same constraints and opaque configs (with
request names mapped by position, an empty request list meaning all), selectors that pick the same devices on
every device every catalog node publishes (real CEL), and the same claims per node on every instance type.
The one intended difference: our Neuron requests never select the trn2u UltraServer pseudo-device, which
AWS's pinned-kernel-driver sample (ALL with only a version selector) selects and allocates, and AWS's aligned
EFA sample selects (its devicegroup constraint then keeps it out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from neuron_dra.claim_templates import Checker, ClaimTemplate
from neuron_dra.claim_templates.allocator import simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.examples import OFFICIAL_SAMPLES, RICHER_CASES
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.driver.model.catalog import CATALOG
from tests.support import kubeschema
from tests.support.e2e import claim_template as _template

A = 'device.attributes["neuron.aws.com"]'


def _request(name: str, selector: str | None, count: int | None = None, cls: str = "neuron.aws.com"
             ) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if count is None:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count  # AWS omits allocationMode: ExactCount is the default
    return {"name": name, "exactly": exactly}


TRN2 = f'{A}.instanceType == "trn2.48xlarge"'
# The UltraServer pseudo-devices (trn2u and the Trn3 Gen1 UltraServer type).
PSEUDOS = {f"neuron.aws.com/node-{t}/neuron-node" for t in ("trn2u.48xlarge", "trn3p.48xlarge")}
AWS_SAMPLES = {
    "neuron-1x4-connected": _template("1x4", [_request("neurons", TRN2, 4)],
                                      [{"matchAttribute": "resource.aws.com/devicegroup4_id"}]),
    "neuron-8-connected": _template("8", [_request("neurons", TRN2, 8)],
                                    [{"matchAttribute": "resource.aws.com/devicegroup8_id"}]),
    "neuron-whole-node": _template("16", [_request("neurons", TRN2, 16)]),
    "neuron-all-devices": _template("all", [_request("neurons", TRN2)]),
    "neuron-all-devices-lnc1": _template("all-lnc1", [_request("neurons", TRN2)], config=[
        {"opaque": {"driver": "neuron.aws.com", "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]),
    "neuron-pinned-kernel-driver": _template("pinned", [_request("neurons", f'{A}.neuronDriverVersion == "2.25.4.0"')]),
    "neuron-ultraserver-4": _template("us", [_request("ultraserver", f'{A}.resourceType == "neuron_node"', 1)],
                                      config=[{"requests": ["ultraserver"], "opaque": {
                                          "driver": "neuron.aws.com", "parameters": {
                                              "apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig",
                                              "ultraserverMode": 4}}}]),
    "neuron-efa-aligned": _template("efa", [_request("neuron", None, 4),
                                            _request("efa", None, 4, cls="efa.networking.k8s.aws")],
                                    [{"requests": ["neuron", "efa"],
                                      "matchAttribute": "resource.aws.com/devicegroup4_id"}]),
}


def _requests(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(manifest["spec"]["spec"]["devices"]["requests"])


def _normalized(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Everything but selectors, with request names replaced by their position."""
    devices = manifest["spec"]["spec"]["devices"]
    names = {r["name"]: str(i) for i, r in enumerate(devices["requests"])}
    every = frozenset(names.values())

    def refs(listed: list[str] | None) -> frozenset[str]:
        return frozenset(names[r] for r in listed) if listed else every

    requests = []
    for r in devices["requests"]:
        e = r["exactly"]
        mode = e.get("allocationMode", "ExactCount")
        requests.append((e["deviceClassName"], mode, e.get("count", 1) if mode == "ExactCount" else None))
    constraints = sorted((sorted(refs(c.get("requests"))), c["matchAttribute"]) for c in devices.get("constraints", []))
    configs = sorted((sorted(refs(c.get("requests"))), c["opaque"]["driver"], sorted(c["opaque"]["parameters"].items()))
                     for c in devices.get("config", []))
    return {"requests": requests, "constraints": constraints, "configs": configs}


@pytest.fixture(scope="module")
def catalog() -> NodeCatalog:
    return NodeCatalog()


def _selected(manifest: Mapping[str, Any], index: int, catalog: NodeCatalog, env: CelEnvironment) -> set[str]:
    """Every device (of every catalog node) that request `index`'s class and selectors accept."""
    request = _requests(manifest)[index]["exactly"]
    # The DeviceClass's own selectors (the bundled classes keep NeuronCores out of neuron.aws.com).
    classes = {c["metadata"]["name"]: c for c in DEFAULT_DRIVERS.device_classes()}
    exprs = [sel["cel"]["expression"] for sel in classes[request["deviceClassName"]]["spec"]["selectors"]]
    exprs += [s["cel"]["expression"] for s in request.get("selectors", [])]
    return {d.name for node in catalog.nodes() for d in node.devices if all(env.evaluate(e, d) for e in exprs)}


@pytest.mark.parametrize("ours", OFFICIAL_SAMPLES, ids=lambda t: t.name)
def test_official_sample_is_one_short_expression_equal_to_aws(ours: ClaimTemplate, catalog: NodeCatalog) -> None:
    aws = AWS_SAMPLES[ours.name]
    mine = ours.to_manifest()
    assert _normalized(mine) == _normalized(aws)
    env = CelEnvironment()
    for i in range(len(_requests(aws))):
        theirs, ours_selected = _selected(aws, i, catalog, env), _selected(mine, i, catalog, env)
        assert ours_selected, "the sample selects some device"
        # Where AWS's selectors do not exclude the trn2u UltraServer pseudo-device, ours still do.
        assert ours_selected <= theirs
        assert theirs - ours_selected <= PSEUDOS
        if ours.name in ("neuron-pinned-kernel-driver", "neuron-efa-aligned") and i == 0:
            assert theirs >= PSEUDOS


@pytest.mark.parametrize("ours", OFFICIAL_SAMPLES, ids=lambda t: t.name)
def test_official_sample_packs_like_aws_on_every_instance_type(ours: ClaimTemplate, catalog: NodeCatalog) -> None:
    aws = AWS_SAMPLES[ours.name]
    for node in catalog.nodes():
        results = [simulate(node.slices, node.device_classes, [{"spec": m["spec"]["spec"]}],
                            node_name=node.node_name, mode="count") for m in (aws, ours.to_manifest())]
        assert results[0].error is None and results[1].error is None
        assert results[0].count == results[1].count, node.instance_type
        theirs = [d.device for d in results[0].allocation[0]] if results[0].count else []
        mine = [d.device for d in results[1].allocation[0]] if results[1].count else []
        if ours.name == "neuron-pinned-kernel-driver" and node.instance_type in ("trn2u.48xlarge", "trn3p.48xlarge"):
            assert theirs == [*mine, "neuron-node"]
        else:
            assert mine == theirs, node.instance_type


def test_official_samples_fit_where_aws_documents() -> None:
    """Claims per empty node, from the allocator simulation (a 4-connected claim fits 4 per trn2.48xlarge)."""
    checker = Checker()
    per_node = {t.name: {f.instance_type: f.claims_per_node for f in checker.check(t).fitting}
                for t in OFFICIAL_SAMPLES}
    assert per_node["neuron-1x4-connected"] == {"trn2.48xlarge": 4}
    assert per_node["neuron-8-connected"] == {"trn2.48xlarge": 2}
    assert per_node["neuron-whole-node"] == {"trn2.48xlarge": 1}
    assert per_node["neuron-all-devices"] == {"trn2.48xlarge": 1}
    assert per_node["neuron-all-devices-lnc1"] == {"trn2.48xlarge": 1}
    assert per_node["neuron-pinned-kernel-driver"] == dict.fromkeys(CATALOG, 1)
    assert per_node["neuron-ultraserver-4"] == {"trn2u.48xlarge": 1, "trn3p.48xlarge": 1}
    # trn1.32xlarge shares one EFA between two devices: a devicegroup of 4 has only 2 EFAs.
    assert per_node["neuron-efa-aligned"] == {"trn1n.32xlarge": 4, "trn2.48xlarge": 4, "trn2u.48xlarge": 4}


@pytest.mark.parametrize("template", OFFICIAL_SAMPLES + RICHER_CASES, ids=lambda t: t.name)
def test_examples_pass_kubernetes_validate_strict(template: ClaimTemplate) -> None:
    kubeschema.validate(template.to_manifest(), "1.34", strict=True)


@pytest.mark.parametrize("name", sorted(AWS_SAMPLES))
def test_aws_sample_yaml_is_valid_too(name: str) -> None:
    kubeschema.validate({**AWS_SAMPLES[name], "metadata": {"name": "x", "namespace": "default"}},
                                 "1.34", strict=True)
