"""`neuron-dra demo`: its report from pod records (offline), and the whole demo end to end in a subprocess
against the real control plane (binaries built on first use), including teardown on success and on SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.claim_templates import check
from neuron_dra.claim_templates.examples import inf2_ring_segment_4, trn2_8_else_trn1_16
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.neuron_env import core_ranges
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices
from neuron_dra.localcluster.demo.health import FaultPlan, plan_faults
from neuron_dra.localcluster.demo.report import (
    PodOutcome,
    Prediction,
    ReportError,
    aligned_block,
    format_table,
    job_summary,
    node_views,
    outcome_from_record,
    prediction,
)
from neuron_dra.localcluster.demo.topology_view import render_svg, render_text
from neuron_dra.localcluster.demo.workloads import (
    CORE_STAGE,
    DEMO_NAMESPACE,
    DEMO_NODE_ARGS,
    DEMO_STAGES,
    SPARE,
    ULTRASERVER_JOB,
    ULTRASERVER_STAGE,
    demo_instance_types,
    demo_jobs,
    demo_stages,
    demo_templates,
    pod_manifest,
    runs_health_stage,
    workloads,
)
from neuron_dra.localcluster.nodes.efa_emulator import efa_devices
from neuron_dra.localcluster.nodes.topology import DEMO_NODES, NodeSpec, parse_nodes, runtime_dir
from tests.support import kubeschema

# These tests exercise the demo itself (table, teardown, signals) on the fast fake runtime; real containers:
# tests/e2e/test_e2e_containerd.py.
DEMO_FAKE = (sys.executable, "-m", "neuron_dra", "demo", "--runtime", "fake")

SVG_NS = "{http://www.w3.org/2000/svg}"


def _record(pod: str, node: str, devices: list[tuple[str, str]], env: dict[str, str]) -> dict[str, Any]:
    return {"namespace": DEMO_NAMESPACE, "pod": pod, "uid": "u1", "node": node,
            "claims": {"neuron": {"name": f"{pod}-neuron-x", "uid": "c1", "devices": [
                {"requestNames": [req], "pool": node, "device": dev, "cdiDeviceIds": []} for req, dev in devices]}},
            "containers": {"main": {"cdiDevices": [], "env": env, "deviceNodes": []}}}


# --- offline: the report ------------------------------------------------------------------------------------

def test_outcome_from_a_record_splits_neuron_and_efa_devices() -> None:
    rec = _record("efa-aligned", "trn2-48xlarge-2",
                  [("neurons", f"neuron-device-{i}") for i in (13, 12, 15, 14)]
                  + [("efa", f"efa-{i}") for i in (12, 13, 14, 15)],
                  {"NEURON_RT_VISIBLE_CORES": "48-63", "NEURON_LOGICAL_NC_CONFIG": "2"})
    o = outcome_from_record(rec, "neuron-efa-aligned", "trn2.48xlarge")
    assert o.neuron_devices == (12, 13, 14, 15) and o.efa_devices == (12, 13, 14, 15)
    assert o.requests == ("neurons",) and o.visible_cores == "48-63" and o.lnc == "2"
    with pytest.raises(ReportError, match="containers"):
        outcome_from_record({"claims": {}}, "t", "trn2.48xlarge", where="x.json")
    with pytest.raises(ReportError, match="neuron-device-x"):
        outcome_from_record(_record("p", "n", [("neurons", "neuron-device-x")], {}), "t", "trn2.48xlarge")


def test_aligned_blocks() -> None:
    assert aligned_block([8, 9, 10, 11]) and aligned_block(list(range(16))) and aligned_block([4, 5, 6, 7])
    assert not aligned_block([2, 3, 4, 5])  # contiguous but across two rows
    assert not aligned_block([0, 1, 3, 4]) and not aligned_block([])


def test_prediction_and_match_for_first_available_on_trn1() -> None:
    report = check(trn2_8_else_trn1_16, ["trn2.48xlarge", "trn1.32xlarge"])
    p = prediction(report, "trn1.32xlarge")
    assert p == Prediction(1, ("neurons/trn1",), tuple(range(16)))
    assert prediction(report, "trn2.48xlarge").requests == ("neurons/trn2",)
    base = PodOutcome("fa", "trn2-8-else-trn1-16", "trn1-32xlarge-1", "trn1.32xlarge", ("neurons/trn1",),
                      tuple(range(16)), (), "0-31", "", p)
    assert base.matches_prediction
    # the other alternative, fewer devices, or an unaligned set are not what the check predicted
    assert not PodOutcome(**{**base.__dict__, "requests": ("neurons/trn2",)}).matches_prediction
    assert not PodOutcome(**{**base.__dict__, "neuron_devices": tuple(range(8))}).matches_prediction
    ring = prediction(check(inf2_ring_segment_4, ["inf2.48xlarge"]), "inf2.48xlarge")
    seg = PodOutcome("r", "inf2-ring-segment-4", "inf2", "inf2.48xlarge", ("neurons",), (2, 3, 4, 5), (), "", "",
                     ring)
    assert ring.neuron_devices == (0, 1, 2, 3) and not seg.matches_prediction
    assert PodOutcome(**{**seg.__dict__, "neuron_devices": (8, 9, 10, 11)}).matches_prediction


def test_table_and_views() -> None:
    p = Prediction(3, ("neurons",), (0, 1, 2, 3))
    outcomes = [PodOutcome("ring-a", "inf2-ring-segment-4", "inf2-48xlarge-1", "inf2.48xlarge", ("neurons",),
                           (4, 5, 6, 7), (), "8-15", "", p),
                PodOutcome("ring-b", "inf2-ring-segment-4", "inf2-48xlarge-1", "inf2.48xlarge", ("neurons",),
                           (1, 2, 3, 4), (), "2-9", "", p)]
    lines = format_table(outcomes).splitlines()
    assert lines[0].split()[:3] == ["POD", "TEMPLATE", "NODE"]
    assert lines[1].split() == ["ring-a", "inf2-ring-segment-4", "inf2-48xlarge-1", "neurons", "4-7", "-", "8-15",
                                "-", "-", "3/node,", "4", "dev", "0-3", "yes"]
    assert lines[2].split()[-1] == "NO"
    (view,) = node_views([NodeSpec("inf2-48xlarge-1", "inf2.48xlarge")], outcomes[:1])
    assert dict(view.owners) == {4: "ring-a", 5: "ring-a", 6: "ring-a", 7: "ring-a"}


def _job_outcome(i: int, node: str, pool: str = "ultraserver-4/us-a", server: str = "us-a",
                 node_id: str | None = None) -> PodOutcome:
    nodes = tuple(f"trn2u-48xlarge-{k}" for k in (1, 2, 3, 4))
    env = {"NEURON_RT_ULTRASERVER_MODE": "4", "NEURON_RT_ULTRASERVER_SERVER_ID": server,
           "NEURON_RT_ULTRASERVER_NODE_ID": str(i) if node_id is None else node_id}
    return PodOutcome(f"ultra-{i}", "ultra-node", node, "trn2u.48xlarge", ("neurons",), tuple(range(16)),
                      tuple(range(16)), "0-63", "2", None, pool, nodes, env)


def test_an_ultraserver_job_is_shown_and_checked_from_its_records() -> None:
    rec = _record("ultra-2", "trn2u-48xlarge-3", [("neurons", f"neuron-device-{i}") for i in range(16)],
                  {"NEURON_RT_VISIBLE_CORES": "0-63", "NEURON_RT_ULTRASERVER_MODE": "4",
                   "NEURON_RT_ULTRASERVER_SERVER_ID": "us-a", "NEURON_RT_ULTRASERVER_NODE_ID": "2"})
    rec["groups"] = [{"claim": "ultra", "pool": "ultraserver-4/us-a", "device": "ultraserver",
                      "nodes": [f"trn2u-48xlarge-{k}" for k in (1, 2, 3, 4)]}]
    o = outcome_from_record(rec, "ultra-node", "trn2u.48xlarge")
    assert o.group == "ultraserver-4/us-a" and o.ultraserver == "ultraserver-4/us-a node 2"
    assert o.group_nodes == tuple(f"trn2u-48xlarge-{k}" for k in (1, 2, 3, 4)) and o.neuron_devices == tuple(range(16))
    with pytest.raises(ReportError, match="groups"):
        outcome_from_record({**rec, "groups": "ultraserver-4/us-a"}, "ultra-node", "trn2u.48xlarge")
    row = format_table([o]).splitlines()[1]
    assert "ultraserver-4/us-a node 2" in row
    good = [_job_outcome(i, f"trn2u-48xlarge-{i + 1}") for i in range(4)]
    line = job_summary("ultra", 4, good)
    assert line.startswith("UltraServer job ultra: 4 pods share the claim of one group device (ultraserver-4/us-a: "
                           "trn2u-48xlarge-1, trn2u-48xlarge-2, trn2u-48xlarge-3, trn2u-48xlarge-4)")
    assert "ultra-3 -> trn2u-48xlarge-4 (node 3)" in line and "mode 4 of server us-a" in line
    # what the demo refuses: two groups, two pods on one node, other server ids or node ids, a pod without group
    for bad, why in (([*good[:3], _job_outcome(3, "trn2u-48xlarge-4", pool="ultraserver-4/us-b")], "groups"),
                     ([*good[:3], _job_outcome(3, "trn2u-48xlarge-3")], "one pod on each"),
                     ([*good[:3], _job_outcome(3, "trn2u-48xlarge-4", server="us-b")], "server ids"),
                     ([*good[:3], _job_outcome(3, "trn2u-48xlarge-4", node_id="2")], "node ids"),
                     ([*good[:3], dataclasses.replace(good[3], group="", ultraserver_env={})], "3 of its 4")):
        with pytest.raises(ReportError, match=why):
            job_summary("ultra", 4, bad)
    # the pictures: each trn2u node titled with its UltraServer and group; the SVG frames the four together
    nodes = parse_nodes(["trn2.48xlarge:1", "trn2u.48xlarge:4"])
    views = node_views(nodes, good)
    assert views[0].ultraserver == "" and [v.ultraserver_node for v in views[1:]] == [0, 1, 2, 3]
    assert render_text(views[3]).splitlines()[0] == ("trn2u-48xlarge-3 (trn2u.48xlarge, torus4x4) UltraServer "
                                                     "trn2u.48xlarge/ultraserver-1 node 2, group device "
                                                     "ultraserver-4/us-a")
    root = ET.fromstring(render_svg(views))
    frames = [g for g in root.iter(f"{SVG_NS}g") if (g.findtext(f"{SVG_NS}title") or "").startswith("UltraServer")]
    assert len(frames) == 1
    assert frames[0].findtext(f"{SVG_NS}title") == ("UltraServer trn2u.48xlarge/ultraserver-1 (4 nodes): one job on "
                                                    "group device ultraserver-4/us-a")
    rect = frames[0].find(f"{SVG_NS}rect")
    assert rect is not None and float(rect.get("x", "0")) == 260 + 3 and float(rect.get("width", "0")) == 4 * 260 - 6


def test_an_ultraserver_job_pod_names_the_shared_claim_and_its_own() -> None:
    manifest = pod_manifest(ULTRASERVER_STAGE.workloads[1])
    kubeschema.validate(manifest, "1.34", strict=True)
    assert manifest["spec"]["resourceClaims"] == [{"name": "ultraserver", "resourceClaimName": "ultra"},
                                                  {"name": "node", "resourceClaimTemplateName": "ultra-node"}]
    assert manifest["spec"]["containers"][0]["resources"]["claims"] == [{"name": "ultraserver"}, {"name": "node"}]
    job = ULTRASERVER_STAGE.workloads[1].job
    assert job is not None and manifest["spec"]["affinity"] == job.affinity()  # the job's pod side, too
    assert manifest["metadata"]["labels"].items() >= job.pod_labels().items()


# --- offline: what the demo installs and runs ---------------------------------------------------------------

def test_demo_pods_and_templates_are_valid_objects() -> None:
    for w in (*workloads(), SPARE):
        kubeschema.validate(pod_manifest(w), "1.34", strict=True)
    templates = demo_templates()
    # Every example once: AWS's 8 official samples, the richer cases (trn3 ones included), the demo's own two and
    # the UltraServer job's per-pod template.
    assert {t.namespace for t in templates} == {DEMO_NAMESPACE} and len({t.name for t in templates}) == 21
    kubeschema.validate(ULTRASERVER_JOB.group_claim(), "1.34", strict=True)
    names = {t.name for t in templates}
    assert all(w.template.name in names for w in (*workloads(), SPARE))


def _outcome(pod: str, node: str, devices: tuple[int, ...]) -> PodOutcome:
    return PodOutcome(pod, "t", node, "inf2.48xlarge", ("neurons",), devices, (), "", "")


def test_the_health_stage_faults_a_device_in_use_and_the_first_free_one() -> None:
    inf2 = "inf2-48xlarge-1"
    outcomes = [_outcome("whole-node", "trn2-48xlarge-1", tuple(range(16))),
                _outcome("ring-a", inf2, (4, 5, 6, 7)), _outcome("ring-b", inf2, (0, 1, 2, 3)),
                _outcome("core-a", inf2, (8,)), _outcome("core-b", inf2, (8,))]
    assert plan_faults(outcomes, inf2, 12) == FaultPlan(inf2, "ring-a", 4, 9)
    # a full node, or a node without pods, has nothing to show
    assert plan_faults([_outcome("all", inf2, tuple(range(12)))], inf2, 12) is None
    assert plan_faults(outcomes, "inf2-48xlarge-2", 12) is None
    # device taints and health in pod status are on by default from 1.36 only
    assert [runs_health_stage(m) for m in ("1.34", "1.35", "1.36", "1.37")] == [False, False, True, True]


def test_every_workload_fits_a_demo_node_and_the_stages_fill_the_trn2_nodes() -> None:
    for w in workloads():
        assert check(w.template, demo_instance_types()).ok, w.pod
    # First the UltraServer job: one pod per trn2u node, each taking all 16 devices and EFAs, so nothing else can
    # land on the UltraServer and the rest of the demo runs on the other nodes as without it.
    assert DEMO_STAGES[0] is ULTRASERVER_STAGE and demo_jobs(DEMO_STAGES) == [ULTRASERVER_JOB]
    assert [w.job for w in ULTRASERVER_STAGE.workloads] == [ULTRASERVER_JOB] * 4 and ULTRASERVER_JOB.nodes == 4
    fit = check(ULTRASERVER_STAGE.workloads[0].template, ["trn2u.48xlarge"]).fit("trn2u.48xlarge")
    assert fit.claims_per_node == 1
    assert sum(1 for d in fit.devices if d.device.startswith("neuron-device-")) == 16
    assert sum(1 for d in fit.devices if d.device.startswith("efa-")) == 16
    # Without an UltraServer (`--node` flags of plain types) the job's stage is left out.
    assert ULTRASERVER_STAGE not in demo_stages("1.36", demo_instance_types(DEMO_NODES))
    assert [n.ultraserver_node for n in parse_nodes(list(DEMO_NODE_ARGS)) if n.ultraserver] == [0, 1, 2, 3]
    types = demo_instance_types(DEMO_NODES)
    used: dict[str, int] = {}
    for w in (w for stage in DEMO_STAGES[1:] for w in stage.workloads):
        report = check(w.template, types)
        assert report.ok, report.summary()
        fitting = [f for f in report.fits if f.claims_per_node]
        assert fitting, w.pod
        if all(f.instance_type == "trn2.48xlarge" for f in fitting):
            used["trn2"] = used.get("trn2", 0) + len(fitting[0].devices) - sum(
                1 for d in fitting[0].devices if d.device.startswith("efa-"))
    # before the firstAvailable stage, the trn2-only workloads take both trn2 nodes exactly
    assert used["trn2"] == 32
    assert DEMO_STAGES[-2].workloads[0].template.name == "trn2-8-else-trn1-16"
    # Last, on 1.36+ only: two one-core pods share an inf2 device the ring segments leave free.
    assert DEMO_STAGES[-1] is CORE_STAGE and [w.template.name for w in CORE_STAGE.workloads] == ["inf2-one-core"] * 2
    assert CORE_STAGE in demo_stages("1.36") and CORE_STAGE not in demo_stages("1.35")


@pytest.mark.process
def test_cli_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run([*DEMO_FAKE, "--timeout", "0", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--timeout must be positive, got 0.0" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_binaries_cached_means_every_binary_is_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_dra.localcluster import build
    from neuron_dra.localcluster.demo.run import binaries_cached

    monkeypatch.setenv("NEURON_DRA_CACHE", str(tmp_path))
    minor = build.DEFAULT_MINOR
    assert not binaries_cached(minor)
    paths = [tmp_path / "k8s" / build.kube_version(minor) / n for n in build.KUBE_BINARIES]
    paths += [tmp_path / "etcd" / build.etcd_version() / n for n in build.ETCD_BINARIES]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    assert binaries_cached(minor)
    assert not binaries_cached("1.34") or (build.cache_root() / "k8s" / build.kube_version("1.34")).exists()
    paths[-1].chmod(0o644)
    assert not binaries_cached(minor)
    paths[-1].chmod(0o755)
    (tmp_path / "k8s" / build.kube_version(minor) / "kubelet").chmod(0o644)  # the kubelet counts too
    assert not binaries_cached(minor)


@pytest.mark.process
def test_a_supervisor_interrupted_before_its_pid_file_is_stopped(tmp_path: Path) -> None:
    from neuron_dra.localcluster.demo.run import stop_early_supervisors, supervisor_children

    # a child whose command line looks like a supervisor of tmp_path that never writes its pid file
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                              "neuron_dra.localcluster.supervisor", str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        while child.pid not in supervisor_children(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert supervisor_children(tmp_path) == [child.pid]
        assert supervisor_children(tmp_path / "other") == []
        stop_early_supervisors(tmp_path, wait_s=0.5)
        assert not Path(f"/proc/{child.pid}").exists()  # terminated and reaped
    finally:
        if child.poll() is None:
            child.kill()


# --- end to end -----------------------------------------------------------------------------------------------

def _processes_mentioning(path: Path) -> list[str]:
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in argv:
            command = argv.replace(b"\0", b" ").decode(errors="replace")[:160]
            found.append(f"{entry.name}: {command}")
    return found


def _table_rows(output: str) -> dict[str, list[str]]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("POD "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


def _assert_nothing_left(cluster_dir: Path) -> None:
    assert not (cluster_dir / "supervisor.pid").exists()
    assert not runtime_dir(cluster_dir).exists(), "the socket directory is removed"
    deadline = time.monotonic() + 10
    while _processes_mentioning(cluster_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_mentioning(cluster_dir), _processes_mentioning(cluster_dir)


def _efas_of_group(neuron_range: str, tmp_path: Path) -> str:
    """The EFA devices (numbers, as the table shows them) of the devicegroup of trn2 devices `neuron_range`, from
    the model the driver and the emulated EFA driver publish: EFA names follow BDF order, not Neuron device order
    (docs/neuron-hardware.md §4), so rows 4-7 and 8-11 swap their EFAs."""
    group = "resource.aws.com/devicegroup4_id"
    host = discover(emulate("trn2.48xlarge", tmp_path / "trn2-host"))
    first = int(neuron_range.split("-")[0])
    neuron = {d["name"]: d["attributes"][group]["string"] for sl in resource_slices(build_pool(host, NodeFacts("n")))
              for d in sl["spec"].get("devices") or () if group in d.get("attributes", {})}
    wanted = neuron[f"neuron-device-{first}"]
    return core_ranges(sorted(int(d["name"].rsplit("-", 1)[1]) for d in efa_devices(host)
                              if d["attributes"][group]["string"] == wanted))


@pytest.mark.cluster
@pytest.mark.process
def test_demo_end_to_end(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "demo"
    started = time.monotonic()
    proc = subprocess.run([*DEMO_FAKE, "--dir", str(cluster_dir)],
                          capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    rows = _table_rows(out)
    assert set(rows) == {w.pod for w in workloads()}
    assert all(r[-1] == "yes" for r in rows.values()), out
    node, devices, cores = rows["whole-node"][2], rows["whole-node"][4], rows["whole-node"][6]
    assert node.startswith("trn2-48xlarge-") and devices == "0-15" and cores == "0-63"
    other = {"trn2-48xlarge-1": "trn2-48xlarge-2", "trn2-48xlarge-2": "trn2-48xlarge-1"}[node]
    for pod in ("connected-8", "row-lnc1", "efa-aligned"):
        assert rows[pod][2] == other, rows[pod]
    assert rows["row-lnc1"][7] == "1"  # LNC column
    assert rows["efa-aligned"][5] == _efas_of_group(rows["efa-aligned"][4], tmp_path)  # the same devicegroup
    assert {rows["connected-8"][4], rows["row-lnc1"][4], rows["efa-aligned"][4]} in (
        {"0-7", "8-11", "12-15"}, {"0-7", "12-15", "8-11"}, {"8-15", "0-3", "4-7"})
    assert rows["first-available"][2:5] == ["trn1-32xlarge-1", "neurons/trn1", "0-15"]
    assert {rows["ring-a"][4], rows["ring-b"][4]} <= {"0-3", "4-7", "8-11"} and rows["ring-a"][4] != rows["ring-b"][4]
    assert rows["ring-a"][2] == "inf2-48xlarge-1"
    # the core-sharing stage: one inf2 device, two pods, disjoint NeuronCores
    assert rows["core-a"][2] == rows["core-b"][2] == "inf2-48xlarge-1"
    assert rows["core-a"][4] == rows["core-b"][4] and rows["core-a"][6] != rows["core-b"][6]
    # the UltraServer job: one pod on each node of the UltraServer, all 16 devices each, one group device shared
    ultra = [rows[f"ultra-{i}"] for i in range(4)]
    trn2u = [f"trn2u-48xlarge-{k}" for k in (1, 2, 3, 4)]
    assert sorted(r[2] for r in ultra) == trn2u and {r[4] for r in ultra} == {"0-15"} == {r[5] for r in ultra}
    groups = {r[8].rsplit(" node ", 1)[0] for r in ultra}
    assert len(groups) == 1 and next(iter(groups)).startswith("ultraserver-4/"), ultra
    assert sorted(r[8].rsplit(" node ", 1)[1] for r in ultra) == ["0", "1", "2", "3"]
    assert {r[8] for r in rows.values() if not r[0].startswith("ultra-")} == {"-"}
    (group,) = groups
    assert f"UltraServer job ultra: 4 pods share the claim of one group device ({group}: {', '.join(trn2u)})" in out
    assert out.count("(trn2u.48xlarge, torus4x4) UltraServer trn2u.48xlarge/ultraserver-1 node ") == 4
    # the terminal pictures: one per node, whole-node's letter on all 16 devices of its node
    assert out.count("(trn2.48xlarge, torus4x4)") == 2 and "(inf2.48xlarge, ring)" in out
    letter = re.search(r"\b(\w)=whole-node\b", out)
    assert letter is not None and len(re.findall(rf"\[\s?\d+{letter[1]}\]", out)) == 16
    svg = cluster_dir / "topology.svg"
    assert f"topology picture: {svg}" in out
    titles = [t.text or "" for t in ET.fromstring(svg.read_text()).iter(f"{SVG_NS}title")]
    assert sum(1 for t in titles if t.endswith("→ whole-node")) == 16
    assert sum(1 for t in titles if t.endswith("→ ultra-0")) == 16
    assert f"UltraServer trn2u.48xlarge/ultraserver-1 (4 nodes): one job on group device {group}" in titles
    # inf2: 12 devices, two ring segments of 4, and one device whose cores core-a and core-b share (1.36+)
    assert sum(1 for t in titles if t.endswith("(free)")) == 3
    # the device-health stage: a fault on one of ring-a's devices and on the first free inf2 device
    health = re.search(r"device health: mem_ecc_uncorrected \+1 on inf2-48xlarge-1 neuron-device-(\d+) \(used by "
                       r"ring-a\) and neuron-device-(\d+) \(free\)", out)
    assert health is not None, out
    in_use, free = int(health[1]), int(health[2])
    assert in_use == int(rows["ring-a"][4].split("-")[0]), out  # ring-a's first device
    assert "taint neuron.aws.com/unhealthy=mem_ecc_uncorrected:NoSchedule on both devices after" in out
    assert f"ring-a's status shows neuron-device-{in_use} Unhealthy after" in out
    spare = re.search(rf"spare +-> inf2-48xlarge-1 .*: got neuron-device-(\d+), not the faulted neuron-device-{free}",
                      out)
    assert spare is not None and int(spare[1]) not in (in_use, free), out
    assert f"taints removed and neuron-device-{in_use} Healthy again after" in out
    assert "a device fault was tainted in" in out
    _assert_nothing_left(cluster_dir)
    print(f"demo wall time {seconds:.1f} s")  # shown with -s; the figure the report quotes


@pytest.mark.cluster
@pytest.mark.process
def test_demo_stops_the_cluster_on_sigterm(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "demo"
    proc = subprocess.Popen([*DEMO_FAKE, "--dir", str(cluster_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "control plane ready" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(seen) + rest + err
    assert "interrupted; the local cluster was stopped" in err
    assert "local cluster stopped" in rest
    _assert_nothing_left(cluster_dir)


@pytest.mark.cluster
@pytest.mark.process
def test_demo_keep_leaves_a_working_cluster_and_prints_how_to_stop_it(tmp_path: Path) -> None:
    from kubernetes import client, config

    cluster_dir = tmp_path / "demo"
    try:
        proc = subprocess.run([*DEMO_FAKE, "--dir", str(cluster_dir), "--keep"],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        kubeconfig = cluster_dir / "kubeconfig"
        down_cmd = f"neuron-dra cluster down --dir {cluster_dir}"
        assert f"export KUBECONFIG={kubeconfig}" in proc.stdout and down_cmd in proc.stdout
        api = config.new_client_from_config(str(kubeconfig))
        resp: Any = client.CoreV1Api(api).list_namespaced_pod(DEMO_NAMESPACE, _preload_content=False)
        api.close()
        pods = json.loads(resp.data)["items"]
        assert sorted(p["metadata"]["name"] for p in pods) == sorted(w.pod for w in workloads())
        assert {p["status"]["phase"] for p in pods} == {"Running"}
        again = subprocess.run([*DEMO_FAKE, "--dir", str(cluster_dir)],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and f"a local cluster is already running in {cluster_dir}" in again.stderr
        stop = subprocess.run([sys.executable, "-m", "neuron_dra", *down_cmd.split()[1:]], capture_output=True,
                              text=True, timeout=120)
        assert stop.returncode == 0 and "stopped" in stop.stdout
    finally:
        subprocess.run([sys.executable, "-m", "neuron_dra", "cluster", "down", "--dir", str(cluster_dir)],
                       capture_output=True, timeout=120)
    _assert_nothing_left(cluster_dir)


@pytest.mark.cluster
def test_a_failing_demo_explains_why_and_stops_the_cluster(tmp_path: Path) -> None:
    """With one trn2 node the whole-node pod takes it, so the 8-connected pod cannot be scheduled."""
    import io

    from neuron_dra.localcluster.demo.run import DemoError, DemoOptions, run_demo

    cluster_dir = tmp_path / "demo"
    out = io.StringIO()
    options = DemoOptions(dir=cluster_dir, timeout=15, runtime="fake", node_args=("trn2.48xlarge:1", "trn1.32xlarge:1",
                                                                   "inf2.48xlarge:1"))
    with pytest.raises(DemoError) as failed:
        run_demo(options, out)
    message = str(failed.value)
    assert "timed out after 15 s waiting for stage 2 (connected-8) to be scheduled" in message
    assert "connected-8 (Pending): PodScheduled=False Unschedulable" in message
    assert "local cluster stopped" in out.getvalue() and f"logs kept in {cluster_dir}" in out.getvalue()
    assert (cluster_dir / "supervisor.log").exists()
    _assert_nothing_left(cluster_dir)
