"""The kubelet-facing gRPC servers on unix sockets: the DRA service (v1 and v1beta1) and plugin registration.

Order (docs/kubelet-dra-protocol.md §1): the DRA socket listens before the registration socket appears (kubelet
dials the endpoint once it sees it); on shutdown the registration socket goes first, so kubelet deregisters
before the DRA service stops. Both are mode 0600, bound under a hidden name and renamed over a stale file;
during a surge rollout each instance has sockets of its own (sockets.py, docs/upgrades.md).

Start-up is in two steps so kubelet sees the driver early (it gives GetInfo 1 s): `listen` binds both sockets
and answers registration at once; `serve` starts the DRA service once the state is loaded (calls wait till then).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin import _memory as memory
from neuron_dra.driver.kubeletplugin import _sockets as sockets
from neuron_dra.driver.kubeletplugin._calls import Calls
from neuron_dra.driver.kubeletplugin._claimref import CallScope, ClaimFailed, ClaimRef
from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2
from neuron_dra.driver.kubeletplugin._sockets import SocketError, SocketPaths

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Most recent first: kubelet picks the newest it supports.
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# Services as the protos declare them; grpcserver hands their handlers parsed messages (INVALID_ARGUMENT otherwise).
DRA_V1 = dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
DRA_V1BETA1 = dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
REGISTRATION = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
# Calls running at once per server beyond which gRPC answers RESOURCE_EXHAUSTED (kubelet retries), so a flood
# cannot queue without bound. Only root can connect (mode 0600); the registration calls run in its event loop.
DRA_LIMITS = grpcserver.Limits(max_concurrent=32)
REGISTRATION_LIMITS = grpcserver.Limits(max_concurrent=1, max_message=64 * 1024, max_streams=8,
                                        max_connections=16)


# Claims in one prepare or unprepare call (kubelet sends a pod's claims of this driver in one call; docs/hardening.md
# §1): each claim prepared here holds at least one device of this node (a node publishes a few hundred at most), and
# at the default API rate (5/s, bursts of 10) a call of more than ~235 claims cannot finish within kubelet's 45 s
# anyway. Beyond it the call is refused as a whole, before any claim is looked up.
MAX_CLAIMS_PER_CALL = 1024
# A call with more claims than this hands the heap's free memory back when it ends (memory.trim).
TRIM_AFTER_CLAIMS = 64


def _check_claims(method: str, request: Any, context: grpcserver.CallContext) -> None:
    """Refuse a call over MAX_CLAIMS_PER_CALL; have a large one trim the heap once it is over."""
    n = len(request.claims)
    if n > TRIM_AFTER_CLAIMS and not context.add_callback(memory.trim):
        memory.trim()
    if n > MAX_CLAIMS_PER_CALL:
        context.abort(grpcserver.StatusCode.INVALID_ARGUMENT,
                      f"{method} with {n} claims: at most {MAX_CLAIMS_PER_CALL} claims per call are allowed "
                      "(MAX_CLAIMS_PER_CALL); a pod's claims of one driver come in one call")


def _no_claims(request: Any) -> bool:
    # An empty prepare (the liveness check's) needs no work: answered in the event loop, never behind DRA calls.
    return not request.claims


def _claim_refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


def _call_scope(context: grpcserver.CallContext) -> CallScope:
    """The call as it arrives (its ticket), its deadline, and `abandon` run when it ends, whatever the reason."""
    remaining = context.time_remaining()
    call = CallScope(time.monotonic() + remaining if remaining is not None else None, ends=True)
    if not context.add_callback(call.abandon):
        call.abandon()  # already over
    return call


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one API version (the messages module differs)."""

    def __init__(self, calls: Calls, messages: ModuleType) -> None:
        self._calls = calls
        self._pb = messages

    def NodePrepareResources(self, request: Any, context: grpcserver.CallContext) -> Any:
        # kubelet gives each call 45 s; when it gives up (deadline, cancel) the rest of the call's work is dropped.
        _check_claims("NodePrepareResources", request, context)
        call = _call_scope(context)
        results = self._calls.prepare(_claim_refs(request.claims), call)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]  # creates the entry: every claim gets one
            if isinstance(result, ClaimFailed):
                entry.error = result.message
                continue
            add = entry.devices.add  # in place: a Device built first would be copied in
            for d in result:
                add(request_names=d.request_names, pool_name=d.pool_name, device_name=d.device_name,
                    cdi_device_ids=d.cdi_device_ids)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpcserver.CallContext) -> Any:
        _check_claims("NodeUnprepareResources", request, context)
        call = _call_scope(context)
        results = self._calls.unprepare(_claim_refs(request.claims), call)
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

    def GetInfo(self, request: Any, context: grpcserver.CallContext) -> Any:
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver_name,
                                                 endpoint=str(self.endpoint),
                                                 supported_versions=list(self.services))

    def NotifyRegistrationStatus(self, request: Any, context: grpcserver.CallContext) -> Any:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("registered with kubelet", extra={"driver": self.driver_name})
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("kubelet rejected the registration", extra={"driver": self.driver_name, "error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


def _listen(server: grpcserver.Server | grpcserver.ThreadedServer, path: Path) -> None:
    """Bind at the hidden name, then rename into place (sockets.binding_path); one name, so tests can watch the
    order of the binds."""
    tmp = sockets.prepare_socket_path(path)
    server.add_unix(tmp)
    os.replace(tmp, path)


def dra_services(calls: Calls) -> dict[str, grpcserver.Method]:
    """The DRA service in both versions."""
    inline = {"NodePrepareResources": _no_claims, "NodeUnprepareResources": _no_claims}
    methods = grpcserver.service_methods(DRA_V1, DraService(calls, dra_v1_pb2), inline)
    methods.update(grpcserver.service_methods(DRA_V1BETA1, DraService(calls, dra_v1beta1_pb2), inline))
    return methods


class PluginServers:
    def __init__(self, paths: SocketPaths, driver_name: str, extra_services: tuple[str, ...] = (),
                 limits: grpcserver.Limits = DRA_LIMITS, loop: grpcserver.EventLoopThread | None = None) -> None:
        """`loop`: the event loop both servers run in (the daemon's); without one each server has its own."""
        self.paths = paths
        # extra_services: served on the DRA socket too (the health stream), advertised after the DRA versions.
        self.registration = RegistrationService(driver_name, paths.dra, DRA_SERVICES + extra_services)
        # The DRA socket on grpcio's sync server: one thread hand-off per prepare and unprepare, not three
        # (docs/grpc-server.md "Why the asyncio server, and the sync one for the DRA socket").
        self._dra = grpcserver.ThreadedServer("dra", limits)
        self._reg = grpcserver.Server("registration", REGISTRATION_LIMITS, loop)
        always = {m.name: (lambda _: True) for m in REGISTRATION.methods}
        self._reg.add_methods(grpcserver.service_methods(REGISTRATION, self.registration, always))
        # The socket files this instance bound, with their inodes: removed on stop only while still its own.
        self._bound: dict[Path, tuple[int, int, int] | None] = {}

    def listen(self) -> None:
        """Bind the DRA socket (not served yet: calls wait), then the registration socket, served at once."""
        for server, path in ((self._dra, self.paths.dra), (self._reg, self.paths.registration)):
            try:
                _listen(server, path)
            except OSError as e:
                raise SocketError(str(e)) from e
            self._bound[path] = sockets.bound_identity(path)
        self._reg.start()
        log.info("registration socket listening", extra={"registration_socket": str(self.paths.registration),
                                                         "instance": self.paths.instance or "(plain names)"})
        sockets.remove_leftovers(self.paths)  # after listening: kubelet finds this instance first

    def serve(self, calls: Calls, extra_methods: Mapping[str, grpcserver.Method] = {}) -> None:
        """Serve the DRA service (and `extra_methods`, e.g. the health stream) on the DRA socket."""
        if not self._bound:
            self.listen()
        self._dra.add_methods(dra_services(calls))
        self._dra.add_methods(extra_methods)
        self._dra.start()
        log.info("serving", extra={"dra_socket": str(self.paths.dra),
                                   "registration_socket": str(self.paths.registration),
                                   "services": list(self.registration.services)})

    def unregister(self) -> None:
        """Leave kubelet's calls to another instance: the registration socket goes (kubelet deregisters this
        endpoint); the DRA service keeps answering calls already sent to it."""
        sockets.remove_own(self.paths.registration, self._bound.get(self.paths.registration))
        self._reg.stop(1.0)
        self.registration.registered.clear()

    def stop(self, grace: float = 5.0) -> None:
        """Unregister, then finish: the registration socket file goes first (kubelet deregisters this endpoint
        and sends new calls to another instance), then the DRA service refuses new calls and gives the running
        ones `grace` seconds. A socket file is removed only while it is still the one this instance bound."""
        for server, path in ((self._reg, self.paths.registration), (self._dra, self.paths.dra)):
            if server is self._reg:
                sockets.remove_own(path, self._bound.get(path))
            server.stop(grace if server is self._dra else min(grace, 1.0))
            sockets.remove_own(path, self._bound.get(path))
        self._bound = {}
