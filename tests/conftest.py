"""Shared fixtures: emulated host trees are the fixtures of every part.

Nothing here imports `kubernetes` or `localcluster`: a unit test needs only the package itself. The cluster
fixtures live with the suites that use them (tests/support/plane.py, tests/e2e/conftest.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_dra.driver.model.emulate import EmulationOptions, emulate

# Fixtures that start a control plane: a test using one (directly or through another fixture) is a `cluster` test
# even if its module forgot the marker, so `make test-fast` never waits for a control plane.
CLUSTER_FIXTURES = frozenset({"plane", "api", "local_cluster", "kube", "ns"})


# A test that starts the daemon (through the `dirs` fixture) or runs a program (its own code names one of these) is
# a `process` test: `make test-unit` leaves those out, `make test-fast` runs them.
PROCESS_FIXTURES = frozenset({"dirs"})
PROCESS_WORDS = ("subprocess.", "sys.executable", "DaemonProcess", "Popen")


@functools.cache
def _starts_processes(function: Callable[..., object]) -> bool:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return any(w in source for w in PROCESS_WORDS)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.cluster)
        function = getattr(item, "function", None)
        if PROCESS_FIXTURES & fixtures or (function is not None and _starts_processes(function)):
            item.add_marker(pytest.mark.process)


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., Path]:
    """Write an emulated host tree of an instance type and return its root."""

    def make(instance_type: str, **options: object) -> Path:
        root = tmp_path / f"host-{instance_type}"
        return emulate(instance_type, root, EmulationOptions(**options))  # type: ignore[arg-type]

    return make
