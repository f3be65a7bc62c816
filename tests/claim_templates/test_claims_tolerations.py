"""Device taints in the claim templates: typed tolerations on requests, and an allocator simulation that keeps
untolerated requests off tainted devices (as the 1.36 scheduler does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from neuron_dra.claim_templates import (
    ALL,
    ClaimTemplate,
    Connected,
    Drivers,
    FirstAvailable,
    Neuron,
    TemplateError,
    TolerateUnhealthy,
    Toleration,
    UltraServerNode,
)
from neuron_dra.claim_templates.allocator import simulate, taint_prevents_allocation, tolerates
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices, with_taints

NODE = "n1"
TRN2 = "trn2.48xlarge"


def taint(effect: str = "NoSchedule", key: str = "neuron.aws.com/unhealthy", value: str = "mem_ecc_uncorrected"
          ) -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect, "timeAdded": "2026-11-30T19:00:00Z"}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return discover(emulate(TRN2, tmp_path_factory.mktemp("h") / "host"))


def slices_with(host: Any, taints: dict[int, list[dict[str, str]]]) -> list[dict[str, Any]]:
    pool = build_pool(host, NodeFacts(NODE))
    return resource_slices(with_taints(pool, {f"neuron-device-{i}": tuple(t) for i, t in taints.items()}))


def allocate(slices: list[dict[str, Any]], template: ClaimTemplate, count: bool = False) -> Any:
    claim = {"metadata": {"name": "c", "namespace": "ns"}, "spec": template.claim_spec()}
    return simulate(slices, Drivers().device_classes(), [claim], node_name=NODE, mode="count" if count else "fit-one")


def devices(result: Any) -> list[str]:
    return sorted(d.device for d in result.allocation[0])


# --- typed tolerations -------------------------------------------------------------------------------------------

def test_tolerate_unhealthy_renders_the_drivers_taint_key_in_every_request_shape() -> None:
    diag = Neuron(1, instance_types=TRN2, tolerations=TolerateUnhealthy())
    assert diag.exact(Drivers())["tolerations"] == [{"operator": "Exists", "key": "neuron.aws.com/unhealthy"}]
    other = Drivers(neuron_driver="neuron.example.com")
    assert diag.exact(other)["tolerations"] == [{"operator": "Exists", "key": "neuron.example.com/unhealthy"}]
    fa = FirstAvailable(Neuron(4, instance_types=TRN2, tolerations=[TolerateUnhealthy("NoExecute", seconds=60)]),
                        Neuron(2, instance_types=TRN2))
    subs = ClaimTemplate("t", fa).claim_spec()["devices"]["requests"][0]["firstAvailable"]
    assert subs[0]["tolerations"] == [{"operator": "Exists", "key": "neuron.aws.com/unhealthy",
                                       "effect": "NoExecute", "tolerationSeconds": 60}]
    assert "tolerations" not in subs[1]
    us = UltraServerNode(4, tolerations=Toleration())
    assert us.exact(Drivers())["tolerations"] == [{"operator": "Exists"}]
    eq = Toleration("example.com/maintenance", "Equal", "planned", "NoSchedule")
    assert Neuron(1, tolerations=eq).exact(Drivers())["tolerations"] == [
        {"operator": "Equal", "key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}]
    assert "tolerations" not in Neuron(1).exact(Drivers())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"operator": "Equal"}, "Toleration.operator.*Exists when the key is empty"),
    ({"key": "a/b", "operator": "In"}, "Toleration.operator.*Exists or Equal"),
    ({"key": "a/b", "value": "x"}, "Toleration.value.*empty with operator Exists"),
    ({"key": "a/b", "operator": "Equal", "value": "not valid!"}, "Toleration.value"),
    ({"effect": "PreferNoSchedule"}, "Toleration.effect.*NoSchedule or NoExecute"),
    ({"effect": "NoSchedule", "seconds": 10}, "Toleration.seconds.*only with effect='NoExecute'"),
    ({"effect": "NoExecute", "seconds": -1}, "Toleration.seconds.*>= 0"),
    ({"key": "Not A Key/x"}, "Toleration.key"),
])
def test_bad_tolerations_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        Toleration(**kwargs)


def test_tolerations_must_be_toleration_objects() -> None:
    with pytest.raises(TemplateError, match=r"Neuron\.tolerations"):
        Neuron(1, tolerations=[{"key": "x"}])  # type: ignore[list-item]


def test_toleration_matching_follows_kubernetes() -> None:
    t = taint("NoExecute")
    assert tolerates({"operator": "Exists"}, t)
    assert tolerates({"key": t["key"], "operator": "Exists", "effect": "NoExecute"}, t)
    assert not tolerates({"key": t["key"], "operator": "Exists", "effect": "NoSchedule"}, t)
    assert tolerates({"key": t["key"], "value": "mem_ecc_uncorrected"}, t)  # operator defaults to Equal
    assert not tolerates({"key": t["key"], "value": "sram_ecc_uncorrected"}, t)
    assert not tolerates({"key": "other/key", "operator": "Exists"}, t)
    assert not taint_prevents_allocation({"taints": [taint("None")]}, [])  # informational only
    assert taint_prevents_allocation({"taints": [taint("NoSchedule")]}, [])


# --- allocation -----------------------------------------------------------------------------------------------------

def test_a_new_claim_gets_another_device_than_the_tainted_one(host: Any) -> None:
    slices = slices_with(host, {0: [taint()]})
    result = allocate(slices, ClaimTemplate("one", Neuron(1, instance_types=TRN2)))
    assert result.satisfiable and devices(result) == ["neuron-device-1"]
    counted = allocate(slices, ClaimTemplate("one", Neuron(1, instance_types=TRN2)), count=True)
    assert counted.count == 15  # every device but the tainted one
    diag = allocate(slices, ClaimTemplate("diag", Neuron(1, instance_types=TRN2, tolerations=TolerateUnhealthy())))
    assert devices(diag) == ["neuron-device-0"]


def test_a_tainted_device_breaks_its_connected_group_and_all(host: Any) -> None:
    slices = slices_with(host, {5: [taint("NoExecute")]})
    row = allocate(slices, ClaimTemplate("row", Neuron(4, topology=Connected(), instance_types=TRN2)))
    assert devices(row) == [f"neuron-device-{i}" for i in (0, 1, 2, 3)]
    rows = allocate(slices, ClaimTemplate("row", Neuron(4, topology=Connected(), instance_types=TRN2)), count=True)
    assert rows.count == 3  # the row {4..7} holds the tainted device
    assert not allocate(slices, ClaimTemplate("all", Neuron(ALL, instance_types=TRN2))).satisfiable
    tolerant = Neuron(ALL, instance_types=TRN2, tolerations=TolerateUnhealthy("NoExecute"))
    assert len(devices(allocate(slices, ClaimTemplate("all", tolerant)))) == 16
    wrong_effect = Neuron(ALL, instance_types=TRN2, tolerations=TolerateUnhealthy("NoSchedule"))
    assert not allocate(slices, ClaimTemplate("all", wrong_effect)).satisfiable


def test_an_informational_taint_changes_nothing(host: Any) -> None:
    slices = slices_with(host, {0: [taint("None")]})
    assert devices(allocate(slices, ClaimTemplate("one", Neuron(1, instance_types=TRN2)))) == ["neuron-device-0"]


# --- checks: how a template degrades when a device in use fails -----------------------------------------------------

def test_checker_counts_claims_per_node_with_one_unhealthy_device() -> None:
    from neuron_dra.claim_templates import Checker

    checker = Checker(unhealthy_device=True)
    cases = {
        ClaimTemplate("whole", Neuron(16, instance_types=TRN2)): (1, 0),
        ClaimTemplate("row", Neuron(4, topology=Connected(), instance_types=TRN2)): (4, 3),
        ClaimTemplate("one", Neuron(1, instance_types=TRN2)): (16, 15),
        ClaimTemplate("tolerant", Neuron(4, topology=Connected(), instance_types=TRN2,
                                         tolerations=TolerateUnhealthy())): (4, 4),
    }
    for template, expected in cases.items():
        fit = checker.check(template, [TRN2]).fit(TRN2)
        assert (fit.claims_per_node, fit.with_unhealthy_device) == expected, template.name
    report = checker.check(ClaimTemplate("row", Neuron(4, topology=Connected(), instance_types=TRN2)), [TRN2])
    assert "trn2.48xlarge: 4 per node (3 with one unhealthy device)" in report.summary()
    plain = Checker().check(ClaimTemplate("one", Neuron(1, instance_types=TRN2)), [TRN2]).fit(TRN2)
    assert plain.with_unhealthy_device is None


@pytest.mark.slow  # about 3 s of CPU: checks every example template twice
def test_claims_check_command_with_unhealthy_device(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from neuron_dra.cli import main as cli_main

    examples = str(Path(__file__).resolve().parents[2] / "neuron_dra" / "claim_templates" / "examples.py")
    assert cli_main(["claims", "check", examples, "--instance-type", TRN2, "--unhealthy-device"]) in (0, 1)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("default/")}
    assert rows["default/neuron-whole-node"] == "1/0" and rows["default/neuron-1x4-connected"] == "4/3"
    assert "M when one device the first claim uses is tainted unhealthy" in out
    cli_main(["claims", "check", examples, "--instance-type", TRN2, "--unhealthy-device", "--json"])
    reports = {r["template"]: r for r in json.loads(capsys.readouterr().out)}
    (fit,) = reports["default/one-neuron-device"]["fits"]
    assert (fit["claimsPerNode"], fit["claimsPerNodeWithUnhealthyDevice"]) == (16, 15)


def test_a_faulty_device_takes_its_cores_out_of_core_claims_too() -> None:
    from neuron_dra.claim_templates import Checker

    drivers = Drivers()
    manifest = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-core", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "core", "exactly": {"deviceClassName": drivers.neuron_core_class, "count": 1}}]}}}}
    fit = Checker(unhealthy_device=True).check(manifest, [TRN2]).fit(TRN2)
    assert (fit.claims_per_node, fit.with_unhealthy_device) == (64, 60)  # 16 devices x 4 cores at LNC 2
