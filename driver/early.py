"""Both kubelet sockets bound first thing at start-up (driver/entry.py), before the daemon imports the rest of itself.

kubelet registers a plugin once its registration socket appears. The daemon's own imports (argparse, logging,
dataclasses, then the gRPC server) take 50-70 ms on an idle machine and more on a busy node, so the entry
(`neuron-dra-driver`, `python -m neuron_dra.driver`) binds the DRA socket, then the registration socket
(docs/kubelet-dra-protocol.md §1), with `os` and `socket` alone, from the three settings that name them, read
from argv and the environment the way `main.parse_options` reads them. `main` checks them against its full
parse and binds again where they differ (an abbreviated flag, say); anything unusual here (help, a relative
directory, an odd driver name, a bind error) skips the early bind, and the normal start binds and reports.
Only the standard library's cheapest modules are imported here: a test checks that.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

DEFAULT_DRIVER_NAME = "neuron.aws.com"  # also the DeviceClass name
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR_ENV = "KUBELET_PLUGINS_DIRECTORY_PATH"
REGISTRY_DIR_ENV = "KUBELET_REGISTRAR_DIRECTORY_PATH"
SOCKET_MODE = 0o600
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
BACKLOG = 64  # connections kubelet (and probes) may open before the server accepts them
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


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


class EarlySockets:
    """Both sockets, bound and listening; `main` adopts them (`taken`) or closes them."""

    __slots__ = ("dra", "dra_path", "registration", "registration_path", "taken")

    def __init__(self, dra_path: str, dra: socket.socket, registration_path: str, registration: socket.socket
                 ) -> None:
        self.dra_path, self.dra = dra_path, dra
        self.registration_path, self.registration = registration_path, registration
        self.taken = False

    def discard(self) -> None:
        """Close both and remove their files (the registration socket first: kubelet must not dial a dead one)."""
        for sock, path in ((self.registration, self.registration_path), (self.dra, self.dra_path)):
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)


def socket_paths(argv: list[str], env: dict[str, str] | os._Environ[str]) -> tuple[str, str] | None:
    """(DRA socket, registration socket) as `main.parse_options` would name them, or None when this quick scan
    cannot be sure enough to bind (help, version, a flag without its value, a relative directory, a driver name
    that is not plainly a lowercase DNS subdomain)."""
    values = {"--driver-name": DEFAULT_DRIVER_NAME,
              "--plugins-dir": env.get(PLUGINS_DIR_ENV) or DEFAULT_PLUGINS_DIR,
              "--registry-dir": env.get(REGISTRY_DIR_ENV) or DEFAULT_REGISTRY_DIR}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help", "--version"):
            return None
        name, eq, value = arg.partition("=")
        if name not in values and any(flag.startswith(name) for flag in values) and name.startswith("--"):
            return None  # an abbreviation argparse accepts: not guessed here (it could name another driver's socket)
        if name in values:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            values[name] = value
        i += 1
    driver, plugins, registry = values["--driver-name"], values["--plugins-dir"], values["--registry-dir"]
    if not (0 < len(driver) <= 63 and set(driver) <= _NAME_CHARS and driver[0].isalnum() and driver[-1].isalnum()
            and ".." not in driver and os.path.isabs(plugins) and os.path.isabs(registry)):
        return None
    paths = dra_socket_path(plugins, driver), registration_socket_path(registry, driver)
    if any(len(p.encode()) > MAX_UNIX_SOCKET_PATH for p in paths):
        return None
    return paths


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


def bind_early(argv: list[str], env: dict[str, str] | os._Environ[str]) -> EarlySockets | None:
    """Both sockets bound, DRA first; None (nothing left bound) when the settings are unclear or binding fails."""
    paths = socket_paths(argv, env)
    if paths is None:
        return None
    dra_path, registration_path = paths
    dra: socket.socket | None = None
    try:
        os.makedirs(os.path.dirname(dra_path), exist_ok=True)
        remove_stale(dra_path)
        dra = listening_socket(dra_path)
        os.makedirs(os.path.dirname(registration_path), exist_ok=True)
        remove_stale(registration_path)
        return EarlySockets(dra_path, dra, registration_path, listening_socket(registration_path))
    except OSError:
        if dra is not None:
            dra.close()
            with contextlib.suppress(OSError):
                os.unlink(dra_path)
        return None
