"""Where the local cluster's builds and installs are kept, the lock that makes one process build (or install) while
the others wait for it, and `Under`, the files of a state directory written as a table."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """Where built binaries are kept: `$NEURON_DRA_CACHE` or `~/.cache/neuron-dra`."""
    env = os.environ.get("NEURON_DRA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuron-dra"


class LockError(OSError):
    """A lock file that cannot be used safely; names it and why."""


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created with its directory); others block until it is released.
    The file is opened without following a link (root must not create or open what a planted link names) and must
    be a regular file owned by this user or root, with one name."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise LockError(e.errno, f"lock file {lock_path} cannot be opened ({e.strerror}; a symbolic link there is "
                                 "refused: remove it)") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_nlink != 1:
            raise LockError(f"lock file {lock_path} is not a regular file of this user or root with one name "
                            f"(mode {st.st_mode:o}, uid {st.st_uid}, {st.st_nlink} links): remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class Under:
    """A path below another path attribute of the same object: in a class with `base: Path`,
    `log = Under("base", "kubelet.log")` reads as `obj.base / "kubelet.log"`."""

    def __init__(self, parent: str, *parts: str) -> None:
        self.parent = parent
        self.parts = parts

    def __get__(self, obj: object, owner: type | None = None) -> Path:
        return Path(getattr(obj, self.parent)).joinpath(*self.parts)
