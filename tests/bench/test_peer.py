"""bench/bench_peer.py's own parts that need no cluster: the autogroup priority it takes and gives back, the
p99 ratio per quarter of a run, the table's lines, and the image's entrypoint it starts the daemon with."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_peer.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peer", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peer"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# In a session of its own (setsid), so that the test never changes the priority of the session running pytest.
PRIORITY = f"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("bench_peer", {str(BENCH)!r})
b = sys.modules["bench_peer"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
own = b.autogroup_nice(os.getpid())
said = b.share_priority([os.getpid()])
during = b.autogroup_nice(os.getpid())
b.set_autogroup_nice(os.getpid(), own)
print(own, during, b.autogroup_nice(os.getpid()), said, sep="|")
"""


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists() or os.geteuid() != 0,
                    reason="needs autogroup scheduling and root (raising a priority)")
@pytest.mark.process
def test_a_raised_niceness_reaches_the_autogroup_and_is_given_back() -> None:
    out = subprocess.run(["setsid", "nice", "-n", "-5", sys.executable, "-c", PRIORITY], capture_output=True,
                         text=True, check=True, timeout=120).stdout.strip().split("|")
    assert out == ["0", "-5", "0", "nice -5, autogroups of 1 sessions too"]


def test_without_a_raised_niceness_nothing_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    b = bench()
    monkeypatch.setattr(b.os, "nice", lambda _: 0)
    monkeypatch.setattr(b, "set_autogroup_nice", lambda *_: pytest.fail("wrote an autogroup"))
    assert b.share_priority([os.getpid()]) == "nice 0"


def test_quarter_ratios_and_the_table() -> None:
    b = bench()
    ours = [1.0] * 100 + [2.0] * 100 + [1.0] * 100 + [4.0] * 100
    assert b.quarter_ratios(ours, [1.0] * 400, 99) == [1.0, 2.0, 1.0, 4.0]
    result = {"kubernetes": "v1.36.5", "example": "v0.4.0", "cycles": 400, "daemon_python": "image",
              "state_filesystem": "ext4", "cdi_filesystem": "tmpfs", "priority": "nice -15", "load_average": [1.0, 2.0],
              "health_servers": False, "prepare_p99_ratio_by_quarter": {"1": [1.0, 2.0, 1.0, 4.0], "8": [1.0] * 4},
              "prepare_p50_ms_after_own_and_other": {"1 device": {"neuron-dra": [3.0, 3.5],
                                                                  "example (Go)": [3.1, 3.2]}},
              "figures": [{"name": "prepare p99, 1 device", "unit": "ms", "neuron_dra": 2.0, "example": 1.0,
                           "ratio": 2.0}]}
    text = b.table(result)
    assert "daemon as the image runs it, state on ext4, CDI specs on tmpfs\n" in text
    assert "nice -15; load average 1.0 before the drivers started, 2.0 after the last cycle" in text
    assert "| prepare p99, 1 device | 2.00 ms | 1.00 ms | 2.00 |" in text
    assert ("prepare p99 ratio in each quarter of the run: 1 device 1.00 2.00 1.00 4.00; "
            "8 devices 1.00 1.00 1.00 1.00\n") in text
    assert text.endswith("right after the same driver's call / after the other's: 1 device: neuron-dra 3.00 / 3.50, "
                         "example (Go) 3.10 / 3.20")


def test_the_schedule_gives_each_call_the_same_share_of_turns_after_the_other_driver() -> None:
    """A call right after the other driver's is slower (that process's threads and caches are cold); the old
    schedule (the list reversed every other cycle) gave those turns to two of the four calls only."""
    b = bench()
    schedule = b.fair_schedule([("ours", 1), ("ours", 8), ("go", 1), ("go", 8)])
    calls = [call for cycle in schedule * 3 for call in cycle]  # repeated: the turn from one round to the next too
    turns = {call: sum(1 for before, c in itertools.pairwise(calls) if c == call and before[0] != call[0])
             for call in set(calls)}
    assert set(turns.values()) == {3}, turns
    assert all(sorted(cycle) == sorted(schedule[0]) for cycle in schedule)  # every call once per cycle


def test_both_drivers_write_their_cdi_specs_in_the_directory_given(tmp_path: Path) -> None:
    """The CDI directory is the bench's (a tmpfs, as a node's /var/run/cdi), not the run directory on disk."""
    b = bench()
    cdi = tmp_path / "cdi-on-tmpfs"
    for spec in (b.ours_spec("python", {}, tmp_path), b.example_spec(tmp_path / "example")):
        argv = spec.command(tmp_path / "run", tmp_path / "kubeconfig", cdi)
        assert argv[argv.index("--cdi-root") + 1] == str(cdi), spec.label


def test_cdi_specs_go_to_dev_shm_only_when_it_is_a_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    b = bench()
    monkeypatch.setattr(b, "filesystem", lambda path: "tmpfs" if str(path) == "/dev/shm" else "ext4")
    assert b.default_cdi_dir() == "/dev/shm"
    monkeypatch.setattr(b, "filesystem", lambda path: "ext4")
    assert b.default_cdi_dir() == "/tmp"


@pytest.mark.process
def test_the_daemon_starts_by_the_image_s_entrypoint_script(tmp_path: Path) -> None:
    """The script the Dockerfile writes, read from it, starts the daemon's main (its --help here)."""
    b = bench()
    script = b.image_entrypoint(tmp_path)
    argv = b.ours_spec("python", {}, tmp_path, entrypoint=script).command(tmp_path, tmp_path, tmp_path)
    assert argv[:2] == ["python", str(script)]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parents[1])}
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                         check=True, timeout=60).stdout
    assert "--node-name" in out
