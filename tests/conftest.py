"""Shared fixtures: emulated host trees are the fixtures of every part."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_dra.driver.emulate import EmulationOptions, emulate


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., Path]:
    """Write an emulated host tree of an instance type and return its root."""

    def make(instance_type: str, **options: object) -> Path:
        root = tmp_path / f"host-{instance_type}"
        return emulate(instance_type, root, EmulationOptions(**options))  # type: ignore[arg-type]

    return make
