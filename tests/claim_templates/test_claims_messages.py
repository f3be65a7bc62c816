"""What the claim checks and the typed classes say when something is wrong (issue 20 item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuron_dra.claim_templates import (
    ClaimTemplate,
    Connected,
    Efa,
    FirstAvailable,
    Neuron,
    NeuronCores,
    TemplateCheckError,
    TemplateError,
    check,
    check_against,
)
from neuron_dra.claim_templates.cel_env import CelCompileError, CelEnvironment
from neuron_dra.cli import main
from neuron_dra.driver.model.catalog import BUILTIN, UnknownInstanceTypeError

TRN1, TRN2 = "trn1.32xlarge", "trn2.48xlarge"


def test_instance_type_typos_get_a_did_you_mean_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    with pytest.raises(TemplateError, match=r"did you mean 'trn2.48xlarge'\?"):
        Neuron(1, instance_types="trn2.48xlarg")
    with pytest.raises(TemplateError, match=r"did you mean 'trn1.32xlarge'\?"):
        NeuronCores(1, instance_types="trn1.32xlarg")
    with pytest.raises(TemplateError, match=r"did you mean 'trn2u'\?"):
        Neuron(1, families="trn2uu")
    with pytest.raises(UnknownInstanceTypeError, match=r"did you mean 'inf2.xlarge'\?"):
        BUILTIN.spec("inf2.xlarg")
    report = check(ClaimTemplate("t", Neuron(1)), ["trn2.48xlarg"])
    assert any("did you mean 'trn2.48xlarge'?" in i.message for i in report.errors)
    f = tmp_path / "t.py"
    f.write_text("from neuron_dra.claim_templates import *\nt = ClaimTemplate('t', Neuron(1))\n")
    assert main(["claims", "check", str(f), "--instance-type", "trn2.48xlarg"]) == 2
    assert "did you mean 'trn2.48xlarge'?" in capsys.readouterr().err
    with pytest.raises(TemplateError) as far:  # nothing close: no guess, the known types
        Neuron(1, instance_types="zzz")
    assert "did you mean" not in str(far.value) and "trn2.48xlarge" in str(far.value)


def test_a_single_equals_in_cel_gets_a_caret_and_use_double_equals() -> None:
    expression = "device.attributes['neuron.aws.com'].instanceType = 'trn2.48xlarge'"
    with pytest.raises(CelCompileError) as e:
        CelEnvironment().compile(expression)
    lines = e.value.message.splitlines()
    assert lines[0] == "syntax error at line 1, column 50:"
    assert lines[1].strip() == expression
    assert lines[2].index("^") - lines[1].index("d") == expression.index(" = ") + 1  # under the `=`
    assert "use == to compare" in lines[3]
    with pytest.raises(TemplateError, match=r"(?s)\^.*use == to compare"):
        Neuron(1, selectors=expression)
    with pytest.raises(CelCompileError) as other:  # another syntax error: the caret, no == hint
        CelEnvironment().compile("device.driver == 'x' &&")
    assert "^" in other.value.message and "==" not in other.value.message.splitlines()[-1]


def test_lnc_on_trainium1_says_to_drop_lnc() -> None:
    with pytest.raises(TemplateError) as e:
        Neuron(1, instance_types=TRN1, lnc=2)
    assert "no lnc on trn1.32xlarge: Trainium1 has no Logical NeuronCores" in str(e.value)
    assert str(e.value).endswith("drop lnc") and "restrict" not in str(e.value)
    with pytest.raises(TemplateError, match=r"drop node_lnc$"):
        NeuronCores(1, families="inf2", node_lnc=1)
    with pytest.raises(TemplateError, match=r"may also land on trn1.2xlarge.*keep it to trn2.3xlarge.*or drop lnc"):
        Neuron(1, lnc=1)  # every type: keep it to the LNC types, or drop it


def test_efa_above_a_pinned_instance_types_efa_count_is_refused_at_construction() -> None:
    with pytest.raises(TemplateError) as e:
        ClaimTemplate("e", Neuron(16, instance_types=TRN1), Efa(16))
    assert str(e.value) == ("Efa.count: 16 is not allowed; allowed: 1 to 8 (trn1.32xlarge has 8 EFA devices)")
    ClaimTemplate("e", Neuron(16, instance_types=TRN1), Efa(8))
    ClaimTemplate("e", Neuron(16, instance_types=TRN2), Efa(16))
    ClaimTemplate("e", Neuron(16), Efa(16))  # not pinned: the check decides per type
    with pytest.raises(TemplateError, match=r"no Efa request.*\(trn1.2xlarge\)"):
        ClaimTemplate("e", Neuron(1, instance_types="trn1.2xlarge"), Efa(1))
    with pytest.raises(TemplateError, match=r"at most 8 EFA devices in all"):
        ClaimTemplate("e", Neuron(16, instance_types=TRN1), Efa(8), Efa(1, name="more", aligned_to=None))


def test_the_checker_counts_neuron_devices_apart_from_cores_and_efas() -> None:
    report = check(ClaimTemplate("e", Neuron(16), Efa(16)), [TRN1, "inf2.xlarge", "trn2u.48xlarge"])
    assert report.fit(TRN1).reason == "request 'efa' needs 16 devices; 8 of the node's 8 EFA devices match"
    assert report.fit("inf2.xlarge").reason == ("request 'neurons' needs 16 devices; 1 of the node's 1 Neuron "
                                                "device matches")
    cores = check(ClaimTemplate("c", NeuronCores(2, instance_types=TRN2), NeuronCores(2, name="more")), [TRN1])
    assert "of the node's 32 NeuronCores match" in (cores.fit(TRN1).reason or "")
    us = check(ClaimTemplate("u", Neuron(16, selectors="device.attributes['neuron.aws.com'].deviceId > 99")),
               ["trn2u.48xlarge"])
    assert "0 of the node's 16 Neuron devices and 1 UltraServer node device match" in (us.fit("trn2u.48xlarge")
                                                                                        .reason or "")
    assert "class selector" not in (us.fit("trn2u.48xlarge").reason or "")
    assert "56 devices" not in str(report.fits)


def test_claims_check_explains_only_the_types_a_template_can_land_on(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.py"
    f.write_text("from neuron_dra.claim_templates import *\n"
                 "c4 = ClaimTemplate('c4', Neuron(4, topology=Connected(), instance_types='trn2.48xlarge'))\n")
    assert main(["claims", "check", str(f)]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("default/c4")]
    assert len(notes) == 2  # the table row and one line for the rest
    assert notes[1].startswith("default/c4: not for trn1.2xlarge, trn1.32xlarge,")
    assert "--verbose explains each" in notes[1]
    assert main(["claims", "check", str(f), "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert "default/c4 on trn1.32xlarge: request 'neurons' needs 4 devices; 0 of the node's 16 Neuron" in verbose
    report = check(ClaimTemplate("c4", Neuron(4, topology=Connected(), instance_types=TRN2)), [TRN1, TRN2])
    assert not report.fit(TRN1).targeted and report.fit(TRN2).targeted
    with pytest.raises(TemplateCheckError) as e:
        check_against(ClaimTemplate("c4", Neuron(4, topology=Connected(), instance_types=TRN2)), [TRN1])
    assert "not for trn1.32xlarge (its selectors pick other instance types)" in str(e.value)


def test_first_available_takes_neuron_cores_alternatives() -> None:
    t = ClaimTemplate("fa", FirstAvailable(NeuronCores(4, instance_types=TRN2), Neuron(1)))
    request = t.to_manifest()["spec"]["spec"]["devices"]["requests"][0]
    assert [s["name"] for s in request["firstAvailable"]] == ["option1", "option2"]
    assert request["firstAvailable"][0]["deviceClassName"] == "neuroncore.aws.com"
    assert t.to_manifest()["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["neurons/option1"],
         "matchAttribute": "neuron.aws.com/coreGroup4_id"}]
    report = check(t, [TRN2, TRN1])
    assert report.ok
    assert report.fit(TRN2).claims_per_node == 16  # 4-core groups: 4 per device (LNC=2)
    assert {d.request for d in report.fit(TRN2).devices} == {"neurons/option1"}
    assert {d.request for d in report.fit(TRN1).devices} == {"neurons/option2"}  # no 4-core group on trn1
    with pytest.raises(TemplateError, match=r"Neuron\(...\) or NeuronCores\(...\) alternatives"):
        FirstAvailable(Efa(1))  # type: ignore[arg-type]
    ClaimTemplate("fa-efa", FirstAvailable(NeuronCores(2), Neuron(1)), Efa(1))  # EFA of the cores' device


def test_numa_node_in_the_driver_domain_suggests_the_standard_attribute() -> None:
    t = ClaimTemplate("t", Neuron(1, selectors="device.attributes['neuron.aws.com'].numaNode == 0"))
    messages = [i.message for i in check(t, [TRN2]).errors]
    assert any("numaNode, which the driver does not publish; did you mean "
               "device.attributes['resource.kubernetes.io'].numaNode (resource.kubernetes.io/numaNode)?" in m
               for m in messages), messages
    assert not any("neuronCoreId" in m or "ultraserverNodeId4" in m for m in messages)
    # the same for a constraint's qualified name
    raw = ClaimTemplate("c", Neuron(2, instance_types=TRN2)).to_manifest()
    raw["spec"]["spec"]["devices"]["constraints"] = [{"matchAttribute": "neuron.aws.com/numaNode"}]
    assert any("did you mean 'resource.kubernetes.io/numaNode'?" in i.message for i in check(raw, [TRN2]).errors)


def test_a_quantity_compared_with_a_string_hints_quantity() -> None:
    t = ClaimTemplate("t", Neuron(1, selectors="device.capacity['neuron.aws.com'].memory >= '64Gi'"))
    errors = [i.message for i in check(t, [TRN2]).errors]
    assert any("compares device.capacity['neuron.aws.com'].memory (a quantity) with the string '64Gi'" in m
               and "compareTo(quantity('64Gi'))" in m for m in errors), errors
    swapped = ClaimTemplate("s", Neuron(1, selectors="'96Gi' == device.capacity['neuron.aws.com'].memory"))
    assert any("with the string '96Gi'" in i.message for i in check(swapped, [TRN2]).errors)
    # a quantity against a quantity with an operator: cel has no such overload; the hint names the methods
    ops = ClaimTemplate("q", Neuron(1, selectors="device.capacity['neuron.aws.com'].memory >= quantity('64Gi')"))
    assert any("x.compareTo(quantity(\"64Gi\")) >= 0" in i.message for i in check(ops, [TRN2]).errors)
    fine = ClaimTemplate("f", Neuron(1, selectors="device.capacity['neuron.aws.com'].memory"
                                                   ".compareTo(quantity('64Gi')) >= 0"))
    assert check(fine, [TRN2]).ok


def test_an_unknown_keyword_to_a_claim_class_gets_a_did_you_mean() -> None:
    with pytest.raises(TemplateError, match=r"Neuron\(\) keyword: 'instance_type' is not allowed.*"
                                            r"did you mean 'instance_types'\?"):
        Neuron(1, instance_type=TRN2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"did you mean 'namespace'\?"):  # still a TypeError, as Python's own
        ClaimTemplate("t", Neuron(1), namespce="ml")  # type: ignore[call-arg]
    with pytest.raises(TemplateError, match=r"did you mean 'node_lnc'\?"):
        NeuronCores(1, node_lnk=1)  # type: ignore[call-arg]
    with pytest.raises(TemplateError) as far:
        Efa(1, zzz=1)  # type: ignore[call-arg]
    assert "did you mean" not in str(far.value) and "count" in str(far.value)
    assert Neuron(count=2, instance_types=TRN2).count == 2  # known keywords still work


def test_a_first_available_alternative_that_never_fits_is_a_warning() -> None:
    t = ClaimTemplate("t", FirstAvailable(Neuron(16), Neuron(1)))
    report = check(t, ["inf2.48xlarge", "trn1.2xlarge"])
    assert report.ok  # the second alternative fits
    assert [str(i) for i in report.issues] == [
        "warning: request 'neurons/option1': this alternative can never be satisfied: it needs 16 devices and at "
        "most 12 match on one node of the checked instance types (inf2.48xlarge, trn1.2xlarge)"]
    assert not check(t, ["inf2.48xlarge", TRN2]).issues  # a trn2.48xlarge has 16
