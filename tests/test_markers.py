"""Markers are explicit (a module's `pytestmark`, a test's decorator) and checked: tests/conftest.py finds the tests
whose code paths call for `cluster` (a fixture that starts a control plane) or `process` (the test, a fixture or a
helper of tests/ it calls runs a program), and the check below fails naming each that lacks its marker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import COLLECTED, UNMARKED, _starts_processes, pytest_collection_modifyitems

TESTS = Path(__file__).resolve().parent


def _runs_a_program() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _calls_the_runner() -> None:
    _runs_a_program()


def _nested_call() -> None:
    def inner() -> None:
        _calls_the_runner()

    inner()


def _pure() -> int:
    return len(sys.argv)


def _ping() -> None:
    _pong()


def _pong() -> None:
    _ping()


# Reached through this table, not by name: a test naming a helper that runs a program would be a `process` test itself.
SAMPLES: dict[str, Callable[..., object]] = {
    f.__name__: f for f in (_runs_a_program, _calls_the_runner, _nested_call, _pure, _ping, _pong, print)}


def test_a_program_run_directly_or_through_helpers_is_seen() -> None:
    assert _starts_processes(SAMPLES["_runs_a_program"])
    assert _starts_processes(SAMPLES["_calls_the_runner"])
    assert _starts_processes(SAMPLES["_nested_call"])


def test_code_that_runs_no_program_is_not_marked() -> None:
    assert not _starts_processes(SAMPLES["_pure"])
    assert not _starts_processes(SAMPLES["_ping"]) and not _starts_processes(SAMPLES["_pong"])  # recursion ends
    assert not _starts_processes(SAMPLES["print"])  # a builtin: no code to read


class _Item:
    """What pytest_collection_modifyitems reads of a test item."""

    def __init__(self, *markers: str, fixtures: tuple[str, ...] = ("tmp_path", "module_cluster"),
                 function: Callable[..., object] | None = None) -> None:
        self.nodeid = f"tests/test_x.py::{function.__name__ if function else 'test'}"
        self.path = Path("tests/test_x.py")
        self.fixturenames = list(fixtures)
        self.function = function
        self.marks = [getattr(pytest.mark, m) for m in markers]

    def iter_markers(self) -> list[pytest.MarkDecorator]:
        return [m.mark for m in self.marks]


def _collect(*items: _Item) -> list[str]:
    config = pytest.Config.__new__(pytest.Config)  # only its stash is used
    config.stash = pytest.Stash()
    pytest_collection_modifyitems(config, list(items))  # type: ignore[arg-type]
    return config.stash[UNMARKED]


def test_host_fixtures_come_first_for_the_tests_that_need_the_host() -> None:
    """Fixtures are set up in `fixturenames` order: the host check precedes any module fixture starting a cluster."""
    containerd, cluster, gobuild, unit = _Item("containerd", "cluster"), _Item("cluster"), _Item("gobuild"), _Item()
    _collect(containerd, cluster, gobuild, unit)
    assert containerd.fixturenames == ["real_containers", "tmp_path", "module_cluster"]
    assert cluster.fixturenames[0] == gobuild.fixturenames[0] == "host_requirements"
    assert unit.fixturenames == ["tmp_path", "module_cluster"]  # the unit loop installs nothing


def test_a_test_without_the_marker_its_code_calls_for_is_named_and_not_marked() -> None:
    """A fabricated test that runs a program, one that starts the daemon and one that starts a control plane, each
    without its marker: named, with the reason; the collection adds no marker (what `-m` selects is the source's)."""
    runs = _Item(function=SAMPLES["_calls_the_runner"])
    daemon = _Item(fixtures=("dirs",))
    cluster = _Item(fixtures=("api", "tmp_path"))
    assert _collect(runs, daemon, cluster, _Item(function=SAMPLES["_pure"])) == [
        "tests/test_x.py::_calls_the_runner: not marked `process` but _calls_the_runner runs a program (or calls a "
        "helper of tests/ that does)",
        "tests/test_x.py::test: not marked `process` but it uses the fixture 'dirs', which starts the daemon",
        "tests/test_x.py::test: not marked `cluster` but it uses the fixture 'api', which starts a control plane"]
    assert [m.name for item in (runs, daemon, cluster) for m in item.iter_markers()] == []
    marked = [_Item("process", function=SAMPLES["_runs_a_program"]), _Item("process", fixtures=("dirs",)),
              _Item("cluster", fixtures=("plane",))]
    assert _collect(*marked) == []


class _Recorder:
    """Reads the check's findings from a collection run inside this one."""

    unmarked: list[str] | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.unmarked = session.config.stash[UNMARKED]  # the conftest's hook ran: it always sets both keys


def test_every_test_carries_the_markers_its_code_calls_for(request: pytest.FixtureRequest) -> None:
    """Over every test file: those this run collected were checked as they were; the others are collected here (in
    this process, no test runs) and checked the same way."""
    unmarked, collected = [*request.config.stash[UNMARKED]], request.config.stash[COLLECTED]
    rest = sorted(p for p in TESTS.rglob("test_*.py") if p not in collected)
    if rest:
        recorder = _Recorder()
        code = pytest.main([*map(str, rest), "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
                           plugins=[recorder])
        assert code == pytest.ExitCode.OK and recorder.unmarked is not None, f"collecting {len(rest)} files: {code}"
        unmarked += recorder.unmarked
    assert not unmarked, "tests whose markers lack what their code calls for (add `pytestmark = pytest.mark.X` " \
        "to the module or `@pytest.mark.X` to the test):\n" + "\n".join(unmarked)
