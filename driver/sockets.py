"""The kubelet-facing unix sockets: paths, checks, binding (standard library only).

The daemon's entry binds both sockets before it imports anything heavy (driver/main.py), so kubelet can find
the driver within tens of milliseconds of the start; plugin.py serves them. Order (docs/kubelet-dra-protocol.md
§1): the DRA socket listens before the registration socket appears. Stale socket files are removed before
binding; both sockets are mode 0600 (kubelet runs as root) and never world-writable, not even briefly.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.driver.early import MAX_UNIX_SOCKET_PATH as MAX_UNIX_SOCKET_PATH
from neuron_dra.driver.early import SOCKET_MODE as SOCKET_MODE
from neuron_dra.driver.early import dra_socket_path, listening_socket, registration_socket_path, remove_stale

log = logging.getLogger("neuron_dra.driver.sockets")



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
