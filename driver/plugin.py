"""The kubelet-facing gRPC servers on unix sockets: the DRA service (v1 and v1beta1) and plugin registration.

Order (docs/kubelet-dra-protocol.md §1): the DRA socket listens before the registration socket appears, because kubelet
dials the endpoint as soon as it sees the registration socket; on shutdown the registration socket goes
first, so kubelet deregisters before the DRA service stops. Stale socket files are removed before
listening; both sockets are mode 0600 (kubelet runs as root).

Start-up is in two steps so kubelet sees the driver early (kubelet gives GetInfo 1 s): `listen` binds the DRA
socket (calls wait in its listen backlog) and then the registration socket, answered at once (it needs only the
driver name and the endpoint); `serve` starts the DRA service once the state is loaded (checkpoint, CDI specs).
Served with h2grpc (gRPC on h2; no grpcio in the daemon).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from neuron_dra.driver import h2grpc
from neuron_dra.driver._generated import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2
from neuron_dra.driver.claims import ClaimError, ClaimRef

if TYPE_CHECKING:
    from neuron_dra.driver.state import DriverState

log = logging.getLogger("neuron_dra.driver.plugin")

PLUGIN_TYPE = "DRAPlugin"
# Most recent first: kubelet picks the newest it supports.
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
SOCKET_MODE = 0o600
MAX_UNIX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
# Services as the protos declare them; h2grpc hands their handlers parsed messages (INVALID_ARGUMENT otherwise).
DRA_V1 = dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
DRA_V1BETA1 = dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
REGISTRATION = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
# Calls admitted at once per server beyond which gRPC answers RESOURCE_EXHAUSTED (kubelet retries), so a flood
# cannot queue without bound.
DRA_MAX_CONCURRENT = 32
REGISTRATION_MAX_CONCURRENT = 4


class SocketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SocketPaths:
    dra: Path  # <plugins dir>/<driver>/dra.sock
    registration: Path  # <registry dir>/<driver>-reg.sock

    @classmethod
    def for_driver(cls, plugins_dir: Path, registry_dir: Path, driver_name: str) -> SocketPaths:
        return cls(plugins_dir / driver_name / "dra.sock", registry_dir / f"{driver_name}-reg.sock")


def _claim_refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one API version (the messages module differs)."""

    def __init__(self, state: DriverState, messages: ModuleType) -> None:
        self._state = state
        self._pb = messages

    def NodePrepareResources(self, request: Any, context: h2grpc.CallContext) -> Any:
        # kubelet gives each call 45 s; when it gives up (deadline, cancel) the rest of the call's work is dropped.
        from neuron_dra.driver.state import CallScope

        remaining = context.time_remaining()
        call = CallScope(time.monotonic() + remaining if remaining is not None else None)
        if not context.add_callback(call.abandon):  # runs when the call ends, whatever the reason
            call.abandon()  # already over
        results = self._state.prepare(_claim_refs(request.claims), call)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]  # creates the entry: every claim gets one
            if isinstance(result, ClaimError):
                entry.error = result.message
                continue
            for d in result:
                entry.devices.append(self._pb.Device(request_names=list(d.request_names), pool_name=d.pool_name,
                                                     device_name=d.device_name,
                                                     cdi_device_ids=list(d.cdi_device_ids)))
        return response

    def NodeUnprepareResources(self, request: Any, context: h2grpc.CallContext) -> Any:
        results = self._state.unprepare(_claim_refs(request.claims))
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            entry = response.claims[uid]
            if error is not None:
                entry.error = error.message
        return response


class RegistrationService:
    """What kubelet's plugin watcher asks on the registration socket."""

    def __init__(self, driver_name: str, endpoint: Path, services: tuple[str, ...] = DRA_SERVICES) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.services = services
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: Any, context: h2grpc.CallContext) -> Any:
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver_name,
                                                 endpoint=str(self.endpoint),
                                                 supported_versions=list(self.services))

    def NotifyRegistrationStatus(self, request: Any, context: h2grpc.CallContext) -> Any:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("registered with kubelet", extra={"driver": self.driver_name})
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("kubelet rejected the registration", extra={"driver": self.driver_name, "error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


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


def _listen(path: Path) -> socket.socket:
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    # Bind under a restrictive umask so the socket is never world-writable, not even briefly.
    old = os.umask(0o177)
    try:
        sock = h2grpc.listening_socket(socket.AF_UNIX, str(path))
    except OSError as e:
        raise SocketError(f"cannot listen on {path}: {e}") from None
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return sock


def dra_services(state: DriverState) -> dict[str, h2grpc.Method]:
    """The DRA service in both versions."""
    methods = h2grpc.service_methods(DRA_V1, DraService(state, dra_v1_pb2))
    methods.update(h2grpc.service_methods(DRA_V1BETA1, DraService(state, dra_v1beta1_pb2)))
    return methods


class PluginServers:
    def __init__(self, paths: SocketPaths, driver_name: str, extra_services: tuple[str, ...] = (),
                 max_workers: int = 16, max_concurrent_rpcs: int = DRA_MAX_CONCURRENT) -> None:
        self.paths = paths
        # extra_services: served on the DRA socket too (the health stream), advertised after the DRA versions.
        self.registration = RegistrationService(driver_name, paths.dra, DRA_SERVICES + extra_services)
        self._dra = h2grpc.Server("dra", max_workers, max(max_concurrent_rpcs, max_workers))
        self._reg = h2grpc.Server("registration", 2, REGISTRATION_MAX_CONCURRENT, 64 * 1024)
        self._reg.add_service(REGISTRATION, self.registration)
        self._bound: list[Path] = []  # the socket files this instance created (removed on stop)

    def listen(self) -> None:
        """Bind the DRA socket (not served yet: calls wait), then the registration socket, served at once."""
        self._dra.add_socket(_listen(self.paths.dra))
        self._bound.append(self.paths.dra)
        self._reg.add_socket(_listen(self.paths.registration))
        self._bound.append(self.paths.registration)
        self._reg.start()
        log.info("registration socket listening", extra={"registration_socket": str(self.paths.registration)})

    def serve(self, state: DriverState, extra_methods: Mapping[str, h2grpc.Method] = {}) -> None:
        """Serve the DRA service (and `extra_methods`, e.g. the health stream) on the DRA socket."""
        if not self._bound:
            self.listen()
        self._dra.add_methods(dra_services(state))
        self._dra.add_methods(extra_methods)
        self._dra.start()
        log.info("serving", extra={"dra_socket": str(self.paths.dra),
                                   "registration_socket": str(self.paths.registration),
                                   "services": list(self.registration.services)})

    def start(self, state: DriverState, extra_methods: Mapping[str, h2grpc.Method] = {}) -> None:
        self.serve(state, extra_methods)

    def stop(self, grace: float = 5.0) -> None:
        for server, path in ((self._reg, self.paths.registration), (self._dra, self.paths.dra)):
            server.stop(grace)
            if path in self._bound:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self._bound = []
