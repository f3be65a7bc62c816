"""The kubelet-facing unix sockets: paths, checks, stale files (standard library only).

plugin.py binds them (grpcserver.Server.add_unix: mode 0600 from creation), each under a hidden name renamed
into place (`binding_path`). During a surge rollout (docs/upgrades.md) each instance listens on names of its
own, `dra-<instance>.sock` and `<driver>-<instance>-reg.sock` as the Go helper's `RollingUpdate` names them,
`<instance>` being 16 digits of the pod UID (`short_instance_id`). An instance removes only what it bound itself
(the same inode), and another instance's socket only when nothing listens on it any more.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import logging
import os
import re
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
LEFTOVER_AGE = 30.0  # seconds: another instance's socket that refuses connections for this long is left over
# How another instance's names look when its leftovers may be removed: 16 hex digits of a pod UID (the apiserver
# makes them RFC 4122 UUIDs), never what could be another driver's plain name (`<driver>-efa-reg.sock`).
INSTANCE_ID = re.compile(r"[0-9a-f]{16}")


def short_instance_id(pod_uid: str) -> str:
    """The pod UID's first 16 letters and digits (dashes dropped; a UUID's are random): the Go helper puts the
    whole UID into the names, but a kubelet whose root is not where the container sees it (a relocated
    --root-dir, bind-mounted to the default path) dials longer paths than the container checks, and 20 bytes
    less keeps those under the unix socket limit (the local cluster's registration socket: 113 -> 93 bytes)."""
    return pod_uid.replace("-", "")[:16]


class SocketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SocketPaths:
    dra: Path  # <plugins dir>/<driver>/dra.sock, or dra-<instance>.sock
    registration: Path  # <registry dir>/<driver>-reg.sock, or <driver>-<instance>-reg.sock
    instance: str = ""  # "": the plain names

    @classmethod
    def for_driver(cls, plugins_dir: Path, registry_dir: Path, driver_name: str, instance: str = "") -> SocketPaths:
        name = short_instance_id(instance)
        return cls(plugins_dir / driver_name / (f"dra-{name}.sock" if name else "dra.sock"),
                   registry_dir / (f"{driver_name}-{name}-reg.sock" if name else f"{driver_name}-reg.sock"), name)

    def siblings(self) -> list[Path]:
        """The sockets other instances of this driver listen on (or left behind), found by name."""
        driver = self.registration.name.removesuffix("-reg.sock")
        if self.instance:
            driver = driver.removesuffix(f"-{self.instance}")
        found = []
        for directory, prefix, suffix in ((self.dra.parent, "dra-", ".sock"),
                                          (self.registration.parent, f"{driver}-", "-reg.sock")):
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob(f"{glob.escape(prefix)}*{suffix}")):
                middle = path.name[len(prefix):-len(suffix)]
                if INSTANCE_ID.fullmatch(middle) and path not in (self.dra, self.registration):
                    found.append(path)
        return found


def check_socket_path(path: Path) -> None:
    if not path.is_absolute():
        raise SocketError(f"socket path {path} must be absolute (kubelet resolves it on the host)")
    if len(str(path).encode()) > MAX_UNIX_SOCKET_PATH:
        raise SocketError(f"socket path {path} is {len(str(path).encode())} bytes; unix sockets allow at most "
                          f"{MAX_UNIX_SOCKET_PATH}: use a shorter --plugins-dir/--registry-dir")


def remove_stale_socket(path: Path) -> None:
    """Remove what a previous run of this process id left at `path`; SocketError for a directory."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise SocketError(f"{path} is a directory; cannot listen there")
        os.unlink(path)
    except FileNotFoundError:
        return
    log.info("removed stale socket", extra={"path": str(path)})


def binding_path(path: Path) -> Path:
    """Where the socket for `path` is bound before it is renamed into place: a name kubelet ignores (a leading
    dot), of this process. grpc removes the path it bound when the server stops, so binding at `path` itself
    would remove a newer instance's socket there; and the rename replaces a stale file with no moment without
    one."""
    return path.with_name(f".{hashlib.sha256(path.name.encode()).hexdigest()[:8]}-{os.getpid()}.tmp")


def prepare_socket_path(path: Path) -> Path:
    """Ready `path` for a listening socket: checked, its directory made; returns the path to bind (binding_path),
    a stale file of this process's id there removed."""
    check_socket_path(path)
    tmp = binding_path(path)
    check_socket_path(tmp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SocketError(f"cannot create {path.parent} for the socket {path.name}: {e}") from e
    if path.is_dir():
        raise SocketError(f"{path} is a directory; cannot listen there")
    remove_stale_socket(tmp)
    return tmp


def is_listening(path: Path) -> bool:
    """Does a process accept connections on the unix socket at `path`? (ECONNREFUSED: its listener is gone.)"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError as e:
            return e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
        return True


def remove_leftovers(paths: SocketPaths, now: float | None = None) -> list[Path]:
    """Remove the sockets of other instances of this driver that died without cleaning up (kill -9, power loss):
    socket files nobody has listened on for LEFTOVER_AGE seconds. A live instance is never touched: it accepts
    connections, and one that is just starting has a fresh file (bound a moment before it listens)."""
    now = time.time() if now is None else now
    removed = []
    for path in paths.siblings():
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or now - st.st_mtime < LEFTOVER_AGE or is_listening(path):
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
        log.info("removed the socket of an instance that is gone", extra={"path": str(path)})
    return removed


def bound_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, change time) of the socket file at `path`, to tell later whether it is still the one this
    process bound: a file system reuses a freed inode number at once, the change time tells the two apart."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def remove_own(path: Path, identity: tuple[int, int, int] | None) -> bool:
    """Remove `path` only if it is still the file this process bound: with the plain names (kubelet < 1.33) a
    newer instance may have replaced it, and deleting that one would deregister the instance that serves."""
    if identity is None or bound_identity(path) != identity:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
