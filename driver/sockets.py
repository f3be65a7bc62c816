"""The kubelet-facing unix sockets: paths, checks, binding (standard library only).

The daemon's entry binds both sockets before it imports anything heavy (driver/main.py), so kubelet can find
the driver within tens of milliseconds of the start; plugin.py serves them. Order (docs/kubelet-dra-protocol.md
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

log = logging.getLogger("neuron_dra.driver.sockets")

SOCKET_MODE = 0o600
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
BACKLOG = 64  # connections kubelet (and probes) may open before the server accepts them


class SocketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SocketPaths:
    dra: Path  # <plugins dir>/<driver>/dra.sock
    registration: Path  # <registry dir>/<driver>-reg.sock

    @classmethod
    def for_driver(cls, plugins_dir: Path, registry_dir: Path, driver_name: str) -> SocketPaths:
        return cls(plugins_dir / driver_name / "dra.sock", registry_dir / f"{driver_name}-reg.sock")


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
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise SocketError(f"{path} is a directory; cannot listen there")
    path.unlink()
    log.info("removed stale socket", extra={"path": str(path)})


def listen_unix(path: Path) -> socket.socket:
    """A listening unix socket at `path`, mode 0600."""
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bind under a restrictive umask so the socket is never world-writable, not even briefly.
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise SocketError(f"cannot listen on {path}: {e}") from None
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return sock


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
