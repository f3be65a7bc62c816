"""The kubelet-facing unix sockets: paths, checks, stale files (standard library only).

plugin.py binds and serves them (grpcserver.Server.add_unix: mode 0600 from creation, never world-writable, not
even briefly). Order (docs/kubelet-dra-protocol.md §1): the DRA socket listens before the registration socket
appears. Stale socket files are removed before binding.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("neuron_dra.driver.daemon.sockets")

SOCKET_MODE = 0o600
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


def dra_socket_path(plugins_dir: str, driver_name: str) -> str:
    return os.path.join(plugins_dir, driver_name, "dra.sock")


def registration_socket_path(registry_dir: str, driver_name: str) -> str:
    return os.path.join(registry_dir, f"{driver_name}-reg.sock")


def remove_stale(path: str) -> bool:
    """Remove what a previous run left at `path` (True if something was there); IsADirectoryError for a directory."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(path)
    os.unlink(path)
    return True


class SocketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SocketPaths:
    dra: Path  # <plugins dir>/<driver>/dra.sock
    registration: Path  # <registry dir>/<driver>-reg.sock

    @classmethod
    def for_driver(cls, plugins_dir: Path, registry_dir: Path, driver_name: str) -> SocketPaths:
        return cls(Path(dra_socket_path(str(plugins_dir), driver_name)),
                   Path(registration_socket_path(str(registry_dir), driver_name)))


def check_socket_path(path: Path) -> None:
    if not path.is_absolute():
        raise SocketError(f"socket path {path} must be absolute (kubelet resolves it on the host)")
    if len(str(path).encode()) > MAX_UNIX_SOCKET_PATH:
        raise SocketError(f"socket path {path} is {len(str(path).encode())} bytes; unix sockets allow at most "
                          f"{MAX_UNIX_SOCKET_PATH}: use a shorter --plugins-dir/--registry-dir")


def remove_stale_socket(path: Path) -> None:
    try:
        removed = remove_stale(str(path))
    except IsADirectoryError:
        raise SocketError(f"{path} is a directory; cannot listen there") from None
    if removed:
        log.info("removed stale socket", extra={"path": str(path)})


def prepare_socket_path(path: Path) -> None:
    """Ready `path` for a listening socket: checked, its directory made, a stale file removed."""
    check_socket_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SocketError(f"cannot create {path.parent} for the socket {path.name}: {e}") from None
    remove_stale_socket(path)
