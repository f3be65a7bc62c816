"""The kubelet-facing unix sockets: paths, checks, binding (standard library only).

plugin.py serves them. Order (docs/kubelet-dra-protocol.md
§1): the DRA socket listens before the registration socket appears. Stale socket files are removed before
binding; both sockets are mode 0600 (kubelet runs as root) and never world-writable, not even briefly.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("neuron_dra.driver.daemon.sockets")

SOCKET_MODE = 0o600
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
BACKLOG = 64  # connections kubelet (and probes) may open before the server accepts them

def dra_socket_path(plugins_dir: str, driver_name: str) -> str:
    return os.path.join(plugins_dir, driver_name, "dra.sock")


def registration_socket_path(registry_dir: str, driver_name: str) -> str:
    return os.path.join(registry_dir, f"{driver_name}-reg.sock")


def listening_socket(path: str) -> socket.socket:
    """A unix socket listening at `path`, mode 0600: bound under a umask that keeps it from ever being
    world-writable, not even briefly."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return sock


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


@dataclass(frozen=True)
class BoundSockets:
    """Both sockets bound and listening (connections wait in the backlog until a server accepts them)."""

    dra: socket.socket
    registration: socket.socket

    def close(self) -> None:
        self.dra.close()
        self.registration.close()


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


def listen_unix(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600."""
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    try:
        return listening_socket(str(path))
    except OSError as e:
        raise SocketError(f"cannot listen on {path}: {e}") from None


def bind(paths: SocketPaths) -> BoundSockets:
    """The DRA socket, then the registration socket; on failure nothing stays bound."""
    dra = listen_unix(paths.dra)
    try:
        registration = listen_unix(paths.registration)
    except BaseException:
        dra.close()
        paths.dra.unlink(missing_ok=True)
        raise
    return BoundSockets(dra, registration)
