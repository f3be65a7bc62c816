"""Differential test: the Python allocator simulation against kube-scheduler's allocator (Go, v0.34.12).

Thousands of seeded cases (tests/support/allocator_cases.py: claims x every catalog node x already allocated
devices) run through both allocators in both modes; they must agree on every run: satisfiable or not, how
many copies fit, and whether the allocator returned an error. Go runs in allocsim processes alongside
the Python side. The summary table prints with `pytest -s`.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from dataclasses import dataclass

import pytest

from neuron_dra.claim_templates.allocator import DeviceId
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.driver.model.catalog import CATALOG
from tests.support.allocator_cases import Case, CaseGenerator, GeneratedCases, case_digest
from tests.support.allocator_compare import GoRun, Verdict, compare, go_answers, python_answers, summary

SEED = 20250612
CASES = 2400  # of which the examples on every node are 480 (some dropped as too large for Go's search)


@dataclass(frozen=True)
class Differential:
    generated: GeneratedCases
    verdicts: list[Verdict]
    go: GoRun


@pytest.fixture(scope="module")
def catalog() -> NodeCatalog:
    # Whole devices only: these generators shape one-slice pools; NeuronCores and counters have their own
    # differential cases (test_allocator_differential_cores.py).
    return NodeCatalog(partitionable=False)


@pytest.fixture(scope="module")
def differential(catalog: NodeCatalog) -> Differential:
    cel = CelEnvironment()
    generated = CaseGenerator(SEED, catalog, cel).generate(CASES)
    go: list[GoRun] = []
    failure: list[BaseException] = []

    def run_go() -> None:
        try:
            go.append(go_answers(generated.cases, catalog))
        except BaseException as e:  # re-raised below, in the test's thread
            failure.append(e)

    thread = threading.Thread(target=run_go)
    thread.start()
    python = python_answers(generated.cases, catalog, cel)
    thread.join()
    if failure:
        raise failure[0]
    verdicts = compare(generated.cases, python, go[0].answers)
    print(f"\n{len(generated.cases)} cases, {len(verdicts)} runs; dropped as over Go's search budget: "
          f"{dict(Counter(c.category for c in generated.rejected))}\n{summary(verdicts)}")
    return Differential(generated, verdicts, go[0])


@pytest.mark.gobuild
@pytest.mark.slow
@pytest.mark.process
def test_cases_cover_claims_hosts_and_allocations(differential: Differential) -> None:
    cases = differential.generated.cases
    assert len(cases) >= 2000
    by_category = Counter(c.category for c in cases)
    assert set(by_category) == {"typed", "raw", "all", "efa", "first-available", "multi-claim", "ultraserver",
                                "unsatisfiable", "cel-error", "pools", "examples"}, by_category
    assert min(by_category.values()) >= 50, by_category
    assert {c.instance_type for c in cases} == set(CATALOG)
    labels = {c.allocated_label.split(" ")[0] for c in cases}
    assert {"none", "random", "one", "every", "all", "half", "rows", "first"} <= labels, labels
    assert {c.note for c in cases if c.category == "pools"} >= {"split", "incomplete", "stale generation",
                                                                  "duplicate name"}
    # The answers spread: both outcomes in every category that can have both, many different counts, errors.
    runs = [v for v in differential.verdicts if v.kind != "go-timeout"]
    for category in set(by_category) - {"unsatisfiable"}:
        outcomes = {v.go.satisfiable for v in runs if v.case.category == category}
        assert outcomes == {True, False}, (category, outcomes)
    assert not any(v.go.satisfiable for v in runs if v.case.category == "unsatisfiable")
    counts = Counter(v.go.count for v in runs if v.mode == "count")
    assert len(counts) >= 12 and counts[16] > 0, counts
    assert sum(1 for v in runs if v.case.category == "cel-error" and v.go.error) >= 20
    assert sum(1 for v in runs if v.case.category == "first-available" and v.go.satisfiable) >= 50


@pytest.mark.gobuild
@pytest.mark.slow
@pytest.mark.process
def test_python_simulation_agrees_with_kube_scheduler(differential: Differential) -> None:
    disagreements = [v for v in differential.verdicts if v.kind == "disagree"]
    assert not disagreements, (
        f"{len(disagreements)} of {len(differential.verdicts)} runs disagree:\n"
        + "\n".join(v.describe() for v in disagreements[:40]))
    assert sum(v.kind == "agree" for v in differential.verdicts) >= 2 * 2000


@pytest.mark.gobuild
@pytest.mark.slow
@pytest.mark.process
def test_generated_searches_stay_under_the_filter_timeout(differential: Differential) -> None:
    """The generator leaves out cases whose Go search would be large; a timeout here means its estimate
    missed one (a timeout is not an answer, so such runs count neither as agreement nor as disagreement)."""
    timeouts = [v for v in differential.verdicts if v.kind == "go-timeout"]
    assert not timeouts, "\n".join(v.describe() for v in timeouts)
    assert differential.generated.rejected, "the budget never cut anything: the estimate is not exercised"


@pytest.mark.parametrize("count", [30, pytest.param(120, marks=pytest.mark.slow)])  # 120: about 7 s of CPU
def test_generation_is_deterministic(catalog: NodeCatalog, count: int) -> None:
    def digest(seed: int) -> str:
        return case_digest(CaseGenerator(seed, catalog, CelEnvironment()).generate(count, examples=False).cases)

    assert digest(7) == digest(7)
    assert digest(7) != digest(8)


@pytest.mark.gobuild
@pytest.mark.process
def test_incomplete_pool_is_treated_as_kubernetes_does(catalog: NodeCatalog) -> None:
    """Incomplete pools follow the allocator of the default minor: Kubernetes 1.34 refused them only for
    `All` requests and allocated ExactCount requests from the slices it had; 1.36 allocates nothing from
    them (structured/internal/experimental: `if pool.IsIncomplete || pool.IsInvalid { continue }`)."""
    node = catalog.node("trn2.48xlarge")
    half = copy.deepcopy(node.slices[0])
    half["spec"]["devices"] = half["spec"]["devices"][:8]
    half["spec"]["pool"]["resourceSliceCount"] = 2  # the slice with devices 8-15 has not arrived yet
    row = {"metadata": {"name": "c0", "namespace": "default"}, "spec": {"devices": {
        "requests": [{"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com", "count": 4}}],
        "constraints": [{"matchAttribute": "resource.aws.com/devicegroup4_id"}]}}}
    every = {"metadata": {"name": "c1", "namespace": "default"}, "spec": {"devices": {
        "requests": [{"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com", "allocationMode": "All"}}]}}}
    taken = (DeviceId("neuron.aws.com", node.node_name, "neuron-device-5"),)
    cases = [Case("incomplete-row", "pools", node.instance_type, (row,), taken, "device 5",
                  (half, *node.slices[1:])),
             Case("incomplete-all", "pools", node.instance_type, (every,), (), "none", (half, *node.slices[1:]))]
    python = python_answers(cases, catalog, CelEnvironment())
    go = go_answers(cases, catalog, batches=1).answers
    verdicts = compare(cases, python, go)
    assert [v.kind for v in verdicts] == ["agree"] * 4, "\n".join(v.describe() for v in verdicts)
    by_run = {(v.case.id, v.mode): v.python for v in verdicts}
    assert by_run[("incomplete-row", "count")].key() == (False, 0, False)  # nothing from the incomplete pool
    assert "currently being updated" in by_run[("incomplete-all", "fit-one")].error
