"""The health port's TCP listener: a front that no number of connections can fill (docs/grpc-server.md).

grpc core frees a connection slot only when a connection ends, so idle connections from the pod network held
every slot and kubelet's liveness probe (a fresh connection per probe) was refused. Here every connection is
accepted (asyncio, in the daemon's event loop) and forwarded byte for byte to the health grpc server on an
abstract unix socket; nothing is parsed. Beyond `max_connections` the least recently active connection not yet
forwarded (else of all) is closed: a probe sends its call at once and is answered in milliseconds, so a flood
closes its own connections first. A connection is forwarded after `FORWARD_BYTES`, at most `max_forwarded` at
once (below grpc's limit), and ends `lifetime` seconds after its accept, after `max_bytes` from the client, or
when more than `max_buffered` bytes wait for a client that does not read.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Bytes a client must have sent before it is forwarded: HTTP/2's client preface (RFC 9113 §3.4). Not more: a
# client may wait for the server's SETTINGS before it sends its call, after only the preface and an empty
# SETTINGS frame (33 bytes; grpc-go does). Connections that open and idle, or drip, never cost grpc anything.
FORWARD_BYTES = 24
SWEEP_SECONDS = 0.5
FILES_PER_FORWARDED = 3  # the client's socket, ours to grpc, grpc's end of it


@dataclass(frozen=True)
class FrontLimits:
    max_connections: int = 4096
    max_forwarded: int = 1024
    lifetime: float = 5.0  # seconds from accept; the DaemonSet's probe timeout
    max_bytes: int = 16 * 1024  # from one client
    max_buffered: int = 64 * 1024  # waiting to be sent to one client
    backlog: int = 128  # the listen queue, and the most connections accepted per event loop turn

    @classmethod
    def for_open_files(cls, open_files: int, reserve: int = 512) -> FrontLimits:
        """The default limits, smaller when the process may open fewer than they need (`reserve` files left for
        everything else): past its open files limit a listener stops accepting for a while (asyncio)."""
        budget = max(64, open_files - reserve)
        forwarded = min(cls.max_forwarded, budget // (2 * FILES_PER_FORWARDED))
        return cls(max_connections=min(cls.max_connections, budget - forwarded * FILES_PER_FORWARDED),
                   max_forwarded=max(8, forwarded))


class _Client(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self.front = front
        self.opened = front.clock()
        self.transport: asyncio.Transport | None = None
        self.backend: asyncio.Transport | None = None
        self.pending = bytearray()
        self.received = 0
        self.forwarding = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.front._admit(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.received += len(data)
        self.front._touch(self)
        if self.received > self.front.limits.max_bytes:
            self.front.cut += 1
            self.close()
        elif self.backend is not None:
            self.backend.write(data)
        else:
            self.pending += data
            if not self.forwarding and self.received >= FORWARD_BYTES:
                self.forwarding = True
                self.front._forward(self)

    def eof_received(self) -> bool | None:
        self.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def to_client(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            return
        self.front._touch(self)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > self.front.limits.max_buffered:
            self.close()

    def attach(self, backend: asyncio.Transport) -> None:
        if self.closed:
            backend.close()
            return
        self.backend = backend
        backend.write(bytes(self.pending))
        self.pending.clear()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pending.clear()
        if self.transport is not None:
            self.transport.abort()
        if self.backend is not None:
            self.backend.abort()
        self.front._forget(self)


class _Backend(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.to_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Front:
    """Accepts TCP connections on (address, port) and forwards them to the unix socket `backend` (a path, or an
    abstract name starting with a NUL byte); runs in the event loop it is started in."""

    def __init__(self, backend: str, limits: FrontLimits | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.limits = limits or FrontLimits()
        self.clock = clock  # what lifetimes are measured on (a test's fake clock)
        # In the order of their last activity (accept, data either way): the first is the least recent.
        self._waiting: dict[_Client, None] = {}  # not forwarded yet
        self._forwarded: dict[_Client, None] = {}
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self.evicted = 0  # closed for a newer connection
        self.expired = 0  # closed at the end of their lifetime
        self.cut = 0  # closed for sending more than max_bytes

    @property
    def connections(self) -> int:
        return len(self._waiting) + len(self._forwarded)

    async def listen(self, address: str, port: int) -> int:
        """Bind and listen (accepting starts with `start`); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), address, port,
                                                backlog=self.limits.backlog, start_serving=False)
        port_: int = self._server.sockets[0].getsockname()[1]
        return port_

    async def start(self) -> None:
        assert self._server is not None, "listen first"
        await self._server.start_serving()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for client in [*self._waiting, *self._forwarded]:
            client.close()

    def _admit(self, client: _Client) -> None:
        if self.connections >= self.limits.max_connections:
            self.evicted += 1
            next(iter(self._waiting or self._forwarded)).close()
        self._waiting[client] = None

    def _forward(self, client: _Client) -> None:
        self._waiting.pop(client, None)
        if len(self._forwarded) >= self.limits.max_forwarded:
            self.evicted += 1
            next(iter(self._forwarded)).close()
        self._forwarded[client] = None
        task = asyncio.get_running_loop().create_task(self._connect(client))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, client: _Client) -> None:
        try:
            backend, _ = await asyncio.get_running_loop().create_unix_connection(lambda: _Backend(client),
                                                                                 self.backend)
        except OSError as e:
            log.warning("cannot reach the health server", extra={"error": str(e)})
            client.close()
            return
        client.attach(backend)

    def _touch(self, client: _Client) -> None:
        """`client` moved data: it goes last, the least recently active is closed first."""
        for group in (self._waiting, self._forwarded):
            if group.pop(client, False) is None:
                group[client] = None
                return

    def _forget(self, client: _Client) -> None:
        self._waiting.pop(client, None)
        self._forwarded.pop(client, None)

    def _sweep(self) -> None:
        cutoff = self.clock() - self.limits.lifetime
        for client in [c for group in (self._waiting, self._forwarded) for c in group if c.opened < cutoff]:
            self.expired += 1
            client.close()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)


def open_files_limit() -> int:
    """The process's open files limit, raised first to its hard limit (as Go's runtime does at start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
