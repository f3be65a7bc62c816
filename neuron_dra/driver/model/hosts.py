"""Where the driver's host comes from: a host root on disk, or an emulated instance type."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import EmulationOptions, emulate

# Hosts kept by emulated_host: more than the built-in catalog's instance types times a few option sets.
EMULATED_HOSTS_KEPT = 64


def emulated_host(instance_type: str, options: EmulationOptions | None = None,
                  catalog: Catalog = BUILTIN) -> NeuronHost:
    """Emulate `instance_type` in a temporary tree and discover it (the daemon's own code path).

    The result is a frozen value fixed by its arguments, so it is kept (up to EMULATED_HOSTS_KEPT): writing the tree
    and running its neuron-ls is what makes a claim check or a node model slow, and they ask for a type many times.
    """
    return _emulated_host(instance_type, options or EmulationOptions(), catalog)


@functools.lru_cache(maxsize=EMULATED_HOSTS_KEPT)
def _emulated_host(instance_type: str, options: EmulationOptions, catalog: Catalog) -> NeuronHost:
    with tempfile.TemporaryDirectory(prefix="neuron-dra-host-") as tmp:
        return discover(emulate(instance_type, Path(tmp) / "root", options, catalog), catalog=catalog)


def load_host(host_root: Path | str | None, instance_type: str | None, catalog: Catalog = BUILTIN) -> NeuronHost:
    if (host_root is None) == (instance_type is None):
        raise ValueError("give exactly one of a host root (--host-root) or an instance type to emulate")
    if instance_type is not None:
        return emulated_host(instance_type, catalog=catalog)
    return discover(Path(host_root), catalog=catalog)  # type: ignore[arg-type]
