"""Node LNC in the checks: `trn2.48xlarge:lnc=1` models the NeuronCores the driver publishes at LNC=1."""

from __future__ import annotations

import pytest

from neuron_dra.claim_templates import ClaimTemplate, NeuronCores, NodeType, TemplateError, check, check_against
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.partitions import CoreLayout
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool

TRN2 = "trn2.48xlarge"
CORES8 = ClaimTemplate("cores8", NeuronCores(8, instance_types=TRN2))


def test_node_type_text_and_values() -> None:
    assert NodeType.parse(TRN2) == NodeType(TRN2)
    assert NodeType.parse(f"{TRN2}:lnc=1") == NodeType(TRN2, 1)
    assert NodeType(TRN2, 1).label == f"{TRN2}:lnc=1" and NodeType(TRN2).label == TRN2
    assert NodeType(TRN2).effective_lnc() == 2 and NodeType(TRN2, 1).effective_lnc() == 1
    assert NodeType("trn1.32xlarge").effective_lnc() == 1
    for text in (f"{TRN2}:lnc=3", f"{TRN2}:lnc=", f"{TRN2}:cores=1", ""):
        with pytest.raises(TemplateError, match="INSTANCE_TYPE:lnc=N"):
            NodeType.parse(text)
    with pytest.raises(TemplateError, match=r"NodeType.lnc: 4 is not allowed; allowed: 1 or 2"):
        NodeType(TRN2, 4)


def test_lnc_on_a_family_without_lnc_says_to_drop_it() -> None:
    with pytest.raises(TemplateError, match=r"no lnc on trn1.32xlarge: Trainium1 has no Logical NeuronCores.*drop lnc"):
        NodeType("trn1.32xlarge", 2).spec()


def test_the_node_at_lnc1_is_what_the_driver_publishes_at_lnc1() -> None:
    """One source of truth: the checked node's devices are driver/model's pool at that LNC."""
    node = NodeCatalog().node(TRN2, 1)
    host = emulated_host(TRN2)
    pool = build_pool(host, NodeFacts(node.node_name), PublishOptions(cores=CoreLayout.for_spec(host.spec, 1)))
    neuron = [d.name.rpartition("/")[2] for d in node.devices if d.driver == "neuron.aws.com"]
    assert neuron == [d.name for d in pool.devices]
    assert node.lnc == 1 and len(neuron) == 16 + 16 * 8  # whole devices and 8 NeuronCores each
    assert NodeCatalog().node(TRN2).lnc == 2


def test_a_template_for_lnc1_nodes_passes_there_and_the_hint_names_the_attribute() -> None:
    report = check(CORES8, [TRN2, f"{TRN2}:lnc=1"])
    assert report.ok
    assert report.fit(f"{TRN2}:lnc=1").claims_per_node == 16 and report.fit(f"{TRN2}:lnc=1").lnc == 1
    default = report.fit(TRN2)
    assert default.claims_per_node == 0 and default.lnc == 2
    assert "publishes neuron.aws.com/coreGroup8_id at LNC=1 only (this node: LNC=2)" in (default.reason or "")
    assert f"to check nodes at LNC=1: {TRN2}:lnc=1" in (default.reason or "")
    assert "coreGroup4_id" not in (default.reason or "") and not report.errors  # no wrong did-you-mean
    check_against(CORES8, [NodeType(TRN2, 1)])  # the API a stack calls per node group


def test_a_bad_node_type_is_a_report_error() -> None:
    report = check(CORES8, ["trn1.32xlarge:lnc=1", "trn2.48xlarg"])
    messages = [i.message for i in report.errors]
    assert any("drop lnc" in m for m in messages)
    assert any("did you mean 'trn2.48xlarge'?" in m for m in messages)
    assert BUILTIN.names  # the catalog is unchanged
