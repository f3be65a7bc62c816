"""bench/bench_scale.py's quick path: real control planes, emulated nodes' slices, three variants, three shapes.

Checks the report's structure and that every figure is positive (not its values: those depend on the machine), and
that --pprof writes a scheduler CPU profile per burst.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.process]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_scale.py"


def test_quick_run_reports_each_cell_and_burst(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--nodes", "12", "--pods", "4", "--slices", "ours,ours-aws-claims,aws",
         "--shapes", "no-claim,1-device,4-connected,1-device", "--dir", str(tmp_path / "d"), "--json", str(out),
         "--pprof", str(tmp_path / "pprof"), "--pprof-seconds", "2"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["profile"] == "tuned"
    cells = report["cells"]
    assert [(c["nodes"], c["slices"]) for c in cells] == [(12, "ours"), (12, "ours-aws-claims"), (12, "aws")]
    for cell in cells:
        assert cell["objects"] == 12 * 3  # a Node, its Neuron slice and its EFA slice
        assert set(cell["rss_mib"]) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
        assert all(v > 0 for v in cell["rss_mib"].values())
        assert [b["shape"] for b in cell["bursts"]] == ["no-claim", "1-device", "4-connected", "1-device"]
        for b in cell["bursts"]:
            assert b["pods"] == b["scheduled"] == 4
            assert b["pods_per_s"] > 0 and b["p99_ms"] >= b["p50_ms"] > 0
            # /proc counts CPU in 10 ms ticks: 4 pods without a claim (~3 ms each) may stay within one.
            assert b["scheduler_cpu_ms_per_pod"] > 0 or b["shape"] == "no-claim", b
            assert set(b["component_cpu_ms_per_pod"]) == set(cell["rss_mib"])
            assert b["component_cpu_ms_per_pod"]["kube-scheduler"] == b["scheduler_cpu_ms_per_pod"]
            assert b["component_cpu_ms_per_pod"]["kube-apiserver"] > 0
            assert (b["predicted_cpu_ms_per_pod"] is None) == (b["shape"] == "no-claim")
        assert all(b["predicted_cpu_ms_per_pod"] > 0 for b in cell["bursts"][1:])
    assert "against AWS's claims on AWS-shaped slices" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith("     12 nodes 1-device"))
    assert "aws " in line and "ours-aws-claims " in line and "x)" in line
    assert "(median of 2 bursts)" in line  # 1-device, named twice
    # The cost model: per variant and claim shape, every component's CPU seconds per pod and the cores implied.
    costs = [x for x in result.stdout.splitlines() if "cores for 50/s" in x]
    assert len(costs) == 3 * 2 and all("apiserver" in x and "etcd" in x and "kcm" in x for x in costs)
    profiles = sorted((tmp_path / "pprof").iterdir())
    assert len(profiles) == 12 and all(p.suffix == ".pprof" and p.stat().st_size > 0 for p in profiles)
    assert {p.name.rsplit("-", 1)[0] for p in profiles} == {
        f"12-{m}-{s}" for m in ("ours", "ours-aws-claims", "aws") for s in ("no-claim", "1-device", "4-connected")}


def test_bad_options_are_refused(tmp_path: Path) -> None:
    for args, message in ((["--nodes", "0"], "--nodes '0': give whole numbers from 1 to 5000"),
                          (["--slices", "gpu"], "--slices gpu: not known; choose from ours, ours-aws-claims, aws"),
                          (["--shapes", "2-device"], "--shapes 2-device: not known"),
                          (["--pprof-seconds", "0"], "--pprof-seconds 0: give 1 to 600"),
                          (["--ultraserver", "--slices", "ours"],
                           "--slices ours: not known; choose from ultra-ours, ultra-aws, ultra-ours-no-affinity, "
                           "ultra-ours-counters, ultra-ours-whole, ultra-ours-per-device, "
                           "ultra-ours-whole-affinity")):
        result = subprocess.run([sys.executable, str(BENCH), *args, "--dir", str(tmp_path)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode != 0 and message in result.stderr, result.stderr


def test_the_ultraserver_job_shape_binds_every_job_pod_in_both_variants(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--ultraserver", "--nodes", "8", "--pods", "8", "--dir", str(tmp_path / "d"),
         "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cells = json.loads(out.read_text())["cells"]
    assert [c["slices"] for c in cells] == ["ultra-ours", "ultra-aws"]
    # Nodes, their Neuron and EFA slices; ours adds per 4-node set the controller's default (no shared counters):
    # a group slice for the whole and for each half.
    assert [c["objects"] for c in cells] == [8 * 3 + 2 * 3, 8 * 3]
    for cell in cells:
        (b,) = cell["bursts"]
        assert b["shape"] == "ultraserver-job" and b["pods"] == b["scheduled"] == 8, b
        assert b["scheduler_cpu_ms_per_pod"] > 0
    line = next(x for x in result.stdout.splitlines() if x.startswith("      8 nodes ultraserver-job"))
    assert "ultra-aws " in line and "ultra-ours " in line and "x;" in line


def test_the_cheaper_ultraserver_shapes_bind_every_job_pod_and_are_profiled(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    variants = ("ultra-ours-counters", "ultra-ours-per-device", "ultra-ours-no-affinity")
    result = subprocess.run(
        [sys.executable, str(BENCH), "--ultraserver", "--nodes", "8", "--pods", "8", "--slices", ",".join(variants),
         "--dir", str(tmp_path / "d"), "--json", str(out), "--pprof", str(tmp_path / "pprof"), "--pprof-seconds", "2"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cells = json.loads(out.read_text())["cells"]
    assert [c["slices"] for c in cells] == list(variants)
    # Nodes and their two slices; counters: per 4-node set its pool as on 1.36 with --shared-counters=auto (the
    # counter slice, the whole's and each half's); per-device: both wholes' devices in one slice (the API server
    # accepted the per-device selectors); no-affinity: the whole and its halves.
    assert [c["objects"] for c in cells] == [8 * 3 + 2 * 4, 8 * 3 + 1, 8 * 3 + 2 * 3]
    for cell in cells:
        (b,) = cell["bursts"]
        assert b["pods"] == b["scheduled"] == 8, b
    profiles = sorted((tmp_path / "pprof").iterdir())
    assert {p.name.rsplit("-", 1)[0] for p in profiles} == {f"8-{v}-ultraserver-job" for v in variants}
    assert all(p.stat().st_size > 0 for p in profiles)


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_scale", module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules["bench_scale"])  # puts bench/ on sys.path for scale_cluster
    return sys.modules["bench_scale"]


class _Collect:
    """Takes what load_ultraserver_objects creates (the objects only; the runs above create them for real)."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create_all(self, items: Any) -> None:
        self.created += list(items)


def test_ultra_ours_measures_what_ultraserverjob_renders_on_nodes_labelled_as_the_controller_labels() -> None:
    b = bench()
    from neuron_dra.claim_templates.ultraserver import UltraServerJob

    def loaded(variant: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        api = _Collect()
        b.load_ultraserver_objects(api, 8, variant)
        nodes = [o for path, o in api.created if path == "/api/v1/nodes"]
        job = b.ultra_job(1)
        return nodes, b.ultra_pod("p", job, variant)

    nodes, pod = loaded("ultra-ours")
    job = UltraServerJob("us-job-1", nodes=4, instance_types="trn2u.48xlarge", namespace=b.NAMESPACE)
    assert pod["spec"]["affinity"] == job.affinity() and pod["metadata"]["labels"] == job.pod_labels()
    assert {c["resourceClaimName"] for c in pod["spec"]["resourceClaims"] if "resourceClaimName" in c} == {"us-job-1"}
    # the topology the pods name: on every node, each value on exactly one UltraServer's 4 nodes (what the
    # controller sets: test_controller_apiserver.py, test_e2e_ultraserver.py)
    by_value: dict[str, list[str]] = {}
    for n in nodes:
        by_value.setdefault(n["metadata"]["labels"][job.topology_key], []).append(n["metadata"]["name"])
    assert sorted(by_value.values()) == [[f"us-{i:05d}" for i in range(4)], [f"us-{i:05d}" for i in range(4, 8)]]
    _, pod = loaded("ultra-ours-no-affinity")
    assert "affinity" not in pod["spec"] and not pod["metadata"].get("labels")
    nodes, pod = loaded("ultra-aws")  # AWS's way: its own node label, no controller's
    assert pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] == b.ULTRA_LABEL
    assert job.topology_key not in nodes[0]["metadata"]["labels"]
