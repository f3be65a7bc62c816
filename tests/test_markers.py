"""tests/conftest.py marks a test `process` when it, a fixture or a helper of tests/ it calls runs a program."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.conftest import _starts_processes


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
