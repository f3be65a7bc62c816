"""The health port's TCP listener: a front that no peer can fill for another (docs/grpc-server.md "The health
port's front", "The node's lane").

grpc core frees a connection slot only when a connection ends, so idle connections from the pod network held
every slot and kubelet's liveness probe (a fresh connection per probe, from the node's own address) was refused.
Here every connection is accepted (asyncio, in an event loop thread per lane, below) and forwarded byte for byte
to the health grpc server on a private unix socket. Only HTTP/2 frame headers are read (RFC 9113 §4.1: 9 bytes,
payloads skipped), to count each connection's calls: a stream the client opens with HEADERS is in flight until the
server ends it (END_STREAM on HEADERS or DATA) or either side resets it.

Quotas are per peer (the client's address): connections, forwarded connections, calls in flight; and per
connection: calls over its life, bytes from the client, bytes waiting for a client that does not read, `lifetime`
seconds from its accept. Over a quota the heaviest is closed, never a connection with a call in flight for
another peer's connection, and never a connection waiting for its first answer: a connection that has sent the
24-byte preface waits (not read) for a forwarding slot instead. So a peer flooding the port costs the others of its
lane nothing but the event loop's time for what it is let through.

The node's own addresses (where kubelet's probe comes from) have a lane of their own (`Lanes`): a listening socket
of their own, with its own accept queue, on the same port (SO_REUSEPORT, the kernel steering each new connection by
its source address), and a front in an event loop thread of its own. A flood from elsewhere fills its own accept
queue and its own loop; the probe's SYN is not dropped behind it, and its bytes do not wait behind the flood's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import logging
import resource
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.driver.kubeletplugin._grpcserver import EventLoopThread

log = logging.getLogger(__name__)

# Bytes a client must have sent before it is forwarded: HTTP/2's client preface (RFC 9113 §3.4). Not more: a
# client may wait for the server's SETTINGS before it sends its call, after only the preface and an empty
# SETTINGS frame (33 bytes; grpc-go does). Connections that open and idle, or drip, never cost grpc anything.
FORWARD_BYTES = 24
SWEEP_SECONDS = 0.5
FILES_PER_FORWARDED = 3  # the client's socket, ours to grpc, grpc's end of it
FRAME_HEADER = 9
DATA, HEADERS, RST_STREAM = 0x0, 0x1, 0x3
END_STREAM = 0x1
# Why connections are closed, as counted (and exported as metrics): for a newer connection (evicted), at the end
# of their lifetime (expired), for what the client sent (bytes: over max_bytes; calls: over max_calls; calls in
# flight: the heaviest connection of the heaviest peer when a quota of calls in flight is full), for not reading
# (unread), on arrival with no room for them (refused), when the health server cannot be reached (backend).
REASONS = ("evicted", "expired", "bytes", "calls", "calls_in_flight", "unread", "refused", "backend")


@dataclass(frozen=True)
class FrontLimits:
    max_connections: int = 4096
    max_forwarded: int = 1024
    max_connections_per_peer: int = 2048
    max_forwarded_per_peer: int = 512
    max_calls: int = 1000  # over a connection's life (kubelet's probe makes one; max_bytes ends most sooner)
    max_calls_in_flight: int = 1024  # across peers (the health server's bound on checks at once is twice this)
    max_calls_in_flight_per_peer: int = 256
    # Calls let through at once: a call beyond is held (its connection not read) until one ends; a peer's first
    # call in flight always goes. So a flood is answered a few calls at a time and others' calls wait behind few.
    call_gate: int = 128
    call_gate_per_peer: int = 16
    lifetime: float = 5.0  # seconds from accept; the DaemonSet's probe timeout
    max_bytes: int = 16 * 1024  # from one client
    max_buffered: int = 16 * 1024  # waiting to be sent to one client (a probe's answer is a few hundred bytes)
    backlog: int = 128  # the listen queue, and the most connections accepted per event loop turn
    settle: float = 1.0  # a forwarded connection without a call yet is kept this long (it awaits SETTINGS)

    @classmethod
    def for_open_files(cls, open_files: int, reserve: int = 512) -> FrontLimits:
        """The default limits, smaller when the process may open fewer files than they need (`reserve` files left
        for everything else): past its open files limit a listener stops accepting for a while (asyncio)."""
        budget = max(64, open_files - reserve)
        forwarded = max(8, min(cls.max_forwarded, budget // (2 * FILES_PER_FORWARDED)))
        connections = min(cls.max_connections, budget - forwarded * FILES_PER_FORWARDED)
        return cls(max_connections=connections, max_forwarded=forwarded,
                   max_connections_per_peer=min(cls.max_connections_per_peer, connections // 2),
                   max_forwarded_per_peer=min(cls.max_forwarded_per_peer, max(2, forwarded // 2)))


class _Frames:
    """The frame headers of one direction of an HTTP/2 connection, fed as bytes arrive (payloads skipped)."""

    __slots__ = ("head", "skip")

    def __init__(self, skip: int = 0) -> None:
        self.skip = skip  # bytes to pass over before the next frame header (the preface, a payload)
        self.head = bytearray()

    def feed(self, data: bytes | memoryview) -> Iterable[tuple[int, int, int, int]]:
        """(type, flags, stream id, where the frame starts in `data`: negative when in an earlier chunk) of each
        frame whose header completes in `data`."""
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                step = min(self.skip, n - i)
                self.skip -= step
                i += step
                continue
            start = i - len(self.head)
            take = min(FRAME_HEADER - len(self.head), n - i)
            self.head += data[i:i + take]
            i += take
            if len(self.head) == FRAME_HEADER:
                head = self.head
                self.skip = int.from_bytes(head[0:3], "big")
                yield head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, start
                head.clear()


class _Peer:
    __slots__ = ("clients", "connections", "forwarded", "in_flight")

    def __init__(self) -> None:
        self.connections = 0
        self.forwarded = 0
        self.in_flight = 0
        self.clients: dict[_Client, None] = {}  # forwarded ones, in the order of their last activity


class _Client(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self.front = front
        self.opened = front.clock()
        self.forwarded_at = 0.0
        self.transport: asyncio.Transport | None = None
        self.backend: asyncio.Transport | None = None
        self.peer_name = ""
        self.peer: _Peer | None = None
        self.pending = bytearray()
        self.held: memoryview | None = None  # from a call held back on (not copied: not read meanwhile)
        self.received = 0
        self.state = "new"  # new (preface not complete), queued (for a forwarding slot), forwarded
        self.closed = False
        self.calls = 0
        self.answered = 0
        self.last_stream = 0
        self.streams: set[int] = set()  # in flight
        self.from_client = _Frames(skip=FORWARD_BYTES)
        self.from_server = _Frames()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer_name = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.front._admit(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.received += len(data)
        self.front._touch(self)
        if self.received > self.front.limits.max_bytes:
            self.front._close(self, "bytes")
        elif self.held is not None:  # reading is paused: only what was read already
            self.held = memoryview(bytes(self.held) + data)
        elif self.backend is not None:
            self._pass(data)
        else:
            self.pending += data
            if self.state == "new" and self.received >= FORWARD_BYTES:
                self.front._forward(self)

    def _pass(self, data: bytes | memoryview) -> None:
        """Send `data` to the server, counting the calls it opens or resets, up to a call that must wait."""
        assert self.backend is not None and self.transport is not None
        allowed = len(data)
        for kind, _, stream, start in self.from_client.feed(data):
            if kind == HEADERS and stream > self.last_stream:
                verdict = self.front._call(self, stream, can_hold=start >= 0)
                if verdict == "closed":
                    return
                if verdict == "hold":
                    allowed = start
                    self.held = memoryview(data)[start:]
                    self.from_client = _Frames()  # at the held frame's start again
                    self.transport.pause_reading()
                    self.front._hold(self)
                    break
                self.last_stream = stream
            elif kind == RST_STREAM:
                self.front._ended(self, stream, answered=False)
        if allowed:
            self.backend.write(data[:allowed] if allowed < len(data) else data)

    def resume(self) -> None:
        """The held call may go now."""
        data = self.held
        self.held = None
        if data is not None:
            self._pass(data)
        if self.held is None and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        self.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def to_client(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            return
        for kind, flags, stream, _ in self.from_server.feed(data):
            if (kind in (HEADERS, DATA) and flags & END_STREAM) or kind == RST_STREAM:
                self.front._ended(self, stream, answered=kind != RST_STREAM)
        self.front._touch(self)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > self.front.limits.max_buffered:
            self.front._close(self, "unread")

    def attach(self, backend: asyncio.Transport) -> None:
        if self.closed:
            backend.close()
            return
        self.backend = backend
        data = bytes(self.pending)
        self.pending.clear()
        self._pass(data)

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
        self._waiting: dict[_Client, None] = {}  # preface not complete
        self._forwarded: dict[_Client, None] = {}
        self._queued: dict[_Client, None] = {}  # preface complete, no forwarding slot yet (in arrival order)
        self._peers: dict[str, _Peer] = {}
        self._in_flight = 0
        self._held: dict[_Client, None] = {}  # connections with a call held back, in the order they were held
        self._releasing = False
        self._evicting = False  # a connection is being closed to make room: no queued one takes its slot
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self.closed: dict[str, int] = dict.fromkeys(REASONS, 0)  # connections closed, by reason

    # The counts tests and logs read most.
    @property
    def evicted(self) -> int:
        return self.closed["evicted"]

    @property
    def expired(self) -> int:
        return self.closed["expired"]

    @property
    def cut(self) -> int:
        return self.closed["bytes"] + self.closed["calls"] + self.closed["calls_in_flight"]

    @property
    def connections(self) -> int:
        return len(self._waiting) + len(self._queued) + len(self._forwarded)

    def counts(self) -> dict[str, dict[str, int]]:
        """What the metrics export: connections closed by reason, connections open by state, calls in flight."""
        return {"closed": dict(self.closed),
                "open": {"waiting": len(self._waiting), "queued": len(self._queued),
                         "forwarded": len(self._forwarded), "held": len(self._held)},
                "calls": {"in_flight": self._in_flight}}

    async def listen(self, address: str, port: int) -> int:
        """Bind and listen (accepting starts with `start`); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), address, port,
                                                backlog=self.limits.backlog, start_serving=False)
        port_: int = self._server.sockets[0].getsockname()[1]
        return port_

    async def serve(self, sock: socket.socket) -> None:
        """Accept on `sock`, a listening socket (from `start` on)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), sock=sock, backlog=self.limits.backlog,
                                                start_serving=False)

    async def start(self) -> None:
        assert self._server is not None, "listen first"
        await self._server.start_serving()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for client in [*self._waiting, *self._queued, *self._forwarded]:
            client.close()

    def _close(self, client: _Client, reason: str) -> None:
        if not client.closed:
            self.closed[reason] += 1
            client.close()

    # --- connections ------------------------------------------------------------------------------------------

    def _admit(self, client: _Client) -> None:
        peer = self._peers.get(client.peer_name)
        if peer is None:
            peer = self._peers[client.peer_name] = _Peer()
        client.peer = peer
        peer.connections += 1  # counted now: closing another of the peer's below cannot drop the peer
        if peer.connections > self.limits.max_connections_per_peer:
            victim = self._unforwarded_of(client.peer_name)
            if victim is None:
                self._refuse(client)
                return
            self._close(victim, "evicted")
        if self.connections >= self.limits.max_connections:
            heaviest = max(self._peers, key=lambda name: self._peers[name].connections)
            victim = self._unforwarded_of(heaviest) or self._unforwarded_of(client.peer_name)
            if victim is None:
                self._refuse(client)
                return
            self._close(victim, "evicted")
        self._waiting[client] = None

    def _refuse(self, client: _Client) -> None:
        client.closed = True  # in no group: nothing to forget
        self.closed["refused"] += 1
        assert client.transport is not None and client.peer is not None
        client.peer.connections -= 1
        client.transport.abort()
        self._drop_peer(client.peer_name)

    def _unforwarded_of(self, name: str) -> _Client | None:
        """The least recently active connection of peer `name` that is not forwarded (waiting, else queued)."""
        for group in (self._waiting, self._queued):
            for c in group:
                if c.peer_name == name:
                    return c
        return None

    def _forward(self, client: _Client) -> None:
        """`client` sent its preface: forwarded now if its peer and the front have room, or when a connection
        without a call in flight makes room (of the same peer, else of the peer holding the most), or else queued,
        not read, until a forwarded connection ends."""
        self._waiting.pop(client, None)
        peer = client.peer
        assert peer is not None
        if peer.forwarded >= self.limits.max_forwarded_per_peer:
            victim = self._idle_of(peer)
        elif len(self._forwarded) >= self.limits.max_forwarded:
            heaviest = max(self._peers.values(), key=lambda p: p.forwarded)
            victim = self._idle_of(heaviest) if heaviest.forwarded > peer.forwarded else self._idle_of(peer)
        else:
            self._start_forwarding(client)
            return
        if victim is not None:
            self._evicting = True
            try:
                self._close(victim, "evicted")
            finally:
                self._evicting = False
            self._start_forwarding(client)
            return
        client.state = "queued"
        self._queued[client] = None
        assert client.transport is not None
        client.transport.pause_reading()

    def _idle_of(self, peer: _Peer) -> _Client | None:
        """The least recently active forwarded connection of `peer` without a call in flight: one that has had an
        answer or has sent no call within `settle` seconds of being forwarded, else any (a newer connection is the
        more recently active: a probe awaiting the server's SETTINGS is the last to go)."""
        settled = self.clock() - self.limits.settle
        fallback = None
        for c in peer.clients:
            if not c.streams:
                if c.answered or c.forwarded_at < settled:
                    return c
                fallback = fallback or c
        return fallback

    def _start_forwarding(self, client: _Client) -> None:
        peer = client.peer
        assert peer is not None
        client.state = "forwarded"
        client.forwarded_at = self.clock()
        peer.forwarded += 1
        peer.clients[client] = None
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
            self._close(client, "backend")
            return
        client.attach(backend)

    def _dequeue(self) -> None:
        """Forward the queued connections that now have room, in arrival order."""
        if not self._queued or len(self._forwarded) >= self.limits.max_forwarded:
            return
        for client in list(self._queued):
            peer = client.peer
            assert peer is not None
            if peer.forwarded >= self.limits.max_forwarded_per_peer:
                continue
            del self._queued[client]
            self._start_forwarding(client)
            assert client.transport is not None
            client.transport.resume_reading()
            if len(self._forwarded) >= self.limits.max_forwarded:
                return

    def _touch(self, client: _Client) -> None:
        """`client` moved data: it goes last, the least recently active is closed first."""
        for group in (self._waiting, self._forwarded):
            if group.pop(client, False) is None:
                group[client] = None
                break
        peer = client.peer
        if peer is not None and peer.clients.pop(client, False) is None:
            peer.clients[client] = None

    def _forget(self, client: _Client) -> None:
        self._waiting.pop(client, None)
        self._queued.pop(client, None)
        self._held.pop(client, None)
        client.held = None
        peer = client.peer
        if peer is None:
            return
        peer.connections -= 1
        if client.streams:
            peer.in_flight -= len(client.streams)
            self._in_flight -= len(client.streams)
            client.streams.clear()
            self._release()
        if self._forwarded.pop(client, False) is None:
            peer.forwarded -= 1
            peer.clients.pop(client, None)
            if not self._evicting:
                self._dequeue()
        self._drop_peer(client.peer_name)

    def _drop_peer(self, name: str) -> None:
        peer = self._peers.get(name)
        if peer is not None and peer.connections <= 0:
            del self._peers[name]

    # --- calls -----------------------------------------------------------------------------------------------

    def _call(self, client: _Client, stream: int, can_hold: bool) -> str:
        """The client opens `stream`: "go" (counted in flight), "hold" (not yet: its peer has `call_gate_per_peer`
        in flight, or the front `call_gate` and the peer one at least), or "closed" (over `max_calls`; or when calls
        in flight are over a quota the heaviest connection is closed, of this peer for the peer's quota, of the
        peer with the most for the front's, which may be `client`)."""
        if client.calls >= self.limits.max_calls:
            self._close(client, "calls")
            return "closed"
        peer = client.peer
        assert peer is not None
        if can_hold and (peer.in_flight >= self.limits.call_gate_per_peer
                         or (peer.in_flight and self._in_flight >= self.limits.call_gate)):
            return "hold"
        client.calls += 1
        client.streams.add(stream)
        peer.in_flight += 1
        self._in_flight += 1
        if peer.in_flight > self.limits.max_calls_in_flight_per_peer:
            self._close(self._heaviest_of(peer), "calls_in_flight")
        elif self._in_flight > self.limits.max_calls_in_flight:
            heaviest = max(self._peers.values(), key=lambda p: p.in_flight)
            self._close(self._heaviest_of(heaviest), "calls_in_flight")
        return "closed" if client.closed else "go"

    def _hold(self, client: _Client) -> None:
        self._held[client] = None

    def _release(self) -> None:
        """Let held calls go while their peers and the front are below the gates: first of connections without a
        call in flight (a probe's only call before another connection's next), each in the order they were held."""
        if self._releasing:
            return
        self._releasing = True
        try:
            held = list(self._held)
            for client in [c for c in held if not c.streams] + [c for c in held if c.streams]:
                if self._in_flight >= self.limits.call_gate:
                    break
                peer = client.peer
                if client in self._held and peer is not None and peer.in_flight < self.limits.call_gate_per_peer:
                    del self._held[client]
                    client.resume()
        finally:
            self._releasing = False

    @staticmethod
    def _heaviest_of(peer: _Peer) -> _Client:
        """The forwarded connection of `peer` with the most calls in flight (the least recently active first)."""
        return max(peer.clients, key=lambda c: len(c.streams))

    def _ended(self, client: _Client, stream: int, answered: bool) -> None:
        if stream in client.streams:
            client.streams.discard(stream)
            client.answered += answered
            assert client.peer is not None
            client.peer.in_flight -= 1
            self._in_flight -= 1
            self._release()

    def _sweep(self) -> None:
        cutoff = self.clock() - self.limits.lifetime
        for client in [c for group in (self._waiting, self._queued, self._forwarded) for c in group
                       if c.opened < cutoff]:
            self._close(client, "expired")
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)


# The node's lane: kubelet's probes (liveness, readiness, startup: a connection each per period) and whatever
# else runs with the node's address. Small, so its own flood costs little; its connections count for the health
# grpc server's connection limit too (liveness.py).
NODE_LIMITS = FrontLimits(max_connections=256, max_forwarded=64, max_connections_per_peer=256,
                          max_forwarded_per_peer=64, max_calls_in_flight=128, max_calls_in_flight_per_peer=128,
                          call_gate=32, call_gate_per_peer=32)

# linux/asm-generic/socket.h and linux/filter.h: a classic BPF program choosing the socket of a SO_REUSEPORT group
# (its index, in the order the sockets listened) for each new connection; loads at SKF_NET_OFF + k read the IP
# header (the program starts past the TCP header).
SO_ATTACH_REUSEPORT_CBPF = 51
SKF_NET_OFF = -0x100000
_LD_W, _LD_B, _AND, _JEQ, _RET = 0x20, 0x30, 0x54, 0x15, 0x06  # ld [k], ldb [k], and #k, jeq #k, ret #k


def steering_program(addresses: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """Classic BPF (code, jt, jf, k): 1 (the node lane's socket) for a connection from one of `addresses`, else 0."""
    ips = [ipaddress.ip_address(a) for a in addresses]
    # (code, true label, false label, k); labels resolved to relative jumps below. The v6 source is 4 words at
    # bytes 8-23 of its header, the v4 source 1 word at bytes 12-15.
    asm: list[tuple[str, int, str, str, int]] = [("", _LD_B, "", "", SKF_NET_OFF), ("", _AND, "", "", 0xF0),
                                                 ("", _JEQ, "v4", "v6", 0x40), ("v4", _LD_W, "", "", SKF_NET_OFF + 12)]
    asm += [("", _JEQ, "node", "", int(ip)) for ip in ips if ip.version == 4]
    asm.append(("", _RET, "", "", 0))
    first = True
    for n, ip in enumerate(ip for ip in ips if ip.version == 6):
        for i, word in enumerate(struct.unpack(">4I", ip.packed)):
            asm.append(("v6" if first else f"a{n}" if i == 0 else "", _LD_W, "", "", SKF_NET_OFF + 8 + 4 * i))
            asm.append(("", _JEQ, "node" if i == 3 else "", f"a{n + 1}", word))
            first = False
    asm.append(("v6" if first else f"a{len([ip for ip in ips if ip.version == 6])}", _RET, "", "", 0))
    asm.append(("node", _RET, "", "", 1))
    where = {label: pc for pc, (label, *_) in enumerate(asm) if label}
    out = []
    for pc, (_, code, true, false, k) in enumerate(asm):
        jt, jf = ((where[x] - pc - 1 if x else 0) for x in (true, false))
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError(f"{len(ips)} node addresses are too many to steer by (at most about 40)")
        out.append((code, jt, jf, k & 0xFFFFFFFF))
    return out


def listen_sockets(address: str, port: int, node_addresses: Sequence[str], backlog: int, node_backlog: int
                   ) -> tuple[socket.socket, socket.socket | None]:
    """Listening sockets on (address, port): the front's, and the node lane's when `node_addresses` are given and
    the kernel steers by source address (Linux; None otherwise, with a warning: one socket takes every peer).
    The first socket binds alone (a port in use, by another daemon's group too, fails as it would without a
    lane); SO_REUSEPORT is set on it after, so only the node lane's socket joins its group."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    main = socket.socket(family, socket.SOCK_STREAM)
    try:
        main.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        main.bind((address, port))
        if not node_addresses:
            main.listen(backlog)
            return main, None
        main.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        main.listen(backlog)
    except OSError:
        main.close()
        raise
    node = socket.socket(family, socket.SOCK_STREAM)
    try:
        node.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        node.bind((address, main.getsockname()[1]))
        node.listen(node_backlog)
        program = steering_program(node_addresses)
        code = b"".join(struct.pack("=HBBI", *ins) for ins in program)
        buf = ctypes.create_string_buffer(code, len(code))
        fprog = struct.pack("HP", len(program), ctypes.addressof(buf))  # struct sock_fprog, native layout
        node.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as e:
        node.close()
        if sys.platform == "linux":
            log.warning("no lane of its own for the node's address on the health port",
                        extra={"error": str(e)})
        # The group would hash peers onto both sockets: one without a lane instead.
        main.close()
        return listen_sockets(address, port, (), backlog, node_backlog)
    return main, node


class Lanes:
    """The health port: a front for every peer and one for the node's own addresses (kubelet's probe), each in an
    event loop thread of its own (not the daemon's: a flood of the port costs the loop of the kubelet-facing
    servers only the calls a front lets through to the health server), forwarding to the health grpc server at
    `backend`."""

    def __init__(self, backend: str, address: str, port: int, node_addresses: Sequence[str] = (),
                 limits: FrontLimits | None = None, node_limits: FrontLimits = NODE_LIMITS) -> None:
        self.limits = limits or FrontLimits()
        main, node = listen_sockets(address, port, node_addresses, self.limits.backlog, node_limits.backlog)
        self.port: int = main.getsockname()[1]
        self.fronts: dict[str, tuple[Front, EventLoopThread]] = {}
        try:
            for lane, sock, lane_limits in (("other", main, self.limits), ("node", node, node_limits)):
                if sock is None:
                    continue
                front = Front(backend, lane_limits)
                self.fronts[lane] = (front, EventLoopThread(f"health-front-{lane}"))
                self._run(lane, front.serve(sock))
        except BaseException:
            self.close()
            main.close()
            if node is not None:
                node.close()
            raise

    def _run(self, lane: str, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.fronts[lane][1].loop).result(30)

    def start(self) -> None:
        for lane, (front, _) in self.fronts.items():
            self._run(lane, front.start())

    def close(self) -> None:
        for lane, (front, thread) in list(self.fronts.items()):
            with contextlib.suppress(Exception):
                self._run(lane, front.close())
            thread.close()

    @property
    def lanes(self) -> list[str]:
        return list(self.fronts)

    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """Each lane's Front.counts (read from another thread: numbers, each read whole)."""
        return {lane: front.counts() for lane, (front, _) in self.fronts.items()}


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
