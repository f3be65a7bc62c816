"""Claim templates on Trainium3 (all-to-all) hosts and on instance types from a catalog file: rendering, refusals at
construction, kubernetes-validate strict, and the checks' allocator simulation with real CEL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import (
    ALL,
    ClaimTemplate,
    Connected,
    Efa,
    FirstAvailable,
    GroupAttribute,
    Neuron,
    RingSegment,
    TemplateError,
    UltraServerNode,
)
from neuron_dra.claim_templates.checks import Checker
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.catalog_file import parse_catalog
from tests.support import kubeschema

TRN3 = "trn3.48xlarge"
ACME = parse_catalog({
    "apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog",
    "instanceTypes": {
        "acme1.24xlarge": {"family": "trn3", "devices": 8, "topology": "all-to-all", "efaCount": 8,
                           "efaMap": [f"0000:{0x10 + i:02x}:00.0" for i in range(8)]},
        "acme2.8xlarge": {"basedOn": "inf2.48xlarge", "devices": 4, "coresPerDevice": 4},
    },
}, "acme.yaml")


def devices_of(t: ClaimTemplate) -> dict[str, Any]:
    return dict(t.to_manifest()["spec"]["spec"]["devices"])


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker()


TRN3_TEMPLATES = [
    ClaimTemplate("trn3-16-connected", Neuron(16, topology=Connected(), instance_types=TRN3)),
    ClaimTemplate("trn3-4-connected", Neuron(4, topology=Connected(), families="trn3")),
    ClaimTemplate("trn3-all-lnc1", Neuron(ALL, instance_types=TRN3, lnc=1)),
    ClaimTemplate("trn3-ultraserver-2", UltraServerNode(2), Neuron(ALL, families="trn3p")),
    ClaimTemplate("trn3-8-else-trn2-8", FirstAvailable(
        Neuron(8, topology=Connected(), families="trn3", name="trn3"),
        Neuron(8, topology=Connected(), instance_types="trn2.48xlarge", name="trn2"))),
    ClaimTemplate("any-16-connected", Neuron(16, topology=Connected())),
]


@pytest.mark.parametrize("template", TRN3_TEMPLATES, ids=lambda t: t.name)
def test_trn3_templates_pass_kubernetes_validate_strict(template: ClaimTemplate) -> None:
    kubeschema.validate(template.to_manifest(), "1.34", strict=True)


def test_connected_on_all_to_all_hosts_needs_no_constraint() -> None:
    assert "constraints" not in devices_of(TRN3_TEMPLATES[0])
    assert "constraints" not in devices_of(TRN3_TEMPLATES[1])
    # The whole node needs none on any 16-device type either: any 16 devices of such a node are all of them.
    assert "constraints" not in devices_of(TRN3_TEMPLATES[-1])
    # Per alternative: the trn2 one keeps its devicegroup, the trn3 one has none.
    assert devices_of(TRN3_TEMPLATES[4])["constraints"] == [
        {"requests": ["neurons/trn2"], "matchAttribute": "resource.aws.com/devicegroup8_id"}]


def test_the_checks_simulate_trn3_with_real_cel(checker: Checker) -> None:
    """16 connected devices fit once per trn3 node; 4 connected four times; other types not at all."""
    fits = {t.name: {f.instance_type: f.claims_per_node for f in checker.check(t).fitting} for t in TRN3_TEMPLATES}
    assert fits["trn3-16-connected"] == {TRN3: 1}
    assert fits["trn3-4-connected"] == {TRN3: 4}
    assert fits["trn3-all-lnc1"] == {TRN3: 1}
    assert fits["trn3-ultraserver-2"] == {"trn3p.48xlarge": 1}
    assert fits["trn3-8-else-trn2-8"] == {TRN3: 2, "trn2.48xlarge": 2}
    assert fits["any-16-connected"] == {"trn1.32xlarge": 1, "trn1n.32xlarge": 1, "trn2.48xlarge": 1,
                                        "trn2u.48xlarge": 1, TRN3: 1, "trn3p.48xlarge": 1}
    report = checker.check(TRN3_TEMPLATES[0], [TRN3])
    assert report.ok and len(report.fit(TRN3).devices) == 16


def test_a_grid_group_on_every_type_does_not_fit_trn3_and_says_why(checker: Checker) -> None:
    report = checker.check(ClaimTemplate("rows", Neuron(4, topology=Connected())))
    assert report.fit("trn2.48xlarge").claims_per_node == 4 and report.fit(TRN3).claims_per_node == 0
    assert "topology4_id" in (report.fit(TRN3).reason or "")


@pytest.mark.parametrize(("make", "field", "value", "allowed"), [
    (lambda: Neuron(4, topology=Connected(), instance_types=(TRN3, "trn2.48xlarge")), "Neuron.topology",
     "Connected(size=None", "one topology kind per request"),
    (lambda: Neuron(8, topology=Connected(), families=("trn2", "trn3")), "Neuron.topology", "Connected(",
     "FirstAvailable(one Neuron per kind)"),
    (lambda: Neuron(4, topology=Connected(attribute=GroupAttribute.NEURON), instance_types=TRN3),
     "Connected.attribute", "'neuron'", "AUTO on all-to-all hosts"),
    (lambda: Neuron(4, topology=Connected(attribute=GroupAttribute.AWS), instance_types=TRN3),
     "Connected.attribute", "'aws'", "EFA instance types"),
    (lambda: Neuron(4, topology=RingSegment(), instance_types=TRN3), "Neuron.topology", "RingSegment",
     "RingSegment on ring hosts only"),
    (lambda: Neuron(2, instance_types=TRN3, selectors=f"{'device.attributes'}['neuron.aws.com'].topology_x == 0"),
     "Neuron.selectors", "topology_x == 0", "all-to-all hosts (trn3.48xlarge) publish no topology_x"),
    (lambda: Neuron(17, instance_types=TRN3), "Neuron.count", "17", "1 to 16 on trn3.48xlarge"),
    (lambda: Neuron(1, min_cores=9, families="trn3"), "Neuron.min_cores", "9", "1 to 8"),
    (lambda: Neuron(1, lnc=1, families=("inf2", "trn3")), "Neuron.lnc", "1", "LNC only on Trainium2 and later"),
    (lambda: Neuron(1, instance_types="acme1.24xlarge"), "Neuron.instance_types", "'acme1.24xlarge'",
     "passed as Neuron(catalog=...)"),
    (lambda: Neuron(1, catalog="acme.yaml"), "Neuron.catalog", "'acme.yaml'", "a Catalog"),  # type: ignore[arg-type]
])
def test_refused_at_construction_naming_field_value_and_what_is_allowed(make: Any, field: str, value: str,
                                                                       allowed: str) -> None:
    with pytest.raises(TemplateError) as err:
        make()
    message = str(err.value)
    assert message.startswith(f"{field}: ") and value in message and allowed in message, message


def test_lnc_on_trn3_renders_the_opaque_config() -> None:
    config = devices_of(TRN3_TEMPLATES[2])["config"]
    assert config == [{"opaque": {"driver": "neuron.aws.com", "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}, "requests": ["neurons"]}]


@pytest.mark.slow  # about 3 s of CPU: emulates and checks a catalog of its own
def test_an_instance_type_of_our_own_making_renders_and_checks() -> None:
    assert isinstance(ACME, Catalog) and "acme1.24xlarge" not in BUILTIN
    t = ClaimTemplate("acme", Neuron(4, topology=Connected(), instance_types="acme1.24xlarge", catalog=ACME), Efa(4))
    kubeschema.validate(t.to_manifest(), "1.34", strict=True)
    ring = ClaimTemplate("acme2", Neuron(2, topology=RingSegment(), instance_types="acme2.8xlarge", catalog=ACME))
    assert devices_of(ring)["constraints"] == [{"requests": ["neurons"],
                                                "matchAttribute": "neuron.aws.com/topology2_id"}]
    checker = Checker(hardware=ACME)
    fits = {f.instance_type: f.claims_per_node for f in checker.check(t, ["acme1.24xlarge", TRN3]).fitting}
    assert fits == {"acme1.24xlarge": 2}  # 4 devices + their 4 EFAs, twice per node; trn3 has no EFA map
    assert {f.instance_type: f.claims_per_node for f in checker.check(ring).fitting} == {"acme2.8xlarge": 2}
    unknown = Checker().check(t, ["acme1.24xlarge"])
    assert not unknown.ok and any("catalog file" in i.message for i in unknown.errors)


@pytest.mark.process
def test_claims_check_cli_with_a_catalog_file(tmp_path: Path) -> None:
    catalog = tmp_path / "acme.yaml"
    catalog.write_text(yaml.safe_dump({"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "instanceTypes": {
        "acme1.24xlarge": {"family": "trn3", "devices": 8, "topology": "all-to-all"}}}), encoding="utf-8")
    templates = tmp_path / "t.py"
    templates.write_text(
        "from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron\n"
        "mine = ClaimTemplate('mine', Neuron(8, topology=Connected(), instance_types='acme1.24xlarge', "
        "catalog=catalog))\n"
        "trn3 = ClaimTemplate('trn3', Neuron(16, topology=Connected(), instance_types='trn3.48xlarge'))\n",
        encoding="utf-8")
    run = [sys.executable, "-m", "neuron_dra", "claims", "check", str(templates), "--catalog", str(catalog),
           "--instance-type", "acme1.24xlarge", "--instance-type", TRN3]
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[1:3]}
    assert rows == {"default/mine": ["1", "-"], "default/trn3": ["-", "1"]}
    without = subprocess.run(run[:6], capture_output=True, text=True)
    assert without.returncode == 2 and "Neuron.instance_types: 'acme1.24xlarge'" in without.stderr
