"""`claims check --nodes N` (claim_templates/scale.py): the scheduler's filter work for a template at a cluster size.

The node count the scheduler filters follows kube-scheduler's numFeasibleNodesToFind; the selector evaluations
follow Go's first-fit visit order on the claim checks' node model (the EFA driver's pool, `dra.net`, sorts before
`neuron.aws.com`, so a Neuron request first fails the class selector on each EFA). The per-node and per-evaluation
prices are calibrated with bench/bench_scale.py; these tests pin the counts and the command's output, not prices.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_dra.claim_templates import ClaimTemplate, Neuron
from neuron_dra.claim_templates.examples import (
    neuron_1x4_connected,
    one_neuron_device,
    trn2_8_connected_efa,
)
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.scale import (
    DRA_FILTER_TIMEOUT_MS,
    ScaleEstimate,
    check_nodes,
    estimate,
    feasible_nodes_to_find,
    selector_evaluations,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "neuron_dra" / "claim_templates" / "examples.py"
CATALOG = NodeCatalog(partitionable=False)


@pytest.mark.parametrize(("nodes", "percentage", "filtered"), [
    (50, None, 50),  # below 100 nodes: every node
    (100, None, 100),
    (500, None, 230),  # 50 - 500/125 = 46 %
    (1000, None, 420),  # 42 %
    (5000, None, 500),  # 10 %
    (10000, None, 500),  # at least 5 %
    (1000, 10, 100),
    (1000, 5, 100),  # never fewer than 100
    (3000, 10, 300),
])
def test_filtered_nodes_follow_the_scheduler(nodes: int, percentage: int | None, filtered: int) -> None:
    assert feasible_nodes_to_find(nodes, percentage) == filtered


def test_one_device_on_trn2_first_fails_on_every_efa() -> None:
    # 16 EFAs x the Neuron class selector, then device 0: class selector + the request's resourceType selector.
    assert selector_evaluations(one_neuron_device, CATALOG.node("trn2.48xlarge")) == 16 + 2


def test_one_device_without_efas_takes_two_evaluations() -> None:
    assert selector_evaluations(one_neuron_device, CATALOG.node("inf2.48xlarge")) == 2


def test_connected_and_efa_requests_add_their_devices() -> None:
    trn2 = CATALOG.node("trn2.48xlarge")
    # The class selector fails on the 16 EFAs (their pool comes first); then per device the class and instanceType.
    assert selector_evaluations(neuron_1x4_connected, trn2) == 16 + 4 * 2
    # 8 Neuron devices x 2 selectors after the 16 EFAs, then the EFA request's class selector on 8 EFAs.
    assert selector_evaluations(trn2_8_connected_efa, trn2) == 16 + 8 * 2 + 8


def test_estimate_grows_with_the_nodes_filtered() -> None:
    small, large = estimate(neuron_1x4_connected, 100, catalog=CATALOG), estimate(neuron_1x4_connected, 1000,
                                                                                   catalog=CATALOG)
    assert small.per_node_ms == large.per_node_ms > 0
    assert (small.filtered_nodes, large.filtered_nodes) == (100, 420)
    assert large.cpu_ms_per_pod > small.cpu_ms_per_pod
    assert estimate(neuron_1x4_connected, 1000, catalog=CATALOG, percentage_of_nodes_to_score=10).filtered_nodes \
        == 100
    assert large.warning is None


def test_warning_near_the_filter_timeout() -> None:
    near = ScaleEstimate("t", 1000, "trn2.48xlarge", 420, 10**6, 0.6 * DRA_FILTER_TIMEOUT_MS, 1.0)
    assert near.warning is not None and "10 s limit per node" in near.warning and "t at 1000 nodes" in near.warning
    slow = ScaleEstimate("t", 1000, "trn2.48xlarge", 420, 10, 30.0, 12_600.0)
    assert slow.warning is not None and "about 13 s of scheduler CPU per pod" in slow.warning


@pytest.mark.parametrize("nodes", [0, -1, 100_001])
def test_bad_node_count_is_refused(nodes: int) -> None:
    with pytest.raises(ValueError, match=rf"--nodes {nodes}: give a cluster size from 1 to 100000 nodes"):
        check_nodes(nodes)


def test_all_devices_request_evaluates_every_device() -> None:
    every = ClaimTemplate("every", Neuron(16, instance_types="trn2.48xlarge"))
    assert selector_evaluations(every, CATALOG.node("trn2.48xlarge")) == 16 + 16 * 2


def _claims(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuron_dra", "claims", "check", str(EXAMPLES), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.process
def test_check_nodes_prints_the_estimates() -> None:
    result = _claims("--instance-type", "trn2.48xlarge", "--nodes", "1000")
    assert "control-plane CPU per claim pod at 1000 nodes" in result.stdout
    assert "(calibrated with bench/bench_scale.py --together at 1,000 trn2.48xlarge nodes" in result.stdout
    assert "default/one-neuron-device on trn2.48xlarge: 18 selector evaluations" in result.stdout
    assert "x 420 nodes filtered" in result.stdout


@pytest.mark.process
def test_check_nodes_json_carries_the_estimates() -> None:
    result = _claims("--instance-type", "trn2.48xlarge", "--nodes", "500", "--json", "--core-partitions", "off")
    reports = {r["template"]: r for r in json.loads(result.stdout)}
    scale = reports["default/neuron-1x4-connected"]["scale"]
    assert [(s["instanceType"], s["nodes"], s["filteredNodes"], s["selectorEvaluations"]) for s in scale] == [
        ("trn2.48xlarge", 500, 230, 24)]
    assert scale[0]["cpuMsPerPod"] > 0 and scale[0]["warning"] is None


def test_counters_on_1_36_cost_every_other_node() -> None:
    """With NeuronCores published (the driver's default on 1.36) each filtered node reads every node's counters."""
    with_cores = NodeCatalog(partitionable=True)
    small = estimate(one_neuron_device, 50, catalog=with_cores, shared_counters=True)
    large = estimate(one_neuron_device, 500, catalog=with_cores, shared_counters=True)
    without = estimate(one_neuron_device, 500, catalog=CATALOG)
    assert large.per_node_ms > 5 * small.per_node_ms and large.per_node_ms > 50 * without.per_node_ms
    assert large.warning is not None and "of scheduler CPU per pod" in large.warning
    assert estimate(one_neuron_device, 500, catalog=with_cores).per_node_ms == without.per_node_ms


@pytest.mark.process
def test_check_nodes_refuses_a_bad_count() -> None:
    result = _claims("--nodes", "0")
    assert result.returncode == 2
    assert "--nodes 0: give a cluster size from 1 to 100000 nodes" in result.stderr
