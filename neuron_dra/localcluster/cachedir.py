"""Where the local cluster's builds and installs are kept, the lock that makes one process build (or install) while
the others wait for it, and `Under`, the files of a state directory written as a table."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where built binaries are kept: `$NEURON_DRA_CACHE` or `~/.cache/neuron-dra`."""
    env = os.environ.get("NEURON_DRA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuron-dra"


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created with its directory); others block until it is released."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Under:
    """A path below another path attribute of the same object: in a class with `base: Path`,
    `log = Under("base", "kubelet.log")` reads as `obj.base / "kubelet.log"`."""

    def __init__(self, parent: str, *parts: str) -> None:
        self.parent = parent
        self.parts = parts

    def __get__(self, obj: object, owner: type | None = None) -> Path:
        return Path(getattr(obj, self.parent)).joinpath(*self.parts)
