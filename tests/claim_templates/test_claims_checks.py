"""Checks before deploy, and the `neuron-dra claims` command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import (
    ALL,
    Checker,
    ClaimTemplate,
    Connected,
    Drivers,
    Efa,
    Neuron,
    RingSegment,
    TemplateCheckError,
    check,
    check_against,
    checked_manifest,
)
from neuron_dra.claim_templates.checks import default_checker
from neuron_dra.claim_templates.examples import OFFICIAL_SAMPLES, RICHER_CASES
from neuron_dra.cli import main

D = "device.attributes['neuron.aws.com']"


@pytest.fixture(scope="module")
def checker() -> Checker:
    return default_checker()


def manifest(requests: list[dict[str, Any]], **devices: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "raw", "namespace": "ns"},
            "spec": {"spec": {"devices": {"requests": requests, **devices}}}}


def neuron_request(*selectors: str, count: int = 1) -> dict[str, Any]:
    return {"name": "n", "exactly": {"deviceClassName": "neuron.aws.com", "count": count,
                                     "selectors": [{"cel": {"expression": s}} for s in selectors]}}


def test_unknown_attribute_names_the_closest_published_one(checker: Checker) -> None:
    r = checker.check(manifest([neuron_request(f"{D}.instanceTyp == 'trn2.48xlarge'")]))
    assert not r.ok
    assert any("instanceTyp, which the driver does not publish; did you mean 'instanceType'?" in i.message
               for i in r.errors)
    r = checker.check(manifest([neuron_request("device.capacity['neuron.aws.com'].hbm.sign() == 1")]))
    assert any("did you mean 'memory'?" in i.message for i in r.errors)
    r = checker.check(manifest([neuron_request("device.attributes['gpu.nvidia.com'].model == 'x'")]))
    assert any("no device publishes attributes in domain 'gpu.nvidia.com'" in i.message for i in r.errors)
    group3 = [{"matchAttribute": "resource.aws.com/devicegroup3_id"}]
    r = checker.check(manifest([neuron_request()], constraints=group3))
    assert any("'resource.aws.com/devicegroup3_id': no device publishes it; did you mean" in i.message
               for i in r.errors)


def test_runtime_errors_on_published_devices_are_errors(checker: Checker) -> None:
    # Unguarded read of an attribute the UltraServer pseudo-device lacks: Kubernetes would abort allocation.
    r = checker.check(manifest([neuron_request(f"{D}.deviceId >= 0")]), ["trn2u.48xlarge", "trn2.48xlarge"])
    assert any("fails on 1 device of trn2u.48xlarge: no such key: deviceId" in i.message for i in r.errors)
    guarded = checker.check(manifest([neuron_request(f"'deviceId' in {D} && {D}.deviceId >= 0")]),
                            ["trn2u.48xlarge"])
    assert guarded.ok and guarded.fit("trn2u.48xlarge").claims_per_node == 16


def test_opaque_configs_are_decoded_by_the_drivers_code(checker: Checker) -> None:
    typo = [{"opaque": {"driver": "neuron.aws.com", "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCoreCount": 1}}}]
    r = checker.check(manifest([neuron_request()], config=typo), ["trn2.48xlarge"])
    assert any("logicalNeuronCoreCount" in i.message and "ContainerCreating" in i.message for i in r.errors)
    lnc = [{"opaque": {"driver": "neuron.aws.com", "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]
    r = checker.check(manifest([neuron_request()], config=lnc), ["trn1.32xlarge", "trn2.48xlarge"])
    assert r.fit("trn2.48xlarge").claims_per_node == 16
    assert r.fit("trn1.32xlarge").claims_per_node == 0
    assert "LNC applies to Trainium2" in (r.fit("trn1.32xlarge").reason or "")


def test_packing_and_reasons(checker: Checker) -> None:
    r = checker.check(ClaimTemplate("c4", Neuron(4, topology=Connected(), instance_types="trn2.48xlarge")))
    assert {f.instance_type: f.claims_per_node for f in r.fitting} == {"trn2.48xlarge": 4}
    assert [d.device for d in r.fit("trn2.48xlarge").devices] == [f"neuron-device-{i}" for i in range(4)]
    assert "instanceType == 'trn2.48xlarge'` rejects 1" in (r.fit("trn1.2xlarge").reason or "")
    ring = checker.check(ClaimTemplate("ring", Neuron(4, topology=RingSegment(), families="inf2")))
    assert {f.instance_type: f.claims_per_node for f in ring.fitting} == {"inf2.48xlarge": 3}
    efa = checker.check(ClaimTemplate("efa", Neuron(4), Efa(4)), ["trn1.32xlarge"])
    assert "at most 2 of the matching devices share one" in (efa.fit("trn1.32xlarge").reason or "")
    assert not efa.ok and any("fits none of the checked instance types" in i.message for i in efa.errors)
    mixed = checker.check(ClaimTemplate("mix", Neuron(ALL, families="trn2u"), Neuron(1, name="more")),
                          ["trn2u.48xlarge"])
    assert mixed.fit("trn2u.48xlarge").claims_per_node == 0
    assert "no combination" in (mixed.fit("trn2u.48xlarge").reason or "")


def test_orderings_of_the_same_devices_are_not_searched_again(checker: Checker) -> None:
    """8 connected devices + 8 aligned EFAs on trn1.32xlarge: the Go search tries all 8! orderings of each
    group before failing (past its 10 s timeout); the simulation answers at once, with the reason."""
    r = checker.check(ClaimTemplate("efa-8", Neuron(8, topology=Connected()), Efa(8)), ["trn1.32xlarge"])
    assert r.fit("trn1.32xlarge").claims_per_node == 0
    assert "request 'efa' needs 8 devices with one value; at most 4" in (r.fit("trn1.32xlarge").reason or "")


def test_a_request_nothing_matches_is_an_error(checker: Checker) -> None:
    r = checker.check(manifest([neuron_request(f"{D}.family == 'trn9'")]))
    assert any("no device of any checked instance type" in i.message for i in r.errors)


def test_check_against_raises_with_the_reason() -> None:
    t = ClaimTemplate("inf2-only", Neuron(2, families="inf2"))
    check_against(t, ["trn2.48xlarge", "inf2.24xlarge"])
    with pytest.raises(TemplateCheckError) as err:
        check_against(t, ["trn2.48xlarge"])
    assert "default/inf2-only" in str(err.value) and "trn2.48xlarge" in str(err.value)


def test_checked_manifest_runs_the_checks() -> None:
    t = ClaimTemplate("ring", Neuron(2, topology=RingSegment(), families="inf2"))
    assert checked_manifest(t) == t.to_manifest()
    with pytest.raises(TemplateCheckError, match=r"trn2\.48xlarge"):
        checked_manifest(t, ["trn2.48xlarge"])


def test_templates_for_a_cluster_running_other_driver_names(checker: Checker) -> None:
    drivers = Drivers(neuron_driver="neuron.example.com", neuron_class="neuron-devices")
    r = checker.check(ClaimTemplate("custom", Neuron(8, topology=Connected()), drivers=drivers), ["trn2.48xlarge"])
    assert r.ok and r.fit("trn2.48xlarge").claims_per_node == 2
    assert {d.driver for d in r.fit("trn2.48xlarge").devices} == {"neuron.example.com"}


def test_every_example_is_error_free() -> None:
    for t in OFFICIAL_SAMPLES + RICHER_CASES:
        r = check(t)
        assert r.ok, (t.name, r.summary())


def write(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "templates.py"
    f.write_text("from neuron_dra.claim_templates import *\n" + body)
    return f


def test_cli_render_prints_every_module_level_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "a = ClaimTemplate('a', Neuron(1))\nboth = [ClaimTemplate('b', Neuron(2)), a]\n")
    assert main(["claims", "render", str(f)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == ["a", "b"]


def test_cli_check_table_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "a = ClaimTemplate('trn2-row', Neuron(4, topology=Connected(), families='trn2'))\n")
    assert main(["claims", "check", str(f), "--instance-type", "trn2.48xlarge", "--instance-type", "inf2.xlarge"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("default/trn2-row"))
    assert row.split()[1:] == ["4", "-"]
    assert "default/trn2-row: not for inf2.xlarge (its selectors pick other instance types" in out
    assert main(["claims", "check", str(f), "--instance-type", "trn2.48xlarge", "--instance-type", "inf2.xlarge",
                 "--verbose"]) == 0
    assert "default/trn2-row on inf2.xlarge: request 'neurons' needs 4 devices" in capsys.readouterr().out
    assert main(["claims", "check", str(f), "--instance-type", "inf2.xlarge"]) == 1
    capsys.readouterr()
    assert main(["claims", "check", str(f), "--instance-type", "trn2.48xlarge", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report[0]["fits"][0]["claimsPerNode"] == 4


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claims", "check", str(tmp_path / "missing.py")]) == 2
    bad = write(tmp_path, "a = ClaimTemplate('a', Neuron(6, topology=Connected(), instance_types='trn2.48xlarge'))\n")
    assert main(["claims", "render", str(bad)]) == 2
    assert "Connected.size: 6" in capsys.readouterr().err
    typo = write(tmp_path, f"a = ClaimTemplate('a', Neuron(1, selectors=\"{D}.familly == 'trn2'\"))\n")
    assert main(["claims", "render", str(typo)]) == 1
    assert "did you mean 'family'?" in capsys.readouterr().err


def test_cli_render_prints_the_templates_that_pass_when_one_fails(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "good = ClaimTemplate('good', Neuron(1))\n"
                        f"bad = ClaimTemplate('bad', Neuron(1, selectors=\"{D}.familly == 'trn2'\"))\n")
    assert main(["claims", "render", str(f)]) == 1
    out = capsys.readouterr()
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out.out)] == ["good"]
    assert "default/bad:" in out.err and "(not rendered)" in out.err and "default/good" not in out.err
