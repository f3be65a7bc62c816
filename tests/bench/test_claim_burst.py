"""bench/bench_claim_burst.py refuses a burst larger than the node's NeuronCores before it starts a cluster (the
full run is the benchmark itself: a local cluster, 64 pods; README Benchmarks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_claim_burst.py"


def test_more_pods_than_cores_is_refused(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--pods", "65", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "--pods 65: give 1 to 64 (a trn2.48xlarge's cores)" in result.stderr
    assert not any(tmp_path.iterdir())  # no cluster was started
