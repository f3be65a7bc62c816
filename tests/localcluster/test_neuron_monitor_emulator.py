"""The local cluster's stand-in for neuron-monitor's exporter (localcluster/nodes/neuron_monitor_emulator.py) and
`neuron-dra emulate-utilisation`: the documented names and labels, values from the node's emulated state, bad
state refused with the field named (by the command) or served as no series (by the exporter)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_dra.cli import main
from neuron_dra.cli.emulate_utilisation import parse_cores
from neuron_dra.localcluster.nodes import neuron_monitor_emulator as emu
from neuron_dra.localcluster.nodes.kubelet import PortAllocator
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec
from neuron_dra.localcluster.processes import procs
from tests.support.e2e import eventually

# As in neuron-monitor-prometheus.py's output (the exposition sample of OpenTelemetry's
# neuron_monitor_scraper_test.go), typed here: name -> its labels.
DOCUMENTED_LABELS = {
    "neuroncore_utilization_ratio": {"availability_zone", "instance_id", "instance_name", "instance_type",
                                     "neuroncore", "region", "runtime_tag", "subnet_id"},
    "neuron_runtime_memory_used_bytes": {"availability_zone", "instance_id", "instance_name", "instance_type",
                                         "memory_location", "region", "runtime_tag", "subnet_id"},
}


def scrape(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def series(host: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    return scrape(generate_latest(emu.registry_for(host, "trn2.48xlarge", "i-0abc")).decode())


def cli(*args: str | Path) -> int:
    return main(["emulate-utilisation", *map(str, args)])


def test_no_runtime_no_series(tmp_path: Path) -> None:
    assert series(tmp_path) == {}


def test_a_runtime_shows_on_its_cores_with_the_documented_labels(tmp_path: Path) -> None:
    assert cli(tmp_path, "--cores", "4-5,9", "--ratio", "0.25", "--device-memory", "3000", "--host-memory", "7",
               "--runtime-tag", "4242", "--latency", "0.01") == 0
    got = series(tmp_path)
    util = got["neuroncore_utilization_ratio"]
    for name, labels in DOCUMENTED_LABELS.items():
        assert all(set(lbl) == labels for lbl, _ in got[name]), name
    assert sorted((lbl["neuroncore"], v) for lbl, v in util) == [("4", 0.25), ("5", 0.25), ("9", 0.25)]
    assert {(lbl["runtime_tag"], lbl["instance_type"], lbl["instance_id"]) for lbl, _ in util} == {
        ("4242", "trn2.48xlarge", "i-0abc")}
    assert sorted(v for _, v in got["neuroncore_memory_usage_tensors"]) == [1000, 1000, 1000]
    assert {lbl["memory_location"]: v for lbl, v in got["neuron_runtime_memory_used_bytes"]} == {
        "host": 7, "neuron_device": 3000}
    assert {lbl["percentile"]: v for lbl, v in got["execution_latency_seconds"]}["p50"] == pytest.approx(0.01)

    assert cli(tmp_path, "--cores", "0", "--ratio", "1", "--runtime-tag", "7") == 0  # a second runtime
    assert {lbl["runtime_tag"] for lbl, _ in series(tmp_path)["neuroncore_utilization_ratio"]} == {"4242", "7"}
    assert cli(tmp_path, "--clear", "--runtime-tag", "4242") == 0
    assert [lbl["neuroncore"] for lbl, _ in series(tmp_path)["neuroncore_utilization_ratio"]] == ["0"]
    assert cli(tmp_path, "--clear", "--all") == 0
    assert series(tmp_path) == {}


@pytest.mark.parametrize(("args", "message"), [
    (("--cores", "3-1"), "ascending ranges"),
    (("--cores", "x"), "a NeuronCore id from 0 to 1023"),
    (("--cores", "0", "--ratio", "1.5"), "utilisation 1.5: not allowed; a number from 0 to 1"),
    (("--cores", "0", "--device-memory", "-1"), "deviceBytes -1"),
    ((), "--cores is required"),
])
def test_bad_values_are_refused_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            args: tuple[str, ...], message: str) -> None:
    assert cli(tmp_path, *args) == 2
    assert message in capsys.readouterr().err
    assert not emu.state_path(tmp_path).exists()  # nothing written


def test_a_broken_state_file_gives_no_series_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    path = emu.state_path(tmp_path)
    path.parent.mkdir(parents=True)
    for text in ("{not json", '{"runtimes": {"1": {"cores": {"0": 7}}}}', '{"runtimes": []}'):
        path.write_text(text)
        assert series(tmp_path) == {}
    assert "neuron-monitor stand-in" in capsys.readouterr().err


def test_core_ranges_read_as_the_runtime_writes_them() -> None:
    assert parse_cores("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_cores("5") == (5,)


def test_the_cluster_form_writes_the_nodes_host_tree(tmp_path: Path) -> None:
    host = NodePaths.of(tmp_path, "trn2-48xlarge-1").host_root
    host.mkdir(parents=True)
    assert main(["emulate-utilisation", str(tmp_path), "--node", "trn2-48xlarge-1", "--cores", "1"]) == 0
    assert [r.cores for r in emu.read_runtimes(host)] == [{1: 0.5}]
    assert main(["emulate-utilisation", str(tmp_path), "--node", "nope", "--cores", "1"]) == 2


@pytest.mark.process
def test_the_supervisors_process_serves_the_state_over_http(tmp_path: Path) -> None:
    paths = NodePaths.of(tmp_path, "trn2-48xlarge-1")
    paths.host_root.mkdir(parents=True)
    emu.set_runtime(paths.host_root, emu.Runtime("9", {2: 0.75}))
    port = PortAllocator().take()
    popen = emu.start(paths, NodeSpec("trn2-48xlarge-1", "trn2.48xlarge"), port, lifetime_s=120)
    try:
        def answer() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return str(r.read().decode())
            except OSError:
                return None if popen.poll() is None else f"exited {popen.returncode}"

        got = scrape(eventually(answer, 30, what="the stand-in's /metrics"))
        ((labels, value),) = got["neuroncore_utilization_ratio"]
        assert (labels["neuroncore"], labels["instance_id"], value) == (
            "2", emu.instance_id_for("trn2-48xlarge-1"), 0.75)
    finally:
        ref = procs.read_pid_file(paths.pids / "neuron-monitor.pid")
        assert ref is not None
        procs.stop(ref, 5, popen=popen)
