"""Keeping the daemon's resident memory small and flat, well inside the DaemonSet's request.

glibc gives each allocating thread its own malloc arena and keeps freed memory there (gRPC's workers would each
grow one); one arena is plenty here (Python allocates under its GIL; bench/bench_prepare.py prints the RSS), and
trimming after start-up and now and then hands back what imports and bursts left. No-ops off glibc (musl).
"""

from __future__ import annotations

import ctypes
import functools
import gc

M_ARENA_MAX = -8  # mallopt parameter number in glibc's malloc.h
ARENAS = 1


@functools.cache  # one handle per process: a new CDLL per call would leak a little memory each time
def _libc() -> ctypes.CDLL | None:
    # The process's own symbols (dlopen(NULL)), the C library's among them: ctypes.util.find_library would run
    # `ldconfig -p` in a child process, on the start-up path before the sockets listen.
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Call before threads start allocating; True when applied."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim(collect: bool = True) -> bool:
    """Return free heap memory to the system (after a garbage collection unless `collect` is False, which
    makes it cheap enough to call after every health probe); True when memory was released."""
    if collect:
        gc.collect()
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)
