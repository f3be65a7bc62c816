"""driver/daemon/h2frames.py and the HTTP/2 rules of driver/daemon/h2grpc.py connections, frame by frame
(RFC 9113, RFC 7541).

The peer here writes frames by hand (h2frames' own encoders for the malformed ones) and reads the answers with
the `h2` library's client, an independent implementation; grpcio's client and the real kubelet cover the
well-formed paths in test_driver_h2grpc.py and tests/e2e."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from neuron_dra.driver.daemon import h2frames, h2grpc
from neuron_dra.driver.daemon._generated import pluginregistration_pb2 as rpb
from neuron_dra.driver.daemon.h2frames import END_HEADERS, END_STREAM, PADDED, ErrorCode, FrameType, frame
from neuron_dra.driver.daemon.h2grpc import CallContext
from tests.support.driver import short_dir

REGISTRATION = rpb.DESCRIPTOR.services_by_name["Registration"]
GET_INFO = b"/pluginregistration.Registration/GetInfo"
REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", GET_INFO), (b":authority", b"x"),
           (b"content-type", b"application/grpc"), (b"te", b"trailers")]
EMPTY_MESSAGE = b"\0\0\0\0\0"


class Servicer:
    def __init__(self, endpoint_size: int = 1) -> None:
        self.endpoint_size = endpoint_size

    def GetInfo(self, request: Any, context: CallContext) -> Any:
        return rpb.PluginInfo(type="DRAPlugin", name="t", endpoint="x" * self.endpoint_size)

    def NotifyRegistrationStatus(self, request: Any, context: CallContext) -> Any:
        return rpb.RegistrationStatusResponse()


@pytest.fixture
def served() -> Iterator[tuple[Path, Servicer]]:
    with short_dir() as d:
        servicer = Servicer()
        server = h2grpc.Server("f", max_workers=2, max_concurrent=8, max_message=64 * 1024)
        server.add_service(REGISTRATION, servicer)
        path = d / "f.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        try:
            yield path, servicer
        finally:
            server.stop(1)


class Peer:
    """Bytes written by hand; what comes back parsed by h2's client state machine (or raw frames)."""

    def __init__(self, path: Path, preface: bool = True, settings: bytes | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(str(path))
        self.encoder = hpack.Encoder()
        self.raw = h2frames.FrameReader(expect_preface=False)
        if preface:
            self.send(h2frames.PREFACE + (settings if settings is not None else h2frames.settings({})))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def headers(self, sid: int, headers: list[tuple[bytes, bytes]] = REQUEST, flags: int = END_HEADERS) -> None:
        self.send(frame(FrameType.HEADERS, flags, sid, self.encoder.encode(headers)))

    def request(self, sid: int, body: bytes = EMPTY_MESSAGE) -> None:
        self.headers(sid)
        self.send(frame(FrameType.DATA, END_STREAM, sid, body))

    def frames(self, until: Any, timeout: float = 5) -> list[h2frames.Frame]:
        """Frames until `until(frame)` is true, or the connection closes (then the list ends with None)."""
        out: list[Any] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            data = self.sock.recv(65536)
            if not data:
                return [*out, None]
            for f in self.raw.feed(data):
                out.append(f)
                if until(f):
                    return out
        raise AssertionError(f"not seen in {out}")

    def close(self) -> None:
        self.sock.close()


def goaway_code(frames: list[Any]) -> int:
    f = next(f for f in frames if f is not None and f.type == FrameType.GOAWAY)
    code: int = struct.unpack_from(">LL", f.payload)[1]
    return code


def is_goaway(f: h2frames.Frame) -> bool:
    return f.type == FrameType.GOAWAY


def ends(sid: int) -> Any:
    return lambda f: f.stream_id == sid and (f.type == FrameType.RST_STREAM or (f.flags & END_STREAM
                                             and f.type in (FrameType.HEADERS, FrameType.DATA)))


def trailers(frames: list[Any], sid: int) -> dict[bytes, bytes]:
    decoder = hpack.Decoder()
    out: dict[bytes, bytes] = {}
    for f in frames:
        if f is not None and f.type == FrameType.HEADERS:
            decoded = decoder.decode(h2frames.strip_padding(f), raw=True)
            if f.stream_id == sid:
                out.update((bytes(k), bytes(v)) for k, v in decoded)
    return out


# --- encoding ---

def test_header_blocks_are_constant_literals_any_hpack_decoder_reads() -> None:
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"13"),
               (b"grpc-message", b"x" * 300)]  # a length over the 7-bit prefix: a multi-byte integer
    block = h2frames.encode_headers(headers)
    assert block == h2frames.encode_headers(headers)  # no table state
    assert hpack.Decoder().decode(h2frames.TABLE_SIZE_ZERO + block, raw=True) == headers
    assert block[0] == 0x88  # :status 200 by its static index


def test_frame_reader_checks_the_preface_and_the_frame_size() -> None:
    reader = h2frames.FrameReader(expect_preface=True)
    assert list(reader.feed(h2frames.PREFACE[:10])) == []  # a preface arriving in pieces
    ping = frame(FrameType.PING, 0, 0, b"12345678")
    got = list(reader.feed(h2frames.PREFACE[10:] + ping + ping[:5]))
    assert [(f.type, f.payload) for f in got] == [(FrameType.PING, b"12345678")]
    assert [f.payload for f in reader.feed(ping[5:])] == [b"12345678"]
    with pytest.raises(h2frames.ConnectionError_) as e:
        list(reader.feed(frame(FrameType.DATA, 0, 1, b"x" * (h2frames.DEFAULT_MAX_FRAME + 1))))
    assert e.value.code is ErrorCode.FRAME_SIZE_ERROR
    with pytest.raises(h2frames.ConnectionError_):
        list(h2frames.FrameReader(expect_preface=True).feed(b"GET / HTTP/1.1\r\n"))


@pytest.mark.parametrize("headers, why", [
    ([(b":method", b"POST"), (b":scheme", b"http")], "request without :path"),
    ([*REQUEST, (b":path", b"/again")], "bad pseudo-header"),
    ([(b"content-type", b"application/grpc"), *REQUEST[:3]], "bad pseudo-header"),
    ([*REQUEST, (b"Content-Length", b"5")], "not lowercase"),
    ([*REQUEST, (b"connection", b"keep-alive")], "connection-specific"),
    ([*REQUEST[:5], (b"te", b"gzip")], "connection-specific"),
    ([(b":status", b"200"), *REQUEST], "bad pseudo-header"),
])
def test_malformed_requests_are_stream_errors(headers: list[tuple[bytes, bytes]], why: str) -> None:
    with pytest.raises(h2frames.StreamError) as e:
        h2frames.request_headers(headers)
    assert e.value.code is ErrorCode.PROTOCOL_ERROR and why in e.value.reason


# --- the server's connections ---

def test_a_malformed_request_is_reset_and_the_connection_goes_on(served: tuple[Path, Servicer]) -> None:
    peer = Peer(served[0])
    try:
        peer.headers(1, [*REQUEST, (b"Upper", b"x")])
        frames = peer.frames(ends(1))
        assert frames[-1].type == FrameType.RST_STREAM
        assert struct.unpack(">L", frames[-1].payload)[0] == ErrorCode.PROTOCOL_ERROR
        peer.request(3)
        assert trailers(peer.frames(ends(3)), 3)[b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_continuation_padding_and_priority_are_understood(served: tuple[Path, Servicer]) -> None:
    peer = Peer(served[0])
    try:
        block = peer.encoder.encode(REQUEST)
        # HEADERS padded, with priority fields, the block split over two CONTINUATIONs; DATA padded.
        first = bytes((3,)) + b"\0\0\0\0\x10" + block[:4] + b"\0\0\0"
        peer.send(frame(FrameType.HEADERS, PADDED | h2frames.PRIORITY_FLAG, 1, first)
                  + frame(FrameType.CONTINUATION, 0, 1, block[4:8])
                  + frame(FrameType.CONTINUATION, END_HEADERS, 1, block[8:])
                  + frame(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10")
                  + frame(FrameType.DATA, END_STREAM | PADDED, 1, b"\x02" + EMPTY_MESSAGE + b"\0\0"))
        got = trailers(peer.frames(ends(1)), 1)
        assert (got[b":status"], got[b"grpc-status"]) == (b"200", b"0")
    finally:
        peer.close()


@pytest.mark.parametrize("bad, code", [
    (frame(FrameType.PING, 0, 0, b"1234"), ErrorCode.FRAME_SIZE_ERROR),
    (frame(FrameType.PING, 0, 1, b"12345678"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.SETTINGS, 0, 0, b"\0\x04\xff\xff\xff\xff"), ErrorCode.FLOW_CONTROL_ERROR),
    (frame(FrameType.SETTINGS, 0, 0, b"\0\x05\0\0\0\x01"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.SETTINGS, 0, 0, b"\0\x04\0"), ErrorCode.FRAME_SIZE_ERROR),
    (frame(FrameType.SETTINGS, 1, 0, b"\0\x04\0\0\0\0"), ErrorCode.FRAME_SIZE_ERROR),
    (h2frames.window_update(0, 0), ErrorCode.PROTOCOL_ERROR),
    (h2frames.window_update(0, h2frames.MAX_WINDOW), ErrorCode.FLOW_CONTROL_ERROR),
    (frame(FrameType.DATA, 0, 9, b"x"), ErrorCode.PROTOCOL_ERROR),  # an idle stream
    (frame(FrameType.HEADERS, END_HEADERS, 2, b"\x82"), ErrorCode.PROTOCOL_ERROR),  # even: a server's id
    (frame(FrameType.HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
    (frame(FrameType.CONTINUATION, END_HEADERS, 1, b"\x82"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.HEADERS, 0, 1, b"\x82") + h2frames.window_update(0, 1), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\x02"), ErrorCode.PROTOCOL_ERROR),
    (frame(FrameType.DATA, 0, 1, b"x" * (h2frames.DEFAULT_MAX_FRAME + 1)), ErrorCode.FRAME_SIZE_ERROR),
    (h2frames.rst_stream(0, ErrorCode.CANCEL), ErrorCode.PROTOCOL_ERROR),
])
def test_connection_errors_get_goaway_with_their_code_and_the_server_serves_on(
        served: tuple[Path, Servicer], bad: bytes, code: ErrorCode) -> None:
    peer = Peer(served[0])
    try:
        peer.send(bad)
        frames = peer.frames(is_goaway)
        assert goaway_code(frames) == code
        assert peer.frames(lambda f: False, timeout=5)[-1] is None  # then closed
    finally:
        peer.close()
    info = rpb.PluginInfo.FromString(h2grpc.call_unary(str(served[0]), GET_INFO.decode(), b"", 5))
    assert info.type == "DRAPlugin"


def test_the_preface_must_end_with_settings(served: tuple[Path, Servicer]) -> None:
    peer = Peer(served[0], settings=frame(FrameType.PING, 0, 0, b"12345678"))
    try:
        assert goaway_code(peer.frames(is_goaway)) == ErrorCode.PROTOCOL_ERROR
    finally:
        peer.close()


def test_ping_settings_and_a_table_size_change_are_acknowledged(served: tuple[Path, Servicer]) -> None:
    # A peer that allows no dynamic table: the server's header blocks must still decode (they use none) and
    # begin with the size update RFC 7541 §4.2 asks for after the change.
    peer = Peer(served[0], settings=h2frames.settings({h2frames.Setting.HEADER_TABLE_SIZE: 0}))
    try:
        peer.send(frame(FrameType.PING, 0, 0, b"abcdefgh"))
        frames = peer.frames(lambda f: f.type == FrameType.PING)
        assert frames[-1].flags & h2frames.ACK and frames[-1].payload == b"abcdefgh"
        assert any(f.type == FrameType.SETTINGS and f.flags & h2frames.ACK for f in frames)
        peer.request(1)
        frames = peer.frames(ends(1))
        first = next(f for f in frames if f.type == FrameType.HEADERS)
        assert first.payload[:1] == h2frames.TABLE_SIZE_ZERO
        decoder = hpack.Decoder()
        decoder.max_allowed_table_size = 0
        assert dict(decoder.decode(first.payload, raw=True))[b":status"] == b"200"
    finally:
        peer.close()


def test_answers_follow_the_peers_flow_control_windows(served: tuple[Path, Servicer]) -> None:
    """A client with a 100-byte stream window and a 16 KiB frame limit gets a 40 KiB answer only as it opens the
    window; the DATA frames never exceed what it allowed."""
    path, servicer = served
    servicer.endpoint_size = 40 * 1024
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    client.initiate_connection()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        client.send_headers(1, REQUEST)
        client.send_data(1, EMPTY_MESSAGE, end_stream=True)
        sock.sendall(client.data_to_send())
        body = bytearray()
        sizes: list[int] = []
        ended = False
        while not ended:
            data = sock.recv(65536)
            assert data, "closed"
            for event in client.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    sizes.append(len(event.data))
                    body += event.data
                    client.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            sock.sendall(client.data_to_send())
    assert max(sizes) <= 100 and len(sizes) > 40 * 1024 / 100
    assert len(rpb.PluginInfo.FromString(bytes(body[5:])).endpoint) == 40 * 1024


def test_a_request_bigger_than_the_window_is_read_as_the_server_opens_it(served: tuple[Path, Servicer]) -> None:
    """A 60 KiB request over several frames: the server's WINDOW_UPDATEs let it in; the answer is OK."""
    peer = Peer(served[0])
    try:
        message = rpb.RegistrationStatus(error="e" * 60 * 1024).SerializeToString()
        body = struct.pack(">BI", 0, len(message)) + message
        peer.headers(1, [*REQUEST[:2], (b":path", b"/pluginregistration.Registration/NotifyRegistrationStatus"),
                         *REQUEST[3:]])
        chunk = h2frames.DEFAULT_MAX_FRAME
        for i in range(0, len(body), chunk):
            last = i + chunk >= len(body)
            peer.send(frame(FrameType.DATA, END_STREAM if last else 0, 1, body[i:i + chunk]))
        frames = peer.frames(ends(1))
        assert any(f.type == FrameType.WINDOW_UPDATE for f in frames)
        assert trailers(frames, 1)[b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_data_beyond_the_window_is_a_flow_control_error(served: tuple[Path, Servicer]) -> None:
    peer = Peer(served[0])
    try:
        peer.headers(1)
        for _ in range(4):  # 64 KiB in one go, before any WINDOW_UPDATE could be read: over 65,535
            peer.send(frame(FrameType.DATA, 0, 1, b"\0" * h2frames.DEFAULT_MAX_FRAME))
        peer.send(frame(FrameType.DATA, 0, 1, b"\0" * 100))
        frames = peer.frames(lambda f: f.type in (FrameType.GOAWAY, FrameType.RST_STREAM))
        # The call is refused at 64 KiB + 5 (the server's message limit) or the window is exceeded first.
        last = frames[-1]
        assert last.type == FrameType.RST_STREAM or goaway_code(frames) == ErrorCode.FLOW_CONTROL_ERROR
    finally:
        peer.close()


def test_request_trailers_are_refused(served: tuple[Path, Servicer]) -> None:
    peer = Peer(served[0])
    try:
        peer.headers(1)
        peer.send(frame(FrameType.DATA, 0, 1, EMPTY_MESSAGE))
        peer.headers(1, [(b"x-trailer", b"1")], flags=END_HEADERS | END_STREAM)
        got = trailers(peer.frames(ends(1)), 1)
        assert got[b"grpc-status"] == str(int(h2grpc.StatusCode.INTERNAL)).encode()
        assert b"trailers" in got[b"grpc-message"]
    finally:
        peer.close()


def test_streams_over_the_advertised_maximum_are_refused_one_by_one() -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS is 100: with the server's call bound above that, a 101st open stream gets
    RST_STREAM REFUSED_STREAM (a stream error), and the connection serves on once streams end."""
    with short_dir() as d:
        server = h2grpc.Server("many", max_workers=2, max_concurrent=200)
        server.add_service(REGISTRATION, Servicer())
        path = d / "m.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        peer = Peer(path)
        try:
            opened = [1 + 2 * i for i in range(h2grpc.MAX_STREAMS_PER_CONNECTION + 1)]
            for sid in opened:
                peer.headers(sid)  # open: no END_STREAM, no body yet
            frames = peer.frames(lambda f: f.type == FrameType.RST_STREAM)
            assert (frames[-1].stream_id, struct.unpack(">L", frames[-1].payload)[0]) == \
                (opened[-1], ErrorCode.REFUSED_STREAM)
            assert server.active_calls == h2grpc.MAX_STREAMS_PER_CONNECTION
            peer.send(frame(FrameType.DATA, END_STREAM, 1, EMPTY_MESSAGE))
            assert trailers(peer.frames(ends(1)), 1)[b"grpc-status"] == b"0"
            end = time.monotonic() + 5  # the worker releases its call just after the last frame leaves
            while server.active_calls == h2grpc.MAX_STREAMS_PER_CONNECTION and time.monotonic() < end:
                time.sleep(0.01)
            sid = opened[-1] + 2
            peer.request(sid)  # 100 open again: admitted
            assert trailers(peer.frames(ends(sid)), sid)[b"grpc-status"] == b"0"
        finally:
            peer.close()
            server.stop(1)


def test_random_frames_never_break_the_server(served: tuple[Path, Servicer]) -> None:
    """Seeded fuzzing: after a valid preface, frames of every type with random flags, stream ids and payloads
    (some with valid header blocks). Each connection ends in an answer, a reset, a GOAWAY or a close; no reading
    thread dies of an exception, and the server serves a real call afterwards."""
    rng = random.Random(20261201)
    encoder_blocks = [hpack.Encoder().encode(REQUEST), hpack.Encoder().encode([(b":status", b"200")]), b""]
    died: list[BaseException | None] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        for _ in range(300):
            peer = Peer(served[0])
            try:
                data = bytearray()
                for _ in range(rng.randint(1, 6)):
                    type_ = rng.choice([*FrameType, 0x0A, 0xFF])
                    payload = rng.choice([rng.randbytes(rng.randint(0, 40)), rng.choice(encoder_blocks),
                                          EMPTY_MESSAGE, b"\0\0\0\x01"])
                    data += frame(type_, rng.randint(0, 255), rng.choice([0, 1, 2, 3, 5, 0x7FFFFFFF]), payload)
                peer.send(bytes(data))
                peer.sock.settimeout(0.2)
                with contextlib.suppress(TimeoutError, ConnectionError):
                    while peer.sock.recv(65536):
                        pass
            finally:
                peer.close()
    finally:
        threading.excepthook = hook
    assert died == []
    info = rpb.PluginInfo.FromString(h2grpc.call_unary(str(served[0]), GET_INFO.decode(), b"", 5))
    assert info.type == "DRAPlugin"


def test_a_request_completed_by_the_read_that_ends_the_connection_is_released() -> None:
    """A complete request and a connection error in one write: the call never runs, and its place in the server's
    concurrency bound is given back (it used to stay taken for good)."""
    with short_dir() as d:
        server = h2grpc.Server("leak", max_workers=2, max_concurrent=4)
        server.add_service(REGISTRATION, Servicer())
        path = d / "l.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        try:
            for _ in range(5):  # more than the bound: each would leak a place
                peer = Peer(path)
                try:
                    peer.send(frame(FrameType.HEADERS, END_HEADERS, 1, peer.encoder.encode(REQUEST))
                              + frame(FrameType.DATA, END_STREAM, 1, EMPTY_MESSAGE)
                              + frame(FrameType.PING, 0, 0, b"1234"))  # FRAME_SIZE_ERROR
                    frames = peer.frames(is_goaway)
                    assert goaway_code(frames) == ErrorCode.FRAME_SIZE_ERROR
                finally:
                    peer.close()
            end = time.monotonic() + 3
            while server.active_calls and time.monotonic() < end:
                time.sleep(0.01)
            assert server.active_calls == 0
            info = rpb.PluginInfo.FromString(h2grpc.call_unary(str(path), GET_INFO.decode(), b"", 5))
            assert info.type == "DRAPlugin"
        finally:
            server.stop(1)
