"""The daemon's entry point (`neuron-dra-driver`, `python -m neuron_dra.driver`): the kubelet sockets are bound
(driver/early.py) before `main` and everything it imports are loaded, so kubelet sees the driver in tens of
milliseconds, not after the imports."""

from __future__ import annotations

import os
import sys

from neuron_dra.driver.early import bind_early


def main() -> int:
    early = bind_early(sys.argv[1:], os.environ)
    try:
        from neuron_dra.driver.main import main as run

        return run(early=early)
    finally:
        if early is not None and not early.taken:  # main failed before adopting them
            early.discard()
