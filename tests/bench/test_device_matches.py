"""bench/bench_device_matches.py: the Go harness on kube-scheduler's CEL device matching, with our device variants.

Checks what does not depend on the machine: which variants run, how many selectors each evaluates (the allocator's
order: a device of another driver stops at the class selector), and the allocations per evaluation, which follow
from the device's attributes and capacities alone (DeviceMatches copies them into fresh maps each time).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.gobuild

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_device_matches.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_device_matches", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts bench/ on sys.path for scale_cluster, as when run as a script
    return module


@pytest.mark.process
def test_each_variant_is_evaluated_and_ours_allocates_more_than_aws_for_each_part(tmp_path: Path) -> None:
    out = tmp_path / "dm.json"
    result = subprocess.run([sys.executable, str(BENCH), "--rounds", "2", "--iterations", "300", "--json", str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["summary"]}
    assert list(rows) == ["aws", "ours", "ours-no-capacity", "ours-no-standard", "ours-aws-domain", "efa"]
    per_iteration = {r["name"]: r["evalsPerIteration"] for r in report["results"]}
    assert per_iteration["efa"] == 1  # the Neuron class's selector is false on the EFA: nothing after it
    assert all(per_iteration[n] == len(report["expressions"]) for n in rows if n != "efa")
    assert len(report["results"]) == 2 * len(rows)
    # Every part ours has beyond AWS's attribute set costs allocations on each evaluation.
    for part in ("ours-no-capacity", "ours-no-standard", "ours-aws-domain"):
        assert rows["aws"]["allocs"] < rows[part]["allocs"] < rows["ours"]["allocs"], part
    assert all(r["cpu_us"] > 0 for r in rows.values())


def test_the_variants_come_from_the_published_model() -> None:
    variants = {v["name"]: v for v in bench().variants()}
    ours, aws = variants["ours"], variants["aws"]
    assert set(aws["attributes"]) < set(ours["attributes"])
    assert ours["capacity"] and not aws["capacity"]
    assert not any(k.startswith("resource.kubernetes.io/") for k in variants["ours-no-standard"]["attributes"])
    assert variants["efa"]["driver"] == "dra.net"
    # The class's selector first, then the templates' request selectors, as rendered.
    exprs = bench().expressions()
    assert exprs[0].startswith('device.driver == "neuron.aws.com"') and len(exprs) == 3


@pytest.mark.process
def test_bad_input_is_refused_by_the_harness() -> None:
    harness = bench().harness()
    bad = [({"expressions": ["true"], "devices": [], "rounds": 1, "iterations": 1}, "at least one"),
           ({"expressions": ["true"], "devices": [{"name": "d", "driver": "x"}], "rounds": 0, "iterations": 1},
            "rounds 0: allowed 1..100"),
           ({"expressions": ["true"], "devices": [{"name": "d", "driver": "x"}], "rounds": 1, "iterations": 1,
             "typo": 1}, "unknown field"),
           ({"expressions": ["device.attributes["], "devices": [{"name": "d", "driver": "x"}], "rounds": 1,
             "iterations": 1}, "expression")]
    for body, message in bad:
        proc = subprocess.run([str(harness)], input=json.dumps(body), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (body, proc.stderr)
