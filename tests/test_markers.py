"""tests/conftest.py marks a test `process` when it, a fixture or a helper of tests/ it calls runs a program."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import _starts_processes, pytest_collection_modifyitems


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

    def __init__(self, *markers: str) -> None:
        self.fixturenames = ["tmp_path", "module_cluster"]
        self.marks = [getattr(pytest.mark, m) for m in markers]

    def iter_markers(self) -> list[pytest.MarkDecorator]:
        return [m.mark for m in self.marks]

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.marks.append(marker)


def test_host_fixtures_come_first_for_the_tests_that_need_the_host() -> None:
    """Fixtures are set up in `fixturenames` order: the host check precedes any module fixture starting a cluster."""
    containerd, cluster, gobuild, unit = _Item("containerd", "cluster"), _Item("cluster"), _Item("gobuild"), _Item()
    pytest_collection_modifyitems([containerd, cluster, gobuild, unit])  # type: ignore[list-item]
    assert containerd.fixturenames == ["real_containers", "tmp_path", "module_cluster"]
    assert cluster.fixturenames[0] == gobuild.fixturenames[0] == "host_requirements"
    assert unit.fixturenames == ["tmp_path", "module_cluster"]  # the unit loop installs nothing
