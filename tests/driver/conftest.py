"""Fixtures of the driver tests: short socket directories and an emulated trn2 host for the daemon, and the control
plane for the tests against a real API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_dra.driver.model.emulate import emulate
from tests.support.driver import DaemonDirs, short_dir
from tests.support.plane import api, plane  # noqa: F401  (fixtures)


@pytest.fixture
def dirs() -> Iterator[DaemonDirs]:
    with short_dir() as base:
        yield DaemonDirs(base)


@pytest.fixture
def host_root(dirs: DaemonDirs) -> Path:
    return emulate("trn2.48xlarge", dirs.base / "host")
