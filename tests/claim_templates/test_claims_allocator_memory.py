"""The pruned search's memo stays small and bounded (issue 25 item 5): three claims on a trn2.48xlarge whose
last needs 8 EFAs when the first two took all 16 grew the old memo (keyed by every held device and which claim
held it) by one entry per way of splitting the EFAs."""

from __future__ import annotations

from typing import Any

import pytest

from neuron_dra.claim_templates import allocator
from neuron_dra.claim_templates.allocator import Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from tests.support.allocator_cases import Case

EFA_CLASS = "efa.networking.k8s.aws"


def efa_claim(name: str, count: int, selectors: tuple[str, ...] = ()) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": EFA_CLASS, "allocationMode": "ExactCount", "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "efa", "exactly": body}]}}}


@pytest.fixture(scope="module")
def catalog() -> NodeCatalog:
    return NodeCatalog(partitionable=False)


def run(node: NodeModel, claims: list[dict[str, Any]], mode: allocator.Mode = "fit-one", prune: bool = True
        ) -> allocator.SimulationResult:
    sim = Simulator(node.slices, node.device_classes, node.node_name, prune=prune, cel=CelEnvironment())
    full = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **c} for c in claims]
    return simulate(node.slices, node.device_classes, full, node_name=node.node_name, mode=mode, simulator=sim)


@pytest.mark.slow  # a whole search over the 3-claim trn2 case (tens of seconds)
def test_the_last_claim_needing_taken_efas_fails_in_a_small_memo(catalog: NodeCatalog) -> None:
    node = catalog.node("trn2.48xlarge")
    result = run(node, [efa_claim(f"c{i}", 8) for i in range(3)])
    assert not result.satisfiable and result.error is None
    # Entries per set of EFAs held and search position (measured: 91,278), not per split of the EFAs between the
    # claims (millions: the old key reached MEMO_LIMIT).
    assert result.memo_peaks[0] < 150_000 < allocator.MEMO_LIMIT
    assert result.searches[0] < 2_000_000


def test_a_full_memo_starts_again_and_the_answer_stays(catalog: NodeCatalog, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    node = catalog.node("trn1.32xlarge")
    claims = [efa_claim(f"c{i}", 3) for i in range(3)]
    want = run(node, claims)
    monkeypatch.setattr(allocator, "MEMO_LIMIT", 40)
    got = run(node, claims)
    assert got == want and not got.satisfiable
    assert max(got.memo_peaks) <= 40 < max(want.memo_peaks)


@pytest.mark.slow  # the plain search too
@pytest.mark.parametrize("mode", ["fit-one", "count"])
def test_the_pruned_answer_is_the_plain_search_answer(catalog: NodeCatalog, mode: allocator.Mode) -> None:
    """prune=False makes Go's allocateOne calls in Go's order: the same answers and error texts."""
    node = catalog.node("trn1.32xlarge")
    cases = [
        [efa_claim(f"c{i}", 3) for i in range(3)],  # 9 of 8 EFAs: no
        [efa_claim("c0", 3), efa_claim("c1", 3), efa_claim("c2", 2)],  # exactly 8: yes
        # The last claim's selector fails on every EFA: the error only the reached device raises.
        [efa_claim("c0", 4), efa_claim("c1", 4),
         efa_claim("c2", 1, ("device.attributes['resource.aws.com'].nothing == 'x'",))],
    ]
    for claims in cases:
        pruned, plain = run(node, claims, mode), run(node, claims, mode, prune=False)
        assert (pruned.satisfiable, pruned.count, pruned.error) == (plain.satisfiable, plain.count, plain.error)


@pytest.mark.gobuild
def test_kube_schedulers_allocator_gives_the_same_answers(catalog: NodeCatalog) -> None:
    """The same cases against Go's allocator (localcluster/go/allocsim, built from the Go module proxy)."""
    from tests.support.allocator_compare import compare, go_answers, python_answers, summary

    cases = [Case(f"efa-{n}", "efa", "trn1.32xlarge", tuple(efa_claim(f"c{i}", c) for i, c in enumerate(counts)),
                  (), "none") for n, counts in enumerate([(3, 3, 3), (3, 3, 2), (4, 4, 1)])]
    cel = CelEnvironment()
    python = python_answers(cases, catalog, cel)
    go = go_answers(cases, catalog, batches=1)
    verdicts = compare(cases, python, go.answers)
    assert all(v.kind == "agree" for v in verdicts), summary(verdicts)
