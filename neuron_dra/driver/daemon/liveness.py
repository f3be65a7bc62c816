"""gRPC health service (grpc.health.v1) on the healthcheck port, for kubelet's gRPC liveness probe.

Service "liveness" is SERVING only when the daemon answers its own kubelet-facing sockets: GetInfo on
the registration socket and an empty NodePrepareResources on the DRA socket (as the reference drivers
check), so a wedged server or a deleted socket fails the probe and kubelet restarts the container.
Service "readiness" is SERVING once kubelet has registered this instance (NotifyRegistrationStatus): during a
surge rollout the DaemonSet stops the old pod only when the new one is Ready, so kubelet always has an instance.
Service "" reports that the health server itself is up.

Liveness checks share one self-check: a check that arrives while one runs waits for its result (docs/grpc-server.md
"The liveness self-check"), so any number of checks makes at most one call at a time on each kubelet-facing socket.
The health grpc server listens on a path socket in a private (0700) directory that only the front reaches
(docs/hardening.md §1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc.aio

from neuron_dra.driver.kubeletplugin.toolkit import (
    NODE_LIMITS,
    CallContext,
    EventLoopThread,
    FrontLimits,
    Lanes,
    Limits,
    RpcError,
    Server,
    SocketPaths,
    StatusCode,
    call_on,
    dra_v1_pb2,
    grpc_health_v1_pb2,
    open_files_limit,
    pluginregistration_pb2,
    trim_memory,
)
from neuron_dra.driver.kubeletplugin.toolkit import channel as open_channel
from neuron_dra.driver.model.k8s_names import LIVENESS_SERVICE, READINESS_SERVICE

log = logging.getLogger(__name__)

SERVING = grpc_health_v1_pb2.HealthCheckResponse.SERVING
NOT_SERVING = grpc_health_v1_pb2.HealthCheckResponse.NOT_SERVING
HEALTH = grpc_health_v1_pb2.DESCRIPTOR.services_by_name["Health"]
# The probe is one small call every few seconds, answered in the event loop. The port is a front (_tcpfront.py)
# forwarding to this grpc server on a private unix socket; grpc's limits are a second line: no preface in 5 s,
# no calls in 10 s, any connection after 10 s (+5 s for its calls), small messages and headers, twice the
# fronts' forwarded connections (a closed one leaves grpc's count a moment later), and at most as many calls in
# the event loop at once as the fronts let through (their calls in flight; a check is a coroutine there).
LIMITS = Limits(max_concurrent=1, max_message=4096, max_streams=8,
                max_connections=(FrontLimits.max_forwarded + NODE_LIMITS.max_forwarded) * 2,
                max_metadata=8 * 1024, handshake_timeout_ms=5_000, idle_ms=10_000, age_ms=10_000,
                age_grace_ms=5_000,
                max_inline=(FrontLimits.max_calls_in_flight + NODE_LIMITS.max_calls_in_flight) * 2)
# Self-checks start at most this often: checks back to back cost the kubelet-facing sockets at most one GetInfo and
# one empty prepare per interval (a check waits at most this much longer; its result is never older than it).
CHECK_INTERVAL = 0.2


class HealthService:
    def __init__(self, paths: SocketPaths, probe_timeout: float = 2.0,
                 registered: threading.Event | None = None, interval: float = CHECK_INTERVAL) -> None:
        self._paths = paths
        self._timeout = probe_timeout
        self._registered = registered  # None: ready whenever live
        self._interval = interval
        # One channel per socket, kept while its calls succeed: the check then needs no new connection, so
        # connections others hold (up to the server's limit) cannot fail it. Dropped on a failure (a fresh one
        # next time: grpc's reconnect backoff would otherwise fail checks for up to two minutes). Only the one
        # self-check in flight uses them, so one failure never ends another check's call.
        self._channels: dict[Path, grpc.aio.Channel] = {}
        self._check: asyncio.Task[tuple[bool, str]] | None = None  # the self-check in flight, shared
        self._started = -float("inf")  # when the last self-check started (the event loop's clock)

    async def _call(self, socket: Path, method: str, request: bytes) -> bytes:
        try:
            mode = os.stat(socket).st_mode
        except OSError as e:
            raise RpcError(StatusCode.UNAVAILABLE, f"{socket}: {e.strerror}") from e
        if not stat.S_ISSOCK(mode):
            raise RpcError(StatusCode.UNAVAILABLE, f"{socket} is not a socket")
        channel = self._channels.get(socket)
        if channel is None:
            channel = self._channels[socket] = open_channel(f"unix:{socket}")
        try:
            return await call_on(channel, method, request, self._timeout)
        except RpcError:
            await self._drop(socket)
            raise

    async def _drop(self, socket: Path) -> None:
        channel = self._channels.pop(socket, None)
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
            with contextlib.suppress(BaseException):
                await self._check
        for socket in list(self._channels):
            await self._drop(socket)

    async def live(self) -> tuple[bool, str]:
        """(ok, why not) of the self-check in flight, or of a new one when none is: every check waiting at once
        shares one. A caller that goes away (its call cancelled) does not cancel it for the others."""
        task = self._check
        if task is None or task.done():
            task = self._check = asyncio.get_running_loop().create_task(self._next_check())
        return await asyncio.shield(task)

    async def _next_check(self) -> tuple[bool, str]:
        loop = asyncio.get_running_loop()
        wait = self._started + self._interval - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        self._started = loop.time()
        try:
            return await self._self_check()
        except Exception as e:  # never raised to the checks waiting: a failed check, said so
            log.exception("liveness self-check failed")
            return False, f"self-check failed: {type(e).__name__}"

    async def _self_check(self) -> tuple[bool, str]:
        """A GetInfo and an empty prepare over the daemon's own sockets (each socket file must be there; the calls
        on a connection kept for the next check; the heap trimmed after)."""
        try:
            info = pluginregistration_pb2.PluginInfo.FromString(await self._call(
                self._paths.registration, "/pluginregistration.Registration/GetInfo",
                pluginregistration_pb2.InfoRequest().SerializeToString()))
            if info.endpoint != str(self._paths.dra):
                return False, f"registration answers endpoint {info.endpoint!r}, expected {self._paths.dra}"
            await self._call(self._paths.dra, f"/{dra_v1_pb2.DESCRIPTOR.package}.DRAPlugin/NodePrepareResources",
                             dra_v1_pb2.NodePrepareResourcesRequest().SerializeToString())
        except RpcError as e:
            return False, f"{e.code.name}: {e.details}"
        finally:
            trim_memory(collect=False)
        return True, ""

    async def Check(self, request: Any, context: CallContext) -> Any:
        if request.service == "":
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING)
        if request.service == LIVENESS_SERVICE:
            ok, why = await self.live()
            if not ok:
                log.warning("liveness check failed", extra={"error": why})
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING if ok else NOT_SERVING)
        if request.service == READINESS_SERVICE:
            ready = self._registered is None or self._registered.is_set()
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING if ready else NOT_SERVING)
        context.abort(StatusCode.NOT_FOUND,
                      f"unknown health service {request.service!r}; known: '', {LIVENESS_SERVICE!r} and "
                      f"{READINESS_SERVICE!r}")

    def Watch(self, request: Any, context: CallContext) -> Iterator[Any]:
        context.abort(StatusCode.UNIMPLEMENTED, "Watch is not implemented; use Check")
        yield  # a generator: Watch is server-streaming


class HealthServer:
    """The health port: its own grpc server and pool, apart from the kubelet-facing sockets', behind a TCP front
    (_tcpfront.py), in the event loop given (the daemon's) or else its own.

    The grpc server listens on `health.sock` in a directory of its own made by mkdtemp (mode 0700, under the
    temporary directory, the container's own /tmp in the DaemonSet): an abstract socket was open to every process
    of the network namespace (all of the node's with hostNetwork), and 2,100 idle connections to it took every
    probe down. A path socket is reached through the file system: not from another mount namespace (another
    container), not by another user (docs/hardening.md §1)."""

    def __init__(self, paths: SocketPaths, address: str, port: int,
                 registered: threading.Event | None = None, loop: EventLoopThread | None = None,
                 node_addresses: Sequence[str] = ()) -> None:
        self.service = HealthService(paths, registered=registered)
        self._server = Server("health", LIMITS, loop)
        self._server.add_service(HEALTH, self.service)
        self._dir = Path(tempfile.mkdtemp(prefix="neuron-dra-health-"))  # 0700, a fresh name per daemon
        self.socket = self._dir / "health.sock"
        try:
            self._server.add_unix(self.socket)
            # kubelet's probe comes from the node's address: a lane of its own (_tcpfront.Lanes)
            self.front = Lanes(str(self.socket), address, port, node_addresses,
                               FrontLimits.for_open_files(open_files_limit()))
        except OSError as e:
            self._server.stop(0)
            self._remove_dir()
            host = f"[{address}]" if ":" in address else address
            raise OSError(f"cannot listen for health checks on {host}:{port}: {e}") from e
        self.port: int = self.front.port

    def _remove_dir(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def start(self) -> None:
        self._server.start()
        self.front.start()
        log.info("health service listening", extra={"port": self.port, "service": LIVENESS_SERVICE,
                                                     "lanes": self.front.lanes})

    def stop(self, grace: float = 1.0) -> None:
        self.front.close()
        with contextlib.suppress(Exception):  # the loop may be gone already
            self._server.run(self.service.close(), timeout=5)
        self._server.stop(grace)
        self._remove_dir()
