"""gRPC over HTTP/2 for the daemon's servers: its own HTTP/2 framing (h2frames.py) and `hpack`, not grpcio.

Why: grpcio costs the daemon ~26 MiB of resident memory and a quarter of a second of import (bench/bench_peer.py),
more than everything else it runs; the `h2` library, used before, cost ~0.2-0.45 ms of Python per call, the
largest part of the daemon's gap to the Go reference driver (docs/grpc-server.md has the figures). The kubelet
protocols need only unary and server-streaming calls over plaintext HTTP/2 (prior knowledge, no TLS), so the server
here is small. The wire rules it keeps are gRPC's "gRPC over HTTP2"
(https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) and `doc/statuscodes.md`, with the HTTP/2 rules
(RFC 9113) and HPACK (RFC 7541), summarised in docs/grpc-server.md.

- Every message is a 5-byte prefix (compressed flag, 4-byte big-endian length) and the bytes; responses end with
  trailers `grpc-status` / `grpc-message` (percent-encoded); a call that fails before any message is answered
  Trailers-Only (one HEADERS frame with :status 200, content-type and the status, END_STREAM).
- Requests: POST, content-type application/grpc[+proto|;...] (otherwise HTTP 415), a known path (otherwise
  UNIMPLEMENTED), at most `max_message` bytes (otherwise RESOURCE_EXHAUSTED), uncompressed (otherwise
  UNIMPLEMENTED), `grpc-timeout` honoured (DEADLINE_EXCEEDED; the call's context reports the time left).
- Handlers get the raw request bytes parsed here with the generated message class: undecodable requests are
  INVALID_ARGUMENT naming the message type (docs/hardening.md §1).
- Concurrency: at most `max_concurrent` calls per server at once (queued and running), beyond that
  RESOURCE_EXHAUSTED at once; `max_workers` threads run them; one thread per connection reads and answers
  HTTP/2 control frames (PING and SETTINGS acks, WINDOW_UPDATE once half a window has arrived; sends wait for
  the peer's flow-control windows). Connections beyond `max_connections` are closed at once.
- Shutdown: new calls are refused UNAVAILABLE, running ones get `grace` seconds (then their contexts are
  cancelled), then GOAWAY and close.

`call_unary` is the matching minimal client (the daemon's own liveness probe of its sockets).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import hpack
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from neuron_dra.driver.daemon import h2frames

log = logging.getLogger("neuron_dra.driver.daemon.h2grpc")

# Room for kubelet's largest prepare (thousands of claims) on the DRA socket; gRPC's default receive limit.
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024
MAX_SEND_MESSAGE = 4 * 1024 * 1024
MAX_HEADER_LIST = 16 * 1024  # our requests carry a handful of short headers
# HTTP/2 streams a connection may have open; above the call bounds, so the bound answers RESOURCE_EXHAUSTED
# (a peer exceeding this is a protocol error and loses the connection).
MAX_STREAMS_PER_CONNECTION = 100
SEND_TIMEOUT = 10.0  # seconds a send may block on a peer that does not read before the connection is dropped
PREFIX = struct.Struct(">BI")
_TIMEOUT = re.compile(rb"^([0-9]{1,8})([HMSmun])$")
_TIMEOUT_UNIT = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class StatusCode(enum.IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call's non-OK status: raised by `CallContext.abort` in handlers and by `call_unary` in clients."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext:
    """What a handler knows about its call: the deadline, whether the caller is still there, and callbacks run
    once when the call ends for any reason (answered, cancelled by the caller, connection lost, shutdown)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline  # time.monotonic(), None: no deadline
        self._lock = threading.Lock()
        self._over = False
        self._cancelled = False
        self._callbacks: list[Callable[[], object]] = []

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def is_active(self) -> bool:
        return not self._over and not self._cancelled and not self.expired

    def add_callback(self, fn: Callable[[], object]) -> bool:
        """Run `fn` when the call ends; False (and `fn` not kept) when it has ended already."""
        with self._lock:
            if self._over:
                return False
            self._callbacks.append(fn)
            return True

    def abort(self, code: StatusCode, details: str) -> NoReturn:
        raise RpcError(code, details)

    def cancel(self) -> None:
        self._cancelled = True
        self.end()

    def end(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # a failing callback must not stop the others or the connection
                log.exception("call end callback failed")


def message_class(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def parse(request_type: type[Message], data: bytes) -> Message:
    """The request message from the wire bytes, or RpcError INVALID_ARGUMENT naming the type."""
    try:
        return request_type.FromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:  # RuntimeError: recursion limit of nested messages
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"cannot decode the request as "
                       f"{request_type.DESCRIPTOR.full_name}: {(str(e) or type(e).__name__)[:200]}") from None


@dataclass(frozen=True)
class Method:
    """One unary or server-streaming method: `behaviour(request message, context)` returns the response message
    (unary) or an iterator of them (streaming)."""

    request_type: type[Message]
    behaviour: Callable[[Any, CallContext], Any]
    streaming: bool

    def run(self, data: bytes, context: CallContext) -> Iterator[bytes]:
        request = parse(self.request_type, data)
        if not self.streaming:
            yield self.behaviour(request, context).SerializeToString()
            return
        for response in self.behaviour(request, context):
            yield response.SerializeToString()


def service_methods(service: ServiceDescriptor, servicer: object) -> dict[str, Method]:
    """Wire path -> Method for every method of `service`, calling the servicer's method of the same name."""
    methods: dict[str, Method] = {}
    for m in service.methods:
        if m.client_streaming:
            raise ValueError(f"{m.full_name}: client-streaming methods are not supported")
        behaviour = getattr(servicer, m.name, None)
        if behaviour is None:
            raise TypeError(f"{type(servicer).__name__} lacks {m.name} of {service.full_name}")
        methods[f"/{service.full_name}/{m.name}"] = Method(message_class(m.input_type), behaviour, m.server_streaming)
    return methods


def method_paths(service: ServiceDescriptor) -> list[str]:
    """The wire paths of a service's methods (for fuzzing and tests)."""
    return [f"/{service.full_name}/{m.name}" for m in service.methods]


def _encode_message(status: str) -> bytes:
    # grpc-message is percent-encoded UTF-8 (PROTOCOL-HTTP2.md: space through '~' except '%' stay as they are).
    return urllib.parse.quote(status, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()


def _decode_message(raw: bytes) -> str:
    return urllib.parse.unquote(raw.decode("ascii", "replace"))


def _parse_timeout(raw: bytes) -> float:
    m = _TIMEOUT.match(raw)
    if m is None:
        raise RpcError(StatusCode.INTERNAL, f"malformed grpc-timeout {raw[:20]!r}: allowed 1-8 digits and a unit "
                                            "of H M S m u n")
    return int(m.group(1)) * _TIMEOUT_UNIT[m.group(2)]


class _Gone(Exception):
    """The stream or connection went away while answering."""


class _Call:
    def __init__(self, stream_id: int, method: Method, context: CallContext, send_window: int) -> None:
        self.stream_id = stream_id
        self.method = method
        self.context = context
        self.body = bytearray()
        self.headers_sent = False
        self.submitted = False  # handed to a worker, which releases it
        self.finished = False  # our side is closed (answered or reset)
        self.remote_ended = False  # the peer's END_STREAM arrived
        self.send_window = send_window  # the peer's flow-control window for this stream
        self.recv_window = h2frames.DEFAULT_WINDOW  # ours, as the peer sees it
        self.recv_unacked = 0


_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_RESPONSE_BLOCK = h2frames.encode_headers(_RESPONSE_HEADERS)
_OK_TRAILERS_BLOCK = h2frames.encode_headers(((b"grpc-status", b"0"),))
_GRPC_CONTENT_TYPE = re.compile(rb"^application/grpc([+;].*)?$")
_SERVER_SETTINGS = h2frames.settings({
    h2frames.Setting.MAX_CONCURRENT_STREAMS: MAX_STREAMS_PER_CONNECTION,
    h2frames.Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
})
# Received bytes are acknowledged (WINDOW_UPDATE) once half a window has arrived, as h2 and grpc-go do.
_ACK_THRESHOLD = h2frames.DEFAULT_WINDOW // 2
_MAX_HEADER_BLOCK = 4 * MAX_HEADER_LIST  # encoded bytes of one HEADERS + CONTINUATION sequence
_T = h2frames.FrameType


class _Connection:
    """One HTTP/2 connection: a thread reads and handles frames; workers answer calls through `lock`."""

    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        # Sends time out, receives do not: an idle kubelet connection stays open, a peer that stops reading is dropped.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(SEND_TIMEOUT), 0))
        if server.idle_timeout is not None:  # receives time out too: idle connections are closed (see Server)
            sock.settimeout(server.idle_timeout)
        self.reader = h2frames.FrameReader(expect_preface=True)
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.out = bytearray()  # frames to send, written by _flush
        self.lock = threading.Lock()
        self.window = threading.Condition(self.lock)  # notified when the peer opens its window or a stream ends
        self.calls: dict[int, _Call] = {}
        self.closed = False
        self.settings_seen = False  # the client's preface ends with its SETTINGS
        self.highest_stream = 0
        self.send_window = h2frames.DEFAULT_WINDOW  # the peer's connection window
        self.peer_initial_window = h2frames.DEFAULT_WINDOW
        self.peer_max_frame = h2frames.DEFAULT_MAX_FRAME
        self.recv_window = h2frames.DEFAULT_WINDOW
        self.recv_unacked = 0
        self.table_update = True  # the next header block starts with a table size update (see h2frames)
        self.continuing: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION: id, flags, block
        self.reading = False  # a thread reads the socket (the others wait for `turn`)
        self.turn = threading.Condition(self.lock)
        self.ready: collections.deque[tuple[_Call, bytes]] = collections.deque()  # complete requests, not yet run
        self.parked = 0  # threads waiting for their turn to read
        self.started = False  # SETTINGS sent (by the first reader)
        self.done = False  # cleaned up: threads waiting to read leave

    # --- everything below with self.lock held unless noted ---
    def _flush(self) -> None:
        if self.out and not self.closed:
            data, self.out = bytes(self.out), bytearray()
            try:
                self.sock.sendall(data)
            except OSError:
                self._close_locked()

    def _close_locked(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.window.notify_all()

    def _headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        if self.table_update:
            block = h2frames.TABLE_SIZE_ZERO + block
            self.table_update = False
        flags = h2frames.END_HEADERS | (h2frames.END_STREAM if end_stream else 0)
        self.out += h2frames.frame(_T.HEADERS, flags, stream_id, block)

    def _respond_status(self, call_or_id: _Call | int, code: StatusCode, details: str,
                        remote_ended: bool = False) -> None:
        """Trailers (after a message) or Trailers-Only; the stream is done on our side. `remote_ended`: whether
        the peer has ended its side (for a stream id; a call knows)."""
        call = call_or_id if isinstance(call_or_id, _Call) else None
        stream_id = call_or_id.stream_id if isinstance(call_or_id, _Call) else call_or_id
        if code is StatusCode.OK and call is not None and call.headers_sent:
            block = _OK_TRAILERS_BLOCK
        else:
            trailers: list[tuple[bytes, bytes]] = []
            if call is None or not call.headers_sent:
                trailers += _RESPONSE_HEADERS
            trailers.append((b"grpc-status", str(int(code)).encode()))
            if details:
                trailers.append((b"grpc-message", _encode_message(details[:1024])))
            block = h2frames.encode_headers(trailers)
        self._headers(stream_id, block, end_stream=True)
        if call is not None:
            remote_ended = call.remote_ended
        # The peer may still be sending the request (refused early): reset the rest, as gRPC servers do.
        if not remote_ended:
            self.out += h2frames.rst_stream(stream_id, h2frames.ErrorCode.NO_ERROR)
        if call is not None:
            call.finished = True
            # Released before the answer leaves: a client that sends its next call as soon as it has this answer
            # must not find this one still counted against the bound.
            self._release(call)
        self._flush()

    def _respond_http(self, stream_id: int, status: bytes, remote_ended: bool) -> None:
        self._headers(stream_id, h2frames.encode_headers([(b":status", status)]), end_stream=True)
        if not remote_ended:
            self.out += h2frames.rst_stream(stream_id, h2frames.ErrorCode.NO_ERROR)

    def _on_request(self, stream_id: int, headers: Mapping[bytes, bytes], end_stream: bool) -> None:
        if headers.get(b":method") != b"POST":
            self._respond_http(stream_id, b"405", end_stream)
            return
        if not _GRPC_CONTENT_TYPE.match(headers.get(b"content-type", b"")):
            self._respond_http(stream_id, b"415", end_stream)
            return
        path = headers[b":path"].decode("utf-8", "replace")
        method = self.server.methods.get(path)
        if method is None:
            self._respond_status(stream_id, StatusCode.UNIMPLEMENTED, f"unknown method {path[:200]}", end_stream)
            return
        deadline = None
        if b"grpc-timeout" in headers:
            try:
                deadline = time.monotonic() + _parse_timeout(headers[b"grpc-timeout"])
            except RpcError as e:
                self._respond_status(stream_id, e.code, e.details, end_stream)
                return
        if len(self.calls) >= MAX_STREAMS_PER_CONNECTION:  # over our SETTINGS_MAX_CONCURRENT_STREAMS
            self.out += h2frames.rst_stream(stream_id, h2frames.ErrorCode.REFUSED_STREAM)
            return
        refusal = self.server.admit()
        if refusal is not None:
            self._respond_status(stream_id, *refusal, end_stream)
            return
        call = _Call(stream_id, method, CallContext(deadline), self.peer_initial_window)
        self.calls[stream_id] = call
        if end_stream:
            call.remote_ended = True
            self._on_request_complete(call)

    def _on_data(self, f: h2frames.Frame) -> None:
        sid = f.stream_id
        if sid == 0 or sid > self.highest_stream:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
        size = len(f.payload)  # padding counts against flow control too
        self.recv_window -= size
        if self.recv_window < 0:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the window")
        self.recv_unacked += size
        if self.recv_unacked >= _ACK_THRESHOLD:
            self.out += h2frames.window_update(0, self.recv_unacked)
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        data = h2frames.strip_padding(f)
        call = self.calls.get(sid)
        if call is None or call.remote_ended:
            return  # a stream already answered and reset, or closed: only the connection window counts
        call.recv_window -= size
        if call.recv_window < 0:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.FLOW_CONTROL_ERROR, f"DATA beyond stream {sid}'s window")
        end = bool(f.flags & h2frames.END_STREAM)
        if not end:
            call.recv_unacked += size
            if call.recv_unacked >= _ACK_THRESHOLD:
                self.out += h2frames.window_update(sid, call.recv_unacked)
                call.recv_window += call.recv_unacked
                call.recv_unacked = 0
        else:
            call.remote_ended = True
        if call.finished or call.submitted:
            return
        call.body += data
        if len(call.body) > self.server.max_message + PREFIX.size:
            limit = self.server.max_message
            self._respond_status(call, StatusCode.RESOURCE_EXHAUSTED, f"request of more than {limit} bytes (the limit)")
        elif end:
            self._on_request_complete(call)

    def _release(self, call: _Call) -> None:
        if self.calls.pop(call.stream_id, None) is not None:
            self.server.release()
        call.context.end()

    def _on_request_complete(self, call: _Call) -> None:
        body = bytes(call.body)
        call.body = bytearray()
        if len(body) < PREFIX.size:
            self._respond_status(call, StatusCode.INTERNAL, f"request without a complete message ({len(body)} bytes)")
            return
        compressed, length = PREFIX.unpack_from(body)
        if compressed:
            self._respond_status(call, StatusCode.UNIMPLEMENTED,
                                 "compressed requests are not supported (grpc-encoding identity only)")
            return
        if length != len(body) - PREFIX.size:
            code = StatusCode.INTERNAL if length > len(body) - PREFIX.size else StatusCode.UNIMPLEMENTED
            self._respond_status(call, code, f"request body of {len(body) - PREFIX.size} bytes does not hold "
                                             f"exactly one message of {length} bytes")
            return
        if self.server.draining:
            self._respond_status(call, StatusCode.UNAVAILABLE, "the server is shutting down")
            return
        call.submitted = True  # a worker releases it
        self.ready.append((call, body[PREFIX.size:]))

    def _on_reset(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.finished = True
            call.remote_ended = True
            self.window.notify_all()
            if not call.submitted:
                self._release(call)
            call.context.cancel()  # a worker's call is released by the worker

    def _on_headers(self, f: h2frames.Frame) -> None:
        sid = f.stream_id
        if sid == 0:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = bytearray(h2frames.strip_padding(f))
        if not f.flags & h2frames.END_HEADERS:
            self.continuing = (sid, f.flags, block)
            return
        self._on_header_block(sid, f.flags, bytes(block))

    def _on_continuation(self, f: h2frames.Frame) -> None:
        if self.continuing is None or self.continuing[0] != f.stream_id:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        sid, flags, block = self.continuing
        block += f.payload
        if len(block) > _MAX_HEADER_BLOCK:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.ENHANCE_YOUR_CALM,
                                            f"header block over {_MAX_HEADER_BLOCK} bytes")
        if f.flags & h2frames.END_HEADERS:
            self.continuing = None
            self._on_header_block(sid, flags, bytes(block))

    def _on_header_block(self, sid: int, flags: int, block: bytes) -> None:
        # Decoded whatever becomes of the stream: the decoder's table must follow the peer's encoder.
        try:
            # raw=True: names and values stay bytes
            decoded = cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))
        except hpack.HPACKError as e:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.COMPRESSION_ERROR, str(e)[:200]) from None
        end_stream = bool(flags & h2frames.END_STREAM)
        call = self.calls.get(sid)
        if call is not None and not call.remote_ended:  # request trailers: clients send none, refused
            call.remote_ended = True
            if not end_stream:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
            if not call.finished and not call.submitted:
                self._respond_status(call, StatusCode.INTERNAL, "unexpected request trailers")
            return
        if sid % 2 == 0 or sid <= self.highest_stream:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR if sid % 2 == 0 else
                                            h2frames.ErrorCode.STREAM_CLOSED, f"HEADERS opening stream {sid}")
        self.highest_stream = sid
        try:
            headers = h2frames.request_headers(decoded)
        except h2frames.StreamError as e:
            self.out += h2frames.rst_stream(sid, e.code)
            return
        self._on_request(sid, headers, end_stream)

    def _on_settings(self, f: h2frames.Frame) -> None:
        values = h2frames.parse_settings(f)
        if f.flags & h2frames.ACK:
            return
        self.settings_seen = True
        window = values.get(h2frames.Setting.INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for call in self.calls.values():
                call.send_window += delta
                if call.send_window > h2frames.MAX_WINDOW:
                    raise h2frames.ConnectionError_(h2frames.ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
        self.peer_max_frame = values.get(h2frames.Setting.MAX_FRAME_SIZE, self.peer_max_frame)
        if h2frames.Setting.HEADER_TABLE_SIZE in values:
            self.table_update = True
        self.out += h2frames.SETTINGS_ACK
        self.window.notify_all()

    def _on_window_update(self, f: h2frames.Frame) -> None:
        increment = h2frames.u32(f, "WINDOW_UPDATE")
        sid = f.stream_id
        if sid == 0:
            if increment == 0:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > h2frames.MAX_WINDOW:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
        elif sid > self.highest_stream:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
        else:
            call = self.calls.get(sid)
            if call is None or call.finished:
                return
            call.send_window += increment
            if increment == 0 or call.send_window > h2frames.MAX_WINDOW:
                code = h2frames.ErrorCode.PROTOCOL_ERROR if increment == 0 else h2frames.ErrorCode.FLOW_CONTROL_ERROR
                self.out += h2frames.rst_stream(sid, code)
                self._on_reset(sid)
                return
        self.window.notify_all()

    def handle(self, f: h2frames.Frame) -> None:
        """One frame from the peer (RFC 9113 §6)."""
        if self.continuing is not None and f.type != _T.CONTINUATION:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "frame inside a header block")
        if not self.settings_seen and f.type != _T.SETTINGS:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "the preface must end with SETTINGS")
        t = f.type
        if t == _T.DATA:
            self._on_data(f)
        elif t == _T.HEADERS:
            self._on_headers(f)
        elif t == _T.CONTINUATION:
            self._on_continuation(f)
        elif t == _T.SETTINGS:
            self._on_settings(f)
        elif t == _T.WINDOW_UPDATE:
            self._on_window_update(f)
        elif t == _T.PING:
            if f.stream_id != 0:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if len(f.payload) != 8:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.FRAME_SIZE_ERROR, "PING not of 8 bytes")
            if not f.flags & h2frames.ACK:
                self.out += h2frames.frame(_T.PING, h2frames.ACK, 0, f.payload)
        elif t == _T.RST_STREAM:
            h2frames.u32(f, "RST_STREAM")
            if f.stream_id == 0 or f.stream_id > self.highest_stream:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            self._on_reset(f.stream_id)
        elif t == _T.PRIORITY:
            if f.stream_id == 0:
                raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(f.payload) != 5:
                self.out += h2frames.rst_stream(f.stream_id, h2frames.ErrorCode.FRAME_SIZE_ERROR)
        elif t == _T.PUSH_PROMISE:
            raise h2frames.ConnectionError_(h2frames.ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif t == _T.GOAWAY:
            h2frames.goaway_fields(f)  # the client opens no more streams; its calls finish as they are
        # other types are ignored (§4.1)

    # --- the reading threads ---
    # One thread at a time reads (`reading`). When a call is ready and a worker slot is free, the
    # reader hands the reading to a parked thread of this connection (or starts one) and answers the call itself:
    # the wake-up of the next reader overlaps the call instead of preceding it (a hand-off to a pool worker
    # cost ~60 µs per call, timed in the daemon). A thread done with its call ends if one reads and one is parked.
    def run(self) -> None:
        while True:
            with self.lock:
                while self.reading and not self.done:
                    if self.parked >= 1:
                        return  # one thread reads and another waits to: this one is not needed
                    self.parked += 1
                    self.turn.wait()
                    self.parked -= 1
                if self.done:
                    return
                self.reading = True
            job = self._read()
            with self.lock:
                self.reading = False
                spawn = job is not None and self.parked == 0 and not self.closed
                self.turn.notify()
            if job is None:
                return
            if spawn:  # nobody would read while this thread answers
                threading.Thread(target=self.run, name=f"{self.server.name}-conn", daemon=True).start()
            self.server.run_jobs(self, *job)

    def _read(self) -> tuple[_Call, bytes] | None:
        """Frames until a call is ready to run on this thread (a worker slot taken for it); None once the
        connection is over (then it is cleaned up)."""
        try:
            if not self.started:
                self.started = True
                with self.lock:
                    self.out += _SERVER_SETTINGS
                    self._flush()
            while not self.closed:
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    with self.lock:
                        busy = bool(self.calls)
                    if busy:
                        continue
                    self.goaway()  # idle for idle_timeout: a slot of max_connections back
                    break
                except OSError:
                    break
                if not data:
                    break
                with self.lock:
                    try:
                        for f in self.reader.feed(data):
                            self.handle(f)
                    except h2frames.ConnectionError_ as e:
                        # GOAWAY naming the error, then close.
                        log.debug("HTTP/2 protocol error", extra={"server": self.server.name, "error": str(e)[:200]})
                        self.out += h2frames.goaway(self.highest_stream, e.code, e.reason.encode()[:200])
                        self._flush()
                        break
                    self._flush()
                    job = self._dispatch_ready()
                if job is not None:
                    return job
        except BaseException:
            self._end()
            raise
        self._end()
        return None

    def _dispatch_ready(self) -> tuple[_Call, bytes] | None:
        """Calls whose request is complete: the first that gets a worker slot is this thread's; others get a
        thread of their own while slots last, then wait in the server's backlog for a slot."""
        mine: tuple[_Call, bytes] | None = None
        while self.ready:
            call, body = self.ready.popleft()
            if not self.server.take_slot():
                self.server.backlog.append((self, call, body))
            elif mine is None:
                mine = (call, body)
            else:
                threading.Thread(target=self.server.run_jobs, args=(self, call, body), daemon=True,
                                 name=f"{self.server.name}-call").start()
        return mine

    def _end(self) -> None:
        """The connection is over: calls not handed to a worker (complete ones included, when the read that
        completed them also hit a protocol error) are released, the others cancelled."""
        with self.lock:
            self.done = True
            self.turn.notify_all()  # threads waiting to read leave
            self._close_locked()
            unrun = [call for call, _ in self.ready]
            self.ready.clear()
            calls = list(self.calls.values())
            for call in calls:
                if not call.submitted:
                    self._release(call)
            for call in unrun:
                self._release(call)
        for call in calls:
            call.context.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.server.forget(self)

    # --- worker side ---
    def _send_message(self, call: _Call, payload: bytes, last: bool = False) -> None:
        """Headers (first time), the message within the peer's flow-control windows, and with `last` the OK
        trailers: a small unary answer leaves in one write."""
        view = memoryview(PREFIX.pack(0, len(payload)) + payload)
        with self.lock:
            if not call.headers_sent:
                self._check(call)
                self._headers(call.stream_id, _RESPONSE_BLOCK, end_stream=False)
                call.headers_sent = True
            while view:
                self._check(call)
                window = min(self.send_window, call.send_window, self.peer_max_frame)
                if window <= 0:
                    self._flush()
                    self.window.wait(1.0)
                    continue
                chunk = view[:window]
                self.out += h2frames.frame(_T.DATA, 0, call.stream_id, chunk.tobytes())
                self.send_window -= len(chunk)
                call.send_window -= len(chunk)
                view = view[len(chunk):]
            if last:
                self._check(call)
                self._respond_status(call, StatusCode.OK, "")  # flushes
            else:
                self._flush()

    def _check(self, call: _Call) -> None:
        if self.closed or call.finished or call.context.cancelled:
            raise _Gone()
        if call.context.expired:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    def serve(self, call: _Call, data: bytes) -> None:
        try:
            if call.context.cancelled or self.closed:
                return
            if call.context.expired:
                raise RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded before the call started")
            unary = not call.method.streaming
            for payload in call.method.run(data, call.context):
                if len(payload) > MAX_SEND_MESSAGE:
                    raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"response of {len(payload)} bytes exceeds the "
                                                                  f"limit of {MAX_SEND_MESSAGE}")
                self._send_message(call, payload, last=unary)
            if not unary:
                with self.lock:
                    self._check(call)
                    self._respond_status(call, StatusCode.OK, "")
        except _Gone:
            pass
        except RpcError as e:
            with self.lock:
                if not (self.closed or call.finished):
                    self._respond_status(call, e.code, e.details)
        except Exception as e:
            log.exception("call failed", extra={"server": self.server.name})
            with self.lock:
                if not (self.closed or call.finished):
                    self._respond_status(call, StatusCode.UNKNOWN,
                                         f"exception in the handler: {type(e).__name__}: {str(e)[:200]}")
        finally:
            with self.lock:
                self._release(call)

    def goaway(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.out += h2frames.goaway(self.highest_stream, h2frames.ErrorCode.NO_ERROR)
            self._flush()
            self._close_locked()


class Server:
    """A gRPC server of unary and server-streaming methods on sockets the caller binds (unix or TCP)."""

    def __init__(self, name: str, max_workers: int, max_concurrent: int, max_message: int = DEFAULT_MAX_MESSAGE,
                 max_connections: int = 128, idle_timeout: float | None = None) -> None:
        if max_concurrent < max_workers:
            raise ValueError(f"max_concurrent {max_concurrent} < max_workers {max_workers}: workers would never be "
                             "used")
        self.name = name
        self.max_message = max_message
        self.max_concurrent = max_concurrent
        self.max_connections = max_connections
        # Seconds a connection without calls stays open (None: for ever, as kubelet's one connection to the
        # unix sockets). On a TCP port any pod of the node can reach, idle connections must not use up the slots.
        self.idle_timeout = idle_timeout
        self.methods: dict[str, Method] = {}
        self._lock = threading.Lock()
        # Calls run on their connection's threads, at most max_workers at once; the others wait here for a slot.
        self._slots = max_workers
        self.backlog: collections.deque[tuple[_Connection, _Call, bytes]] = collections.deque()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._draining = False
        self._listeners: list[socket.socket] = []
        self._connections: set[_Connection] = set()
        self._threads: list[threading.Thread] = []
        self._started = False

    def add_service(self, service: ServiceDescriptor, servicer: object) -> None:
        self.add_methods(service_methods(service, servicer))

    def add_methods(self, methods: Mapping[str, Method]) -> None:
        if self._started:
            raise RuntimeError(f"server {self.name}: methods must be added before start")
        self.methods.update(methods)

    def add_socket(self, sock: socket.socket) -> None:
        """Serve on a bound, listening socket (the server closes it on stop)."""
        self._listeners.append(sock)
        if self._started:
            self._accept_in_background(sock)

    def start(self) -> None:
        self._started = True
        for sock in self._listeners:
            self._accept_in_background(sock)

    def _accept_in_background(self, sock: socket.socket) -> None:
        t = threading.Thread(target=self._accept, args=(sock,), name=f"{self.name}-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed by stop
            with self._lock:
                if self._draining or len(self._connections) >= self.max_connections:
                    sock.close()
                    continue
                conn = _Connection(self, sock)
                self._connections.add(conn)
            threading.Thread(target=conn.run, name=f"{self.name}-conn", daemon=True).start()

    def admit(self) -> tuple[StatusCode, str] | None:
        with self._lock:
            if self._draining:
                return StatusCode.UNAVAILABLE, "the server is shutting down"
            if self._active >= self.max_concurrent:
                return StatusCode.RESOURCE_EXHAUSTED, (f"{self._active} calls in progress on {self.name}, the limit "
                                                       f"is {self.max_concurrent}; retry")
            self._active += 1
            return None

    def release(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active <= 0:
                self._idle.notify_all()

    def forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    @property
    def active_calls(self) -> int:
        return self._active

    @property
    def draining(self) -> bool:
        return self._draining

    def take_slot(self) -> bool:
        with self._lock:
            if self._slots <= 0:
                return False
            self._slots -= 1
            return True

    def run_jobs(self, conn: _Connection, call: _Call, body: bytes) -> None:
        """Answer a call with a worker slot taken, then calls waiting in the backlog (any connection's) while
        there are some, then give the slot back."""
        job: tuple[_Connection, _Call, bytes] | None = (conn, call, body)
        while job is not None:
            job[0].serve(job[1], job[2])
            with self._lock:
                if self.backlog:
                    job = self.backlog.popleft()
                else:
                    job = None
                    self._slots += 1

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, refuse new calls, give running ones `grace` seconds, then cancel them; GOAWAY, close."""
        with self._lock:
            self._draining = True
        for sock in self._listeners:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
            with contextlib.suppress(OSError):
                sock.close()
        end = time.monotonic() + grace
        with self._lock:
            while self._active > 0 and time.monotonic() < end:
                self._idle.wait(max(0.0, min(0.2, end - time.monotonic())))
            connections = list(self._connections)
        for conn in connections:
            with conn.lock:
                calls = list(conn.calls.values())
            for call in calls:
                call.context.cancel()
            conn.goaway()
        # Calls still waiting for a slot are dropped (their connections are gone); running handlers are not waited
        # for: one stuck past its cancellation (e.g. in an API call) must not hold up the stop.
        with self._lock:
            waiting, self.backlog = list(self.backlog), collections.deque()
        for conn, call, _ in waiting:
            with conn.lock:
                conn._release(call)
        for t in self._threads:
            t.join(1.0)


# --- client (the liveness probe) ---

def call_unary(target: str | tuple[str, int], path: str, request: bytes, timeout: float,
               max_response: int = 1024 * 1024) -> bytes:
    """One unary call over a fresh connection: `target` a unix socket path or (host, port). Returns the response
    bytes; raises RpcError with the status (UNAVAILABLE when the server cannot be reached, DEADLINE_EXCEEDED when
    `timeout` passes)."""
    deadline = time.monotonic() + timeout
    family = socket.AF_UNIX if isinstance(target, str) else socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise RpcError(StatusCode.UNAVAILABLE, f"cannot open a socket: {e}") from None
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(target)
        except OSError as e:
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to {target}: {e}") from None
        stream_id = 1
        millis = max(1, int(timeout * 1000))
        block = h2frames.TABLE_SIZE_ZERO + h2frames.encode_headers([
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", f"{millis}m".encode())])
        message = PREFIX.pack(0, len(request)) + request
        if len(message) > h2frames.DEFAULT_MAX_FRAME:  # one DATA frame within the default window and frame size
            raise ValueError(f"request of {len(request)} bytes: this client sends at most "
                             f"{h2frames.DEFAULT_MAX_FRAME - PREFIX.size}")
        reader = h2frames.FrameReader(expect_preface=False)
        decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        body = bytearray()
        status: dict[bytes, bytes] = {}
        try:
            sock.sendall(h2frames.PREFACE + h2frames.settings({h2frames.Setting.ENABLE_PUSH: 0})
                         + h2frames.frame(h2frames.FrameType.HEADERS, h2frames.END_HEADERS, stream_id, block)
                         + h2frames.frame(h2frames.FrameType.DATA, h2frames.END_STREAM, stream_id, message))
            done = ending = False
            continuing: bytearray | None = None
            while not done:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(65536)
                if not data:
                    raise RpcError(StatusCode.UNAVAILABLE, "the server closed the connection")
                out = bytearray()
                for f in reader.feed(data):
                    t = f.type
                    if t == h2frames.FrameType.SETTINGS:
                        h2frames.parse_settings(f)
                        if not f.flags & h2frames.ACK:
                            out += h2frames.SETTINGS_ACK
                    elif t == h2frames.FrameType.PING and not f.flags & h2frames.ACK:
                        out += h2frames.frame(h2frames.FrameType.PING, h2frames.ACK, 0, f.payload)
                    elif t == h2frames.FrameType.HEADERS or (t == h2frames.FrameType.CONTINUATION and continuing):
                        if t == h2frames.FrameType.HEADERS:
                            continuing = bytearray(h2frames.strip_padding(f))
                            ending = f.stream_id == stream_id and bool(f.flags & h2frames.END_STREAM)
                        else:
                            assert continuing is not None
                            continuing += f.payload
                        if f.flags & h2frames.END_HEADERS:
                            status.update(decoder.decode(bytes(continuing), raw=True))
                            continuing = None
                            done = done or ending
                    elif t == h2frames.FrameType.DATA and f.stream_id == stream_id:
                        body += h2frames.strip_padding(f)
                        if len(body) > max_response + PREFIX.size:
                            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"response over {max_response} bytes")
                        if f.payload:  # the windows back at once: answers may exceed the initial window
                            out += h2frames.window_update(0, len(f.payload))
                            out += h2frames.window_update(stream_id, len(f.payload))
                        done = done or bool(f.flags & h2frames.END_STREAM)
                    elif (t == h2frames.FrameType.RST_STREAM and f.stream_id == stream_id) or \
                            t == h2frames.FrameType.GOAWAY:
                        done = True
                if out:
                    sock.sendall(out)
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout} s") from None
        except (OSError, h2frames.ConnectionError_, hpack.HPACKError) as e:
            raise RpcError(StatusCode.UNAVAILABLE, f"connection to {target} failed: {e}") from None
    return _result(status, bytes(body))


def _result(headers: Mapping[bytes, bytes], body: bytes) -> bytes:
    if headers.get(b":status", b"200") != b"200":
        raise RpcError(StatusCode.UNKNOWN, f"HTTP status {headers[b':status'].decode('ascii', 'replace')}")
    raw = headers.get(b"grpc-status")
    if raw is None:
        raise RpcError(StatusCode.INTERNAL, "the response has no grpc-status")
    try:
        code = StatusCode(int(raw))
    except ValueError:
        code = StatusCode.UNKNOWN
    if code is not StatusCode.OK:
        raise RpcError(code, _decode_message(headers.get(b"grpc-message", b"")))
    if len(body) < PREFIX.size:
        raise RpcError(StatusCode.INTERNAL, "OK without a response message")
    _, length = PREFIX.unpack_from(body)
    if length != len(body) - PREFIX.size:
        raise RpcError(StatusCode.INTERNAL, "the response is not exactly one message")
    return body[PREFIX.size:]


def listening_socket(family: int, address: str | tuple[str, int], backlog: int = 64) -> socket.socket:
    """A bound, listening stream socket (the caller handles unix socket permissions)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
