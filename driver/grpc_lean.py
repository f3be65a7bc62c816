"""Imported by the daemon's entry (main.py) before anything imports grpc: grpc imports its asyncio API
(`grpc.aio`) on every `import grpc`, which costs the daemon about 3 MiB of resident memory and a fifth of its
import time (bench/bench_peer.py), and the daemon serves with grpc's synchronous server only. An empty module
stands in for `grpc.aio` when grpc is not imported yet; in a process that imported grpc before, nothing changes.
"""

from __future__ import annotations

import sys
import types


def skip_grpc_aio() -> bool:
    """Put the placeholder in place; True when it is (grpc not imported yet)."""
    if "grpc" in sys.modules:
        return False
    sys.modules.setdefault("grpc.aio", types.ModuleType("grpc.aio", "placeholder: the daemon does not use grpc.aio"))
    return True


skip_grpc_aio()
