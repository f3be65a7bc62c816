"""Where the driver's host comes from: a host root on disk, or an emulated instance type."""

from __future__ import annotations

import tempfile
from pathlib import Path

from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import EmulationOptions, emulate


def emulated_host(instance_type: str, options: EmulationOptions | None = None,
                  catalog: Catalog = BUILTIN) -> NeuronHost:
    """Emulate `instance_type` in a temporary tree and discover it (the daemon's own code path)."""
    with tempfile.TemporaryDirectory(prefix="neuron-dra-host-") as tmp:
        return discover(emulate(instance_type, Path(tmp) / "root", options, catalog), catalog=catalog)


def load_host(host_root: Path | str | None, instance_type: str | None, catalog: Catalog = BUILTIN) -> NeuronHost:
    if (host_root is None) == (instance_type is None):
        raise ValueError("give exactly one of a host root (--host-root) or an instance type to emulate")
    if instance_type is not None:
        return emulated_host(instance_type, catalog=catalog)
    return discover(Path(host_root), catalog=catalog)  # type: ignore[arg-type]
