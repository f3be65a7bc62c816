"""A lean HTTP/1.1 client on one TLS socket, for the daemon's API server calls (driver/daemon/kube.py).

Why not http.client: every NodePrepareResources GETs its ResourceClaim, and http.client spends most of such a
request building it header by header and parsing the answer's headers through the email package. Against a real
kube-apiserver 1.36 a claim GET took p50 1.46 ms with http.client and 1.27 ms with a bare request over the same
socket (bench/bench_claim_get.py measures both in one run). This client does only what the API server's
answers need, after RFC 9112 (https://www.rfc-editor.org/rfc/rfc9112):

- Requests: one buffer (request line, headers, body) and one `sendall`; TCP_NODELAY, so the small request is not
  held back by Nagle's algorithm waiting for the previous answer's ACK.
- Answers: status line `HTTP/1.x NNN reason` (§4), header fields (§5, names case-insensitive, no obsolete line
  folding), 1xx interim answers skipped (§15.2 of RFC 9110); the body framed by §6.3: none for HEAD, 1xx, 204 and
  304; `Transfer-Encoding: chunked` (§7.1, chunk extensions ignored, trailers read and dropped); Content-Length;
  otherwise until the server closes the connection.
- Limits, so a bad server cannot make the daemon grow without bound: MAX_HEADER_BYTES for the header section (and
  for chunked trailers), MAX_BODY_BYTES for a body read whole (`read`) and for one line of a streamed body
  (`readline`, watches: their total is unbounded by design). Over a limit: LimitError naming it.
- Keep-alive: the connection is reused after an answer read to its end unless it said `Connection: close`, was
  HTTP/1.0 without `keep-alive`, or was delimited by the close. An idle kept connection is checked before reuse
  (`reusable`): one the server closed meanwhile (its idle timeout) is readable at EOF, and is replaced before the
  request is sent, so even non-idempotent requests need no retry in that usual case.
- Errors: malformed answers raise ProtocolError saying what was wrong; a connection that ends before any byte of
  the answer raises ClosedBeforeAnswer (the caller decides whether to send the request again: docs/hardening.md
  §4); timeouts and resets are the socket's own (TimeoutError, ConnectionError).
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
_RECV_BYTES = 64 * 1024
_CHUNK_LINE_BYTES = 1024  # a chunk-size line: hex digits and (ignored) extensions
_HEX = frozenset(b"0123456789abcdefABCDEF")
# RFC 9110 §9.2.2: a request of these methods may be sent again with the same effect.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class HttpError(Exception):
    """The answer could not be read as HTTP/1.1."""


class ProtocolError(HttpError):
    """A malformed answer; the message says what was wrong."""


class LimitError(ProtocolError):
    """An answer over one of the limits (MAX_HEADER_BYTES, MAX_BODY_BYTES); the message names it."""


class ClosedBeforeAnswer(ConnectionError):
    """The connection ended before any byte of the answer: the server may or may not have seen the request."""


@dataclass(frozen=True)
class Limits:
    header_bytes: int = MAX_HEADER_BYTES
    body_bytes: int = MAX_BODY_BYTES


DEFAULT_LIMITS = Limits()


def header_block(host: str, fields: Iterable[tuple[str, str]]) -> str:
    """Host and `fields` as header lines (each ending in CRLF): built once, sent with many requests."""
    lines = [("Host", host), *fields]
    # A CR or LF from a value (a token file's content) would split the request.
    if any("\n" in n + v or "\r" in n + v for n, v in lines):
        raise ValueError(f"refusing to send the header fields {[n for n, _ in lines]}: a CR or LF in a header "
                         "field would change the request")
    return "".join([f"{name}: {value}\r\n" for name, value in lines])


def request_bytes(method: str, target: str, headers: str, body: bytes | None = None) -> bytes:
    """The request as sent in one buffer: request line, the `header_block`, Content-Length for a body, the body."""
    if " " in target or "\r" in target or "\n" in target:
        raise ValueError(f"refusing to send {method} {target[:200]!r}: a space, CR or LF in the request target "
                         "would change the request")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        headers += f"Content-Length: {len(body or b'')}\r\n"
    data = f"{method} {target} HTTP/1.1\r\n{headers}\r\n".encode("latin-1")
    return data + body if body else data


def connect(host: str, port: int, context: ssl.SSLContext, connect_timeout: float, read_timeout: float,
            limits: Limits = DEFAULT_LIMITS) -> Connection:
    """A TLS connection (TCP and TLS handshake within `connect_timeout`); `read_timeout` bounds every recv."""
    raw = socket.create_connection((host, port), timeout=connect_timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls = context.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise
    tls.settimeout(read_timeout)
    return Connection(tls, limits)


class Connection:
    """One HTTP/1.1 connection: one request at a time, its answer read before the next is sent."""

    def __init__(self, sock: socket.socket, limits: Limits = DEFAULT_LIMITS) -> None:
        self.sock = sock
        self.limits = limits
        self.closed = False
        self.idle = True  # no answer pending or partly read: the connection may carry the next request
        self._timeout = sock.gettimeout()  # settimeout costs a system call: only when it changes
        self._buf = bytearray()  # received, not yet parsed
        self._recv = memoryview(bytearray(_RECV_BYTES))  # recv_into it: no new buffer per recv

    def close(self) -> None:
        self.closed = True
        self.idle = False
        self.sock.close()

    def settimeout(self, seconds: float) -> None:
        if seconds != self._timeout:
            self.sock.settimeout(seconds)
            self._timeout = seconds

    def reusable(self) -> bool:
        """Whether this idle connection can carry a request: open on our side, and nothing readable on it. A
        readable idle connection is at EOF (the server closed it), reset, or holds bytes nobody asked for; the
        exception is TLS records without data (a TLS 1.3 session ticket), which a non-blocking read consumes."""
        if self.closed or not self.idle or self._buf:
            return False
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        if not poll.poll(0):
            return True
        self.sock.settimeout(0.0)
        try:
            self.sock.recv(1)
        except ssl.SSLWantReadError:
            return True
        except OSError:
            return False
        finally:
            self.sock.settimeout(self._timeout)
        return False  # EOF, or unsolicited data

    def exchange(self, request: bytes, method: str, *, stream: bool = False) -> Response:
        """Send one request and read the answer's head; the body is read from the returned Response. `stream`:
        the response owns the connection (closes it when closed) and bounds lines instead of the whole body."""
        if self.closed or not self.idle:
            raise ProtocolError("the previous answer on this connection was not read to its end")
        self.idle = False
        try:
            try:
                self.sock.sendall(request)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError) as e:
                raise ClosedBeforeAnswer(f"the connection was closed as the request was sent: {e}") from e
            return self._answer(method, stream)
        except BaseException:
            self.close()  # its state is unknown: never reused
            raise

    def _answer(self, method: str, stream: bool) -> Response:
        first = True
        while True:  # 1xx interim answers (100 Continue, 103 Early Hints) precede the final one: skipped
            status, reason, http10, headers = self._head(first)
            if status == 101 or not 100 <= status <= 199:
                break
            first = False
        if status == 101:
            raise ProtocolError("the server switched protocols (101), which this client never asks for")
        framing = _framing(method, status, headers)
        keep = _keeps_alive(http10, headers) and framing[0] != "close"
        return Response(self, status, reason, headers, framing, keep, stream)

    # --- reading ------------------------------------------------------------------------------------------------

    def _fill(self) -> bool:
        """Receive more bytes into the buffer; False at EOF."""
        n = self.sock.recv_into(self._recv)
        self._buf += self._recv[:n]
        return n > 0

    def _head(self, first: bool) -> tuple[int, str, bool, dict[str, str]]:
        end = self._find_head_end(first)
        head = bytes(self._buf[:end])
        del self._buf[:end + 4]
        crlf = head.count(b"\r\n")
        if head.count(b"\n") != crlf or head.count(b"\r") != crlf:
            raise ProtocolError(f"a bare CR or LF in the answer's header section (lines end with CRLF): "
                                f"{head[:200]!r}")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        status, reason, http10 = _status_line(status_line)
        return status, reason, http10, _header_fields(lines)

    def _find_head_end(self, first: bool) -> int:
        limit = self.limits.header_bytes
        start = 0
        while (end := self._buf.find(b"\r\n\r\n", start)) < 0:
            if len(self._buf) > limit:
                raise LimitError(f"the answer's header section is over the limit of {limit} bytes "
                                 "(MAX_HEADER_BYTES)")
            start = max(0, len(self._buf) - 3)
            before = len(self._buf)
            try:
                more = self._fill()
            except (ConnectionResetError, ssl.SSLEOFError) as e:
                if first and before == 0:
                    raise ClosedBeforeAnswer(f"the connection was reset before any byte of the answer: {e}") from e
                raise
            if not more:
                if first and before == 0:
                    raise ClosedBeforeAnswer("the server closed the connection before any byte of the answer")
                raise ProtocolError(f"the server closed the connection within the answer's header section "
                                    f"after {len(self._buf)} bytes: {bytes(self._buf[:100])!r}")
        if end > limit:
            raise LimitError(f"the answer's header section is over the limit of {limit} bytes (MAX_HEADER_BYTES)")
        return end

    def buffered(self) -> int:
        return len(self._buf)

    def take_buffered(self, n: int) -> bytes:
        piece = bytes(self._buf[:n])
        del self._buf[:n]
        return piece

    def _take(self, n: int) -> bytes:
        """Up to `n` buffered bytes (receiving if none are buffered); b"" at EOF."""
        if not self._buf and not self._fill():
            return b""
        if len(self._buf) <= n:
            piece = bytes(self._buf)
            self._buf.clear()
        else:
            piece = bytes(self._buf[:n])
            del self._buf[:n]
        return piece

    def _line(self, limit: int, what: str) -> bytes:
        """One CRLF-terminated line (without the CRLF), at most `limit` bytes."""
        start = 0
        while (end := self._buf.find(b"\r\n", start)) < 0:
            if len(self._buf) > limit:
                raise LimitError(f"the {what} is over the limit of {limit} bytes")
            start = max(0, len(self._buf) - 1)
            if not self._fill():
                raise ProtocolError(f"the server closed the connection within the {what}")
        if end > limit:
            raise LimitError(f"the {what} is over the limit of {limit} bytes")
        line = bytes(self._buf[:end])
        del self._buf[:end + 2]
        return line

    def _crlf(self) -> None:
        while len(self._buf) < 2:
            if not self._fill():
                raise ProtocolError("the server closed the connection before the CRLF after chunk data")
        if self._buf[:2] != b"\r\n":
            raise ProtocolError(f"chunk data not followed by CRLF (the chunk is longer than its size): "
                                f"{bytes(self._buf[:20])!r}")
        del self._buf[:2]

    def fixed_body(self, length: int, what: str = "Content-Length") -> Iterator[bytes]:
        remaining = length
        while remaining:
            piece = self._take(remaining)
            if not piece:
                raise ProtocolError(f"the server closed the connection {remaining} bytes short of the "
                                    f"{what} {length}")
            remaining -= len(piece)
            yield piece

    def chunked_body(self) -> Iterator[bytes]:
        while size := _chunk_size(self._line(_CHUNK_LINE_BYTES, "chunk size line")):
            yield from self.fixed_body(size, "chunk size")
            self._crlf()
        trailers = 0  # the trailer section (RFC 9112 §7.1.2): read, bounded, dropped
        while line := self._line(self.limits.header_bytes, "trailer section"):
            trailers += len(line) + 2
            if trailers > self.limits.header_bytes:
                raise LimitError(f"the answer's trailer section is over the limit of {self.limits.header_bytes} "
                                 "bytes (MAX_HEADER_BYTES)")

    def body_until_close(self) -> Iterator[bytes]:
        while piece := self._take(_RECV_BYTES):
            yield piece


class Response:
    """An answer whose head has been read; the body is read by `read` (whole) or `readline` (streams)."""

    def __init__(self, conn: Connection, status: int, reason: str, headers: dict[str, str],
                 framing: tuple[str, int], keep: bool, stream: bool) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers  # lower-case names; repeated fields joined with ", "
        self._conn = conn
        self._keep = keep and not stream
        self._stream = stream
        self._framing = framing
        self._pending = bytearray()  # read from the body, not yet returned (readline)
        self._done = False
        self._body: Iterator[bytes] | None = None  # made on the first piece read (not for a buffered whole body)

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def _pieces(self) -> Iterator[bytes]:
        kind, length = self._framing
        if kind == "length":
            yield from self._conn.fixed_body(length)
        elif kind == "chunked":
            yield from self._conn.chunked_body()
        elif kind == "close":
            yield from self._conn.body_until_close()

    def _next(self) -> bytes:
        """The next piece of the body, b"" at its end (then the connection is released or closed)."""
        if self._done:
            return b""
        if self._body is None:
            self._body = self._pieces()
        try:
            piece = next(self._body, b"")
        except BaseException:
            self._done = True
            self._conn.close()  # part of the answer is unread or garbage: the connection cannot carry more
            raise
        if not piece:
            self._finish()
        return piece

    def _finish(self) -> None:
        self._done = True
        if self._keep:
            self._conn.idle = True
        else:
            self._conn.close()

    def read(self) -> bytes:
        """The whole (rest of the) body, at most the connection's body limit."""
        limit = self._conn.limits.body_bytes
        kind, length = self._framing
        if kind == "length" and length > limit:
            self.close()
            raise LimitError(f"the answer's Content-Length {length} is over the limit of {limit} bytes "
                             "(MAX_BODY_BYTES)")
        if kind == "length" and self._body is None and not self._done and self._conn.buffered() >= length:
            body = self._conn.take_buffered(length)  # the usual small answer: all in the first recv
            self._finish()
            return body
        parts, total = [bytes(self._pending)], len(self._pending)
        self._pending.clear()
        while piece := self._next():
            total += len(piece)
            if total > limit:
                self.close()
                raise LimitError(f"the answer's body is over the limit of {limit} bytes (MAX_BODY_BYTES)")
            parts.append(piece)
        return b"".join(parts)

    def readline(self) -> bytes:
        """The body up to and including the next LF (b"" at its end), a line at most the body limit."""
        limit = self._conn.limits.body_bytes
        start = 0  # searched already: a long line costs linear time, not quadratic
        while (end := self._pending.find(b"\n", start)) < 0 and len(self._pending) <= limit:
            start = len(self._pending)
            piece = self._next()
            if not piece:
                line = bytes(self._pending)
                self._pending.clear()
                return line
            self._pending += piece
        if end < 0 or end >= limit:
            self.close()
            raise LimitError(f"a line of the answer's body is over the limit of {limit} bytes (MAX_BODY_BYTES)")
        line = bytes(self._pending[:end + 1])
        del self._pending[:end + 1]
        return line

    def close(self) -> None:
        """Done with the answer: a connection with unread body (or a stream's own) is closed."""
        if not self._done or self._stream:
            self._done = True
            self._conn.close()


def _status_line(line: str) -> tuple[int, str, bool]:
    """(status, reason, whether HTTP/1.0) of `HTTP/1.x NNN reason` (RFC 9112 §4; the reason may be empty)."""
    version, _, rest = line.partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not (code.isascii() and code.isdigit()):
        raise ProtocolError(f"malformed status line {line[:200]!r}: expected 'HTTP/1.1 <3-digit status> <reason>'")
    return int(code), reason, version == "HTTP/1.0"


def _header_fields(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        # No whitespace in or around a name (RFC 9112 §5.1); a line starting with it is obsolete folding (§5.2).
        if not colon or not name or " " in name or "\t" in name:
            raise ProtocolError(f"malformed header field line {line[:200]!r}: expected 'name: value'")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _framing(method: str, status: int, headers: dict[str, str]) -> tuple[str, int]:
    """How the body is delimited (RFC 9112 §6.3): ("none"|"chunked"|"length"|"close", Content-Length)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status <= 199:
        return "none", 0
    encoding = headers.get("transfer-encoding")
    if encoding is not None:  # wins over a Content-Length
        if encoding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return "chunked", 0
        return "close", 0
    length = headers.get("content-length")
    if length is None:
        return "close", 0
    values = {v.strip() for v in length.split(",")}  # a repeated field with the same value is allowed (§6.3)
    if len(values) != 1 or not ((value := values.pop()).isascii() and value.isdigit()):
        raise ProtocolError(f"malformed Content-Length {length[:100]!r}: expected one decimal number")
    return "length", int(value)


def _keeps_alive(http10: bool, headers: dict[str, str]) -> bool:
    field = headers.get("connection")
    if field is None:
        return not http10
    tokens = {t.strip().lower() for t in field.split(",")}
    if "close" in tokens:
        return False
    return not http10 or "keep-alive" in tokens


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip(b" \t")
    if not size or not _HEX.issuperset(size):
        raise ProtocolError(f"malformed chunk size line {line[:100]!r}: expected hexadecimal digits")
    return int(size, 16)
