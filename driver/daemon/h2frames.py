"""HTTP/2 frames (RFC 9113) for the daemon's gRPC server and its liveness client; header blocks via `hpack`.

Why not the `h2` library: its general state machine cost ~170 µs of Python per unary call on a warm machine and
~450 µs in the daemon between calls (measured with bench/bench_peer.py), a third of a NodeUnprepareResources
round trip. gRPC over unix sockets needs a small part of HTTP/2, kept here with the rules it follows
(docs/grpc-server.md cites the sections): frame parsing with size limits, SETTINGS, PING, WINDOW_UPDATE,
RST_STREAM, GOAWAY, HEADERS with CONTINUATION and padding, request header checks. HPACK decoding (Huffman, the
dynamic table) stays with the maintained `hpack` library; encoding needs no table: every header this process
sends is a literal "without indexing" (RFC 7541 §6.2.2), so its header blocks are constants.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADER = struct.Struct(">BHBBL")  # length (24 bits: 8 + 16), type, flags, stream id (31 bits)
FRAME_HEADER_SIZE = _HEADER.size
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_FRAME_LIMIT = (1 << 24) - 1
MAX_WINDOW = (1 << 31) - 1


class FrameType(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class Http2Error(Exception):
    """An HTTP/2 error with its code (RFC 9113 §7)."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(f"{code.name}: {reason}")
        self.code = code
        self.reason = reason


class ConnectionError_(Http2Error):
    """The connection must end: GOAWAY with `code` (RFC 9113 §5.4.1)."""


class StreamError(Http2Error):
    """One stream must end: RST_STREAM with `code` (RFC 9113 §5.4.2); the connection goes on."""


class Frame(NamedTuple):
    type: int  # a FrameType, or an unknown type (ignored, RFC 9113 §4.1)
    flags: int
    stream_id: int
    payload: bytes


def frame(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEADER.pack(n >> 16, n & 0xFFFF, type_, flags, stream_id) + payload


def settings(values: Mapping[int, int]) -> bytes:
    return frame(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in values.items()))


SETTINGS_ACK = frame(FrameType.SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + debug[:256])


class FrameReader:
    """Complete frames out of a byte stream; the server side checks the client's connection preface first.

    Frames longer than `max_frame_size` (what this side advertised: the default) are a FRAME_SIZE_ERROR, so a peer
    cannot make the buffer grow past one frame."""

    def __init__(self, *, expect_preface: bool, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self._preface = expect_preface
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> Iterator[Frame]:
        buf = self._buf
        buf += data
        if self._preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buf[:len(PREFACE)] != PREFACE:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del buf[:len(PREFACE)]
            self._preface = False
        start = 0
        try:
            while len(buf) - start >= FRAME_HEADER_SIZE:
                high, low, type_, flags, stream = _HEADER.unpack_from(buf, start)
                length = high << 16 | low
                if length > self.max_frame_size:
                    raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR,
                                           f"frame of {length} bytes, over the maximum {self.max_frame_size}")
                end = start + FRAME_HEADER_SIZE + length
                if len(buf) < end:
                    break
                yield Frame(type_, flags, stream & 0x7FFFFFFF, bytes(buf[start + FRAME_HEADER_SIZE:end]))
                start = end
        finally:
            del buf[:start]


def strip_padding(f: Frame) -> bytes:
    """DATA / HEADERS payload without padding (and without the HEADERS priority fields)."""
    payload = f.payload
    pad = 0
    if f.flags & PADDED:
        if not payload:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "padded frame without a pad length")
        pad = payload[0]
        payload = payload[1:]
    if f.type == FrameType.HEADERS and f.flags & PRIORITY_FLAG:
        if len(payload) < 5:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "HEADERS with priority fields too short")
        payload = payload[5:]
    if pad > len(payload):
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame payload")
    return payload[:len(payload) - pad] if pad else payload


def parse_settings(f: Frame) -> dict[int, int]:
    """The values of a non-ACK SETTINGS frame, checked (RFC 9113 §6.5)."""
    if f.stream_id != 0:
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
    if f.flags & ACK:
        if f.payload:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        return {}
    if len(f.payload) % 6:
        raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6 bytes")
    values: dict[int, int] = {}
    for i in range(0, len(f.payload), 6):
        key, value = struct.unpack_from(">HL", f.payload, i)
        if key == Setting.ENABLE_PUSH and value > 1:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
        if key == Setting.INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
        if key == Setting.MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
        values[key] = value
    return values


def u32(f: Frame, what: str) -> int:
    """The 4-byte payload of RST_STREAM / WINDOW_UPDATE (the reserved bit cleared)."""
    if len(f.payload) != 4:
        raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"{what} of {len(f.payload)} bytes, not 4")
    value: int = struct.unpack(">L", f.payload)[0]
    return value & 0x7FFFFFFF if f.type == FrameType.WINDOW_UPDATE else value


def goaway_fields(f: Frame) -> tuple[int, int]:
    if f.stream_id != 0 or len(f.payload) < 8:
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "malformed GOAWAY")
    last, code = struct.unpack_from(">LL", f.payload)
    return last & 0x7FFFFFFF, code


# --- header blocks ---

# RFC 7541 Appendix A: entries sent by index, and names sent by index with a literal value.
_STATIC_ENTRY = {(b":method", b"POST"): 3, (b":scheme", b"http"): 6, (b":status", b"200"): 8}
_STATIC_NAME = {b":authority": 1, b":method": 2, b":path": 4, b":scheme": 6, b":status": 8, b"content-type": 31}
TABLE_SIZE_ZERO = b"\x20"  # dynamic table size update to 0 (§6.3): this side never uses a dynamic table


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value  # no Huffman coding


def encode_headers(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A header block of indexed entries and literals without indexing (no dynamic table state)."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC_ENTRY.get((name, value))
        if index is not None:
            out += _integer(index, 7, 0x80)
        elif name in _STATIC_NAME:
            out += _integer(_STATIC_NAME[name], 4, 0x00) + _string(value)
        else:
            out += b"\x00" + _string(name) + _string(value)
    return bytes(out)


# Request headers that must not appear in HTTP/2 (RFC 9113 §8.2.2), and the pseudo-headers of a request (§8.3.1).
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))


def request_headers(decoded: Sequence[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The headers of a request as a dict, or StreamError PROTOCOL_ERROR for a malformed one (§8.1.1): pseudo-
    headers first, known, once each, :method :scheme :path present; names lowercase; no connection-specific
    headers; `te` only "trailers". Regular headers that repeat keep their last value (none is read twice)."""
    out: dict[bytes, bytes] = {}
    regular = False
    for name, value in decoded:
        if name[:1] == b":":
            if regular or name not in _REQUEST_PSEUDO or name in out:
                raise StreamError(ErrorCode.PROTOCOL_ERROR, f"bad pseudo-header {name[:40]!r}")
        else:
            regular = True
            if name != name.lower() or not name:
                raise StreamError(ErrorCode.PROTOCOL_ERROR, f"header name {name[:40]!r} is not lowercase")
            if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                raise StreamError(ErrorCode.PROTOCOL_ERROR, f"connection-specific header {name[:40]!r}")
        out[name] = value
    for required in (b":method", b":scheme", b":path"):
        if not out.get(required):
            raise StreamError(ErrorCode.PROTOCOL_ERROR, f"request without {required.decode()}")
    return out
