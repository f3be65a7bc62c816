"""Shared fixtures: emulated host trees are the fixtures of every part.

Nothing here imports `kubernetes` or `localcluster`: a unit test needs only the package itself. The cluster
fixtures live with the suites that use them (tests/support/plane.py, tests/e2e/conftest.py).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_dra.driver.model.emulate import EmulationOptions, emulate

# Fixtures that start a control plane: a test using one (directly or through another fixture) is a `cluster` test
# even if its module forgot the marker, so `make test-fast` never waits for a control plane.
CLUSTER_FIXTURES = frozenset({"plane", "api", "local_cluster", "kube", "ns"})


# A test that starts the daemon (through the `dirs` fixture) or runs a program is a `process` test: `make test-unit`
# leaves those out, `make test-fast` runs them. A program is run where the test's code, a fixture of tests/ it uses or
# a helper of tests/ they call refers to one of PROCESS_NAMES (read from the compiled code: no source parsing).
PROCESS_FIXTURES = frozenset({"dirs"})
PROCESS_NAMES = frozenset({"subprocess", "Popen", "DaemonProcess", "executable"})  # executable: sys.executable


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names a function's code (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _ours(function: object) -> bool:
    return inspect.isfunction(function) and function.__module__.startswith("tests.")


@functools.cache
def _starts_processes(function: Callable[..., object]) -> bool:
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    names = _names(code)
    if PROCESS_NAMES & names:
        return True
    _starts_processes_visiting.add(function)
    try:
        scope = getattr(function, "__globals__", {})
        helpers = (scope.get(n) for n in names)
        return any(_starts_processes(h) for h in helpers if _ours(h) and h not in _starts_processes_visiting)
    finally:
        _starts_processes_visiting.discard(function)


_starts_processes_visiting: set[Callable[..., object]] = set()  # the call chain being looked at (recursion)


def _fixture_functions(item: pytest.Item) -> list[Callable[..., object]]:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return [d.func for fixture_defs in defs for d in fixture_defs if _ours(d.func)]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
        function = getattr(item, "function", None)
        functions = ([function] if function is not None else []) + _fixture_functions(item)
        if PROCESS_FIXTURES & fixtures or any(_starts_processes(f) for f in functions):
            item.add_marker(pytest.mark.process)


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., Path]:
    """Write an emulated host tree of an instance type and return its root."""

    def make(instance_type: str, **options: object) -> Path:
        root = tmp_path / f"host-{instance_type}"
        return emulate(instance_type, root, EmulationOptions(**options))  # type: ignore[arg-type]

    return make
