"""Atomic file replacement: readers see the old file or the new one, never a torn write."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

TEMP_MARKER = ".tmp-"


def temp_name(path: str | Path) -> str:
    # A leading dot and no .json/.yaml suffix: CDI runtimes and kubelet ignore such files. A str, not a Path:
    # pathlib interns every path component, and a random name per write would grow the interned strings.
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}{TEMP_MARKER}{secrets.token_hex(4)}")


def is_temp_file(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


def fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o600, durable: bool = True,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Write `data` to a temp file in the same directory and rename it over `path` (a str spares the per-call
    path objects of a Path: the CDI spec of every prepare).

    `durable` fsyncs the file before and the directory after the rename, so the new content survives
    a power loss, not only a crash of this process. `before_rename` is a test hook (crash injection).
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def remove_temp_files(directory: Path, prefix: str = "") -> list[Path]:
    """Delete temp files left by writes interrupted by a crash (names from `temp_name`)."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        if is_temp_file(p.name) and p.name[1:].startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed
