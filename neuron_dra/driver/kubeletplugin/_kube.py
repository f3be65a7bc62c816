"""The daemon's API client: JSON over HTTPS to the API server, each answer parsed by httptools (llhttp, in C) as it
is read, and the claim lookup of prepare.

What client-go gives a Go driver (docs/hardening.md §4): TLS from the kubeconfig or service account (kubeconfig.py)
with a token file re-read every TOKEN_RELOAD_SECONDS (kubelet rotates it); keep-alive connections (`_Connections`,
at most POOL_SIZE kept idle), a request sent again only when that cannot do it twice (never a POST: generateName
creates); one deadline over each whole request (deadline.py), so an answer that trickles in fails in time; a cap on
each answer's head and size, read incrementally (a watch's: per event); client-side QPS and burst (ratelimit.py).
No redirects, no Retry-After (a server could make the daemon sleep for an hour), no content coding (it could hide a
size). The client writes only the request line and its header fields (RFC 9112 §3, §5); llhttp reads the answers.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httptools

from neuron_dra.driver.kubeletplugin._claimref import ClaimLookupError
from neuron_dra.driver.kubeletplugin._deadline import Deadline, DeadlineExceeded, DeadlineSSLSocket, applied
from neuron_dra.driver.kubeletplugin._kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    incluster_config,
    load_kubeconfig,
)
from neuron_dra.driver.kubeletplugin._ratelimit import Rate, RateLimited, TokenBucket

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"  # RFC 7386: what KubeApi.merge_patch sends
DEFAULT_DEADLINE = 10.0  # seconds for one request; kubelet gives a whole prepare 45 s
CONNECT_TIMEOUT = 3.0
TOKEN_RELOAD_SECONDS = 60.0
# One object (a ResourceClaim, a Node, a written slice): etcd stores at most 1.5 MiB per object by default and the
# API server takes request bodies of at most 3 MiB, so a real object's JSON stays well below this.
MAX_OBJECT_BYTES = 4 * 1024 * 1024
MAX_LIST_BYTES = 8 * 1024 * 1024  # this node's slices of this driver (a few, each at most one object)
MAX_ERROR_BYTES = 64 * 1024  # the body of a non-2xx answer, for its message
READ_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and header fields (the API server's: well under 1 KiB)
MAX_HEADER_FIELDS = 100  # as many as http.client allows
POOL_SIZE = 12  # connections kept idle: the claim lookups (8 workers), the publisher, its watch, health reporting
# RFC 9110 §9.2.2: sending one of these again has the same effect as sending it once.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_PLAIN_NAME = re.compile(r"[a-z0-9.-]+").fullmatch
# RFC 3986 §3.3: what a path may hold as it is (unreserved, sub-delims, ":", "@", "/", and "%" of an escape); any
# other character (a space, a CR or LF) is percent-encoded before the request line is written.
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/:@!$&'()*+,;=._~%-]*").fullmatch


class ApiException(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int | None = None, reason: str = "", body: str = "") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(f"({status}) {reason}: {body[:500]}" if body else f"({status}) {reason}")


class ApiClientError(Exception):
    """No usable answer: the connection failed, the deadline passed, the answer was too large or malformed."""


class RequestDeadlineExceeded(ApiClientError):
    pass


class AnswerTooLarge(ApiClientError):
    pass


@dataclass(frozen=True)
class Limits:
    """The most bytes read from one answer (a watch: from one event)."""

    object_bytes: int = MAX_OBJECT_BYTES
    list_bytes: int = MAX_LIST_BYTES


@dataclass(frozen=True)
class ClientOptions:
    rate: Rate = field(default_factory=Rate)
    deadline: float = DEFAULT_DEADLINE  # seconds, for every request but watches (which say their own)
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not 0.1 <= self.deadline <= 300:
            raise ValueError(f"API request deadline {self.deadline!r} s is not allowed: 0.1 to 300 seconds")


class _HttpError(Exception):
    """An answer that breaks HTTP/1.1 or one of the client's limits on its head or framing."""


class _Answer:
    """One answer read from `sock` as it arrives, parsed by llhttp (httptools: the parser of Node.js, in C): its
    head, then its body in pieces (`body`) as they are read. `100 Continue` answers before it are skipped; any
    other 1xx is kept in `interim` (the caller refuses it). The parser's callbacks only record: every check is
    the reader's, after each piece of at most READ_BYTES, so what is buffered stays bounded."""

    __slots__ = ("_parser", "body", "body_bytes", "close_delimited", "done", "extra", "fields", "head_bytes",
                 "head_done", "head_size", "headers", "interim", "keep_alive", "reason", "sock", "status")

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: dict[str, str] = {}  # lower-case names; a repeated field's values joined by ", "
        self.fields = 0  # header fields of the answer being read
        self.head_size = 0  # the bytes of its reason and fields
        self.head_bytes = 0  # bytes read that did not complete the final answer's head
        self.head_done = False
        self.interim = 0
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.done = False
        self.extra = False  # bytes after the answer: the connection is not reused
        self.close_delimited = False  # neither a length nor chunks: the body ends when the server closes
        self.keep_alive = False

    # llhttp's callbacks
    def on_message_begin(self) -> None:
        if self.done:  # what follows is not this answer: the parser's callbacks for it are ignored
            self.extra = True
            return
        self.reason, self.headers, self.fields, self.head_size = b"", {}, 0, 0

    def on_status(self, data: bytes) -> None:
        if self.extra:
            return
        self.reason += data
        self.head_size += len(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.extra:
            return
        self.fields += 1
        self.head_size += len(name) + len(value)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        if self.extra:
            return
        status = self._parser.get_status_code()
        if status < 200:
            if status != 100 and not self.interim:
                self.interim = status
            return
        self.status, self.head_done = status, True
        self.keep_alive = self._parser.should_keep_alive()
        self.close_delimited = ("content-length" not in self.headers and "transfer-encoding" not in self.headers
                                and status not in (204, 304))

    def on_body(self, data: bytes) -> None:
        if self.extra:
            return
        self.body.append(data)
        self.body_bytes += len(data)

    def on_message_complete(self) -> None:
        if self.head_done and not self.extra:
            self.done = True

    def feed(self) -> bool:
        """Read once (at most READ_BYTES) and parse what came; False when the server has closed the connection."""
        data = self.sock.recv(READ_BYTES)
        if not data:
            return False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.done:
                raise
            self.extra = True  # what follows a complete answer is not parsed: the connection is closed
        except httptools.HttpParserUpgrade as e:  # llhttp stops at a 101 or CONNECT answer: not HTTP after it
            raise _HttpError("the answer switches protocols (101), which this client never asks for") from e
        if not self.head_done:  # all of it was head: what the parser holds of an unfinished head stays bounded
            self.head_bytes += len(data)
        return True

    def read_head(self) -> None:
        """Read until the final answer's head is complete (it may hold the body's first pieces)."""
        while True:
            if self.fields > MAX_HEADER_FIELDS:
                raise _HttpError(f"the answer has more than {MAX_HEADER_FIELDS} header fields")
            if max(self.head_bytes, self.head_size) > MAX_HEAD_BYTES:
                raise _HttpError(f"the answer's head is over {MAX_HEAD_BYTES} bytes (a header line too long?)")
            if self.head_done or self.interim:
                return
            if not self.feed():
                raise ConnectionAbortedError("the API server closed the connection " + (
                    "before answering" if self.head_bytes == 0 else "in the middle of the answer's head"))

    def read_more(self) -> bool:
        """Read the body on: False once it is over (its end parsed, or the close that ends it)."""
        if self.done:
            return False
        if self.feed():
            return True
        if self.close_delimited:
            self.done = True
            return False
        length = self.headers.get("content-length", "")
        more = f", {int(length) - self.body_bytes} more expected" if length.isdigit() else ""
        raise _HttpError(f"IncompleteRead: the connection closed after {self.body_bytes} bytes of the body{more}")

    def take(self) -> bytes:
        """The body read so far and not yet taken."""
        data = b"".join(self.body)
        self.body.clear()
        return data

    def reusable(self) -> bool:
        """Read to its end, nothing after it, and the connection kept open (llhttp: HTTP/1.1 without
        `Connection: close`, a body not ended by the close)."""
        return self.done and self.keep_alive and not self.extra


class _Connections:
    """Kept-alive TLS connections to one API server, shared by all threads: at most `size` kept idle (the last one
    returned is taken first); more at once are made as needed and closed when returned. A kept connection the
    server has closed (or sent anything on) while it was idle is dropped before a request is sent on it, as
    urllib3's pool does."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, size: int) -> None:
        self._host = host
        self._port = port
        self._context = context
        self._size = size
        self._idle: list[ssl.SSLSocket] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> ssl.SSLSocket | None:
        """A kept connection, or None: the caller connects (`connect`)."""
        while True:
            with self._lock:
                sock = self._idle.pop() if self._idle else None
            if sock is None or not _readable(sock):
                return sock
            sock.close()

    def connect(self, deadline: Deadline) -> ssl.SSLSocket:
        """A new connection, its TCP connect within CONNECT_TIMEOUT and the deadline, its TLS handshake within the
        deadline (applied by the caller)."""
        raw = socket.create_connection((self._host, self._port), max(0.001, min(CONNECT_TIMEOUT, deadline.left())))
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one write: send it at once
            return self._context.wrap_socket(raw, server_hostname=self._host)
        except BaseException:
            raw.close()
            raise

    def give_back(self, sock: ssl.SSLSocket) -> None:
        """`sock` after an answer read to its end (else close it instead)."""
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _readable(sock: Any) -> bool:
    """Has the peer closed `sock` or sent anything on it (without waiting)? Either way it is not reused."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class ApiClient:
    """HTTPS to one API server on kept-alive connections (`_Connections`) shared by all threads."""

    def __init__(self, config: ClusterConfig, options: ClientOptions | None = None) -> None:
        self.config = config
        self.options = options or ClientOptions()
        url = urlsplit(config.server)
        if url.scheme != "https" or not url.hostname:
            raise KubeConfigError(f"API server {config.server!r} is not allowed: an https:// URL is required")
        self._prefix = quote(url.path.rstrip("/"), safe=_PATH_SAFE)  # request lines are ASCII
        try:
            ctx = ssl.create_default_context(cafile=config.ca_file)
            if config.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if config.cert_file:
                ctx.load_cert_chain(config.cert_file, config.key_file)
        except (OSError, ssl.SSLError) as e:
            raise KubeConfigError(f"TLS settings for {config.server}: {e}") from e
        ctx.sslsocket_class = DeadlineSSLSocket
        self._connections = _Connections(url.hostname, url.port or 443, ctx, POOL_SIZE)
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname  # RFC 9110 §7.2: an IPv6 literal
        self._host = host if url.port in (None, 443) else f"{host}:{url.port}"
        self._bucket = TokenBucket(self.options.rate)
        self._token_lock = threading.Lock()
        self._token = config.token
        self._token_read = 0.0
        self._heads: dict[tuple[str | None, str], bytes] = {}  # (auth, content type or ""): the header block

    def _authorization(self) -> str | None:
        if self.config.token_file:
            with self._token_lock:
                now = time.monotonic()
                if self._token is None or now - self._token_read >= TOKEN_RELOAD_SECONDS:
                    try:
                        self._token = Path(self.config.token_file).read_text().strip()
                    except OSError:
                        if self._token is None:
                            raise
                    self._token_read = now
        return f"Bearer {self._token}" if self._token else None

    def _header_block(self, with_body: bool, content_type: str = JSON) -> bytes:
        """The request's header fields after its request line (all but Content-Length), encoded; made again only
        when the token changes."""
        try:
            auth = self._authorization()
        except OSError as e:
            raise ApiClientError(f"reading the token file {self.config.token_file}: {e}") from e
        key = (auth, content_type if with_body else "")
        block = self._heads.get(key)
        if block is None:
            headers = {"Host": self._host, "Accept": JSON, "Accept-Encoding": "identity",
                       "User-Agent": "neuron-dra-driver"}
            if auth:
                headers["Authorization"] = auth
            if with_body:
                headers["Content-Type"] = content_type
            if any("\r" in v or "\n" in v for v in headers.values()):
                raise ApiClientError("refusing to send the request: a CR or LF in a header field (the token?) "
                                     "would change it")
            try:
                block = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
            except UnicodeEncodeError as e:
                raise ApiClientError("refusing to send the request: a header field (the token?) holds a character "
                                     "HTTP/1.1 cannot carry") from e
            self._heads = {key: block, **{k: v for k, v in self._heads.items() if k[0] == auth}}
        return block

    def _open(self, method: str, path: str, query: Mapping[str, Any] | None, body: Mapping[str, Any] | None,
              deadline: Deadline, content_type: str = JSON) -> tuple[ssl.SSLSocket, _Answer]:
        """The answer with its head read (the body perhaps begun) and its connection; non-2xx raise ApiException."""
        target = self._prefix + (path if _PLAIN_PATH(path) else quote(path, safe=_PATH_SAFE))
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        if params:
            target += "?" + urlencode(params)
        payload = None if body is None else json.dumps(body).encode()
        # RFC 9112 §3 and §5: the request line, the header fields, Content-Length for a body; the target holds
        # only what RFC 3986 allows (quoted above) and no field a CR or LF (_header_block).
        request = b"%s %s HTTP/1.1\r\n%s" % (method.encode("ascii"), target.encode("ascii"),
                                              self._header_block(payload is not None, content_type))
        request += b"\r\n" if payload is None else b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        try:
            self._bucket.acquire(deadline.at)
        except RateLimited as e:
            raise ApiClientError(f"{method} {path}: {e}") from e
        try:
            with applied(deadline):
                sock, resp = self._send(method, request, deadline)
        except DeadlineExceeded:
            raise self._deadline_error(method, path, deadline) from None
        except (_HttpError, httptools.HttpParserError, OSError, ValueError) as e:
            raise ApiClientError(f"{method} {path}: {_cause(e)}") from e
        if 200 <= resp.status <= 299:
            return sock, resp
        try:
            text = self._read(sock, resp, method, path, MAX_ERROR_BYTES, "MAX_ERROR_BYTES", deadline, cut=True)
        except ApiClientError:
            text = b""
        raise ApiException(status=resp.status, reason=resp.reason.decode("latin-1"),
                           body=text.decode("utf-8", "replace"))

    def _send(self, method: str, request: bytes, deadline: Deadline) -> tuple[ssl.SSLSocket, _Answer]:
        """Send the request and read the answer's head, at most twice more: once after a connection that could
        not be made (nothing was sent), once after one that failed once sent, for an idempotent method only (RFC
        9110 §9.2.2; a kept connection the server has just closed). A TLS error, a malformed answer or the
        deadline: never again."""
        connects, resends = 1, 1
        while True:
            sock = self._connections.take()
            try:
                if sock is None:
                    try:
                        sock = self._connections.connect(deadline)
                    except ssl.SSLError:
                        raise
                    except OSError:
                        if connects and deadline.left() > 0:
                            connects -= 1
                            continue
                        raise
                sock.sendall(request)
                resp = _Answer(sock)
                resp.read_head()
            except BaseException as e:
                if sock is not None:
                    sock.close()
                if (isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and resends and method in IDEMPOTENT
                        and deadline.left() > 0):
                    resends -= 1
                    continue
                raise
            if resp.interim:  # only 100 Continue is skipped: another 1xx answer is not the answer
                sock.close()
                raise _HttpError(f"an interim answer ({resp.interim}) where the final one belongs")
            return sock, resp

    def _deadline_error(self, method: str, path: str, deadline: Deadline) -> RequestDeadlineExceeded:
        return RequestDeadlineExceeded(f"{method} {path}: no complete answer within the request deadline of "
                                       f"{deadline.seconds:g} s (--kube-api-timeout); an answer that trickles in "
                                       "or never ends is cut off there")

    def _read(self, sock: ssl.SSLSocket, resp: _Answer, method: str, path: str, cap: int, cap_name: str,
              deadline: Deadline, cut: bool = False) -> bytes:
        """The whole body, at most `cap` bytes (`cut`: the first `cap` bytes of a longer one), read piece by piece
        within the deadline; the connection is kept only when the answer was read to its end."""
        keep = False
        try:
            coding = resp.headers.get("content-encoding", "identity").strip().lower()
            if coding != "identity":
                raise ApiClientError(f"{method} {path}: the answer has Content-Encoding {coding[:40]!r}, which "
                                     "this client never asks for")
            length = resp.headers.get("content-length", "")
            if length.isdigit() and int(length) > cap and not cut:
                raise AnswerTooLarge(f"{method} {path}: the answer's Content-Length {length} is over the limit of "
                                     f"{cap} bytes ({cap_name})")
            with applied(deadline):
                # Piece by piece whatever the framing says (a declared length only refuses early): what is read
                # is what is counted.
                while True:
                    if resp.body_bytes > cap:
                        if cut:
                            return resp.take()[:cap]
                        raise AnswerTooLarge(f"{method} {path}: the answer is over the limit of {cap} bytes "
                                             f"({cap_name}); refused after reading {resp.body_bytes} bytes")
                    if not resp.read_more():
                        break
            keep = resp.reusable()
            return resp.take()
        except DeadlineExceeded:
            raise self._deadline_error(method, path, deadline) from None
        except (_HttpError, httptools.HttpParserError, OSError, ValueError) as e:
            raise ApiClientError(f"{method} {path}: reading the answer: {_cause(e)}") from e
        finally:
            if keep:
                self._connections.give_back(sock)
            else:
                sock.close()

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, seconds: float | None = None, list_answer: bool = False,
                content_type: str = JSON) -> bytes:
        """The body of a 2xx answer (at most the object or list limit), else ApiException or ApiClientError.
        `content_type`: the body's (a PATCH names its kind of patch: MERGE_PATCH)."""
        deadline = Deadline.after(self.options.deadline if seconds is None else seconds)
        sock, resp = self._open(method, path, query, body, deadline, content_type)
        limits = self.options.limits
        cap, name = (limits.list_bytes, "MAX_LIST_BYTES") if list_answer else (limits.object_bytes,
                                                                                "MAX_OBJECT_BYTES")
        return self._read(sock, resp, method, path, cap, name, deadline)

    def stream(self, path: str, query: Mapping[str, Any], seconds: float, idle_seconds: float) -> Watch:
        """A GET whose answer is a stream of lines (a watch), over within `seconds`, each wait for data at most
        `idle_seconds`; each line at most the object limit."""
        deadline = Deadline.after(seconds, idle_seconds)
        sock, resp = self._open("GET", path, query, None, deadline)
        return Watch(sock, resp, path, deadline, self.options.limits.object_bytes,
                     self._deadline_error("GET", path, deadline))

    def close(self) -> None:
        """Close the kept connections (requests after this make and close their own)."""
        self._connections.close()


class Watch:
    """An open watch answer: its lines, read as they arrive."""

    def __init__(self, sock: ssl.SSLSocket, resp: _Answer, path: str, deadline: Deadline, line_bytes: int,
                 late: RequestDeadlineExceeded) -> None:
        self._sock = sock  # never kept: a watch ends when either side stops it
        self._resp = resp
        self._path = path
        self._deadline = deadline
        self._line_bytes = line_bytes
        self._late = late

    def _piece(self) -> bytes:
        """What the answer's body holds next (at most one read's worth); b"" at its end."""
        try:
            with applied(self._deadline):
                while not self._resp.body and self._resp.read_more():
                    pass
                return self._resp.take()
        except DeadlineExceeded:
            raise self._late from None
        except (_HttpError, httptools.HttpParserError, OSError, ValueError) as e:
            raise ApiClientError(f"GET {self._path} (watch): {_cause(e)}") from e

    def lines(self) -> Iterator[bytes]:
        """Each line without its LF, until the server ends the answer."""
        pending = bytearray()
        start = 0  # searched already: a long line costs linear time, not quadratic
        while True:
            end = pending.find(b"\n", start)
            if end > self._line_bytes or (end < 0 and len(pending) > self._line_bytes):
                raise AnswerTooLarge(f"GET {self._path} (watch): an event is over the limit of {self._line_bytes} "
                                     "bytes (MAX_OBJECT_BYTES)")
            if end >= 0:
                line = bytes(pending[:end])
                del pending[:end + 1]
                start = 0
                yield line
                continue
            start = len(pending)
            piece = self._piece()
            if not piece:
                if pending:
                    yield bytes(pending)
                return
            pending += piece

    def close(self) -> None:
        self._sock.close()


def _cause(e: BaseException) -> str:
    """What went wrong: the error's type and the start of its text."""
    return f"{type(e).__name__}: {str(e)[:300]}"


def api_client(kubeconfig: str | None, options: ClientOptions | None = None,
               env: Mapping[str, str] | None = None) -> ApiClient:
    """A client from a kubeconfig file, or the in-cluster service account when `kubeconfig` is None."""
    config = load_kubeconfig(kubeconfig) if kubeconfig else incluster_config(os.environ if env is None else env)
    try:
        return ApiClient(config, options)  # the TLS context has read the certificate files
    finally:
        if config.temp_dir:
            shutil.rmtree(config.temp_dir, ignore_errors=True)


def _from_kubernetes(api: Any) -> ApiClient:
    """An ApiClient with the settings of a `kubernetes.client.ApiClient` (tests and tools hand those in)."""
    cfg = api.configuration
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token and token.startswith("Bearer "):
        token = token[len("Bearer "):]
    return ApiClient(ClusterConfig(server=cfg.host, ca_file=cfg.ssl_ca_cert, cert_file=cfg.cert_file,
                                   key_file=cfg.key_file, token=token or None, insecure=not cfg.verify_ssl))


def _json_object(data: bytes, method: str, path: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ApiClientError(f"{method} {path}: the answer is not JSON: {str(e)[:300]}") from e
    except RecursionError as e:  # nested past the recursion limit: no object of the API is (issue 42 item 2)
        raise ApiClientError(f"{method} {path}: the answer is nested too deeply to be an API object") from e
    if not isinstance(doc, dict):
        raise ApiClientError(f"{method} {path}: expected a JSON object from the API server, got "
                             f"{type(doc).__name__}")
    return doc


class KubeApi:
    """JSON requests to the API server; a non-2xx answer raises ApiException (with .status), a failed request
    ApiClientError. Every call goes through `request`."""

    def __init__(self, api: ApiClient | Any) -> None:
        self._api = api if isinstance(api, ApiClient) else _from_kubernetes(api)

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, seconds: float | None = None, list_answer: bool = False,
                watch: tuple[float, float] | None = None, content_type: str = JSON) -> dict[str, Any] | Watch:
        """A JSON object, or for `watch` (seconds, idle seconds) the open Watch; `content_type`: the body's."""
        if watch is not None:
            return self._api.stream(path, query or {}, *watch)
        data = self._api.request(method, path, query=query, body=body, seconds=seconds, list_answer=list_answer,
                                 content_type=content_type)
        return _json_object(data, method, path)

    def call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
             body: Mapping[str, Any] | None = None, seconds: float | None = None) -> dict[str, Any]:
        doc = self.request(method, path, query=query, body=body, seconds=seconds)
        assert isinstance(doc, dict)
        return doc

    def merge_patch(self, path: str, body: Mapping[str, Any], seconds: float | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of the object at `path`: only the fields `body` names change, a null
        removes one."""
        doc = self.request("PATCH", path, body=body, seconds=seconds, content_type=MERGE_PATCH)
        assert isinstance(doc, dict)
        return doc

    def list(self, path: str, query: Mapping[str, Any] | None = None, seconds: float | None = None) -> dict[str, Any]:
        doc = self.request("GET", path, query=query, seconds=seconds, list_answer=True)
        assert isinstance(doc, dict)
        return doc

    def watch(self, path: str, query: Mapping[str, Any], seconds: float,
              idle_seconds: float) -> Generator[dict[str, Any], None, None]:
        """Watch events ({"type", "object"}) until the server ends the watch or `seconds` pass."""
        stream = self.request("GET", path, query={**query, "watch": "true"}, watch=(seconds, idle_seconds))
        assert isinstance(stream, Watch)
        try:
            for line in stream.lines():
                if line.strip():
                    try:
                        event = json.loads(line)
                    except ValueError as e:
                        raise ApiClientError(f"GET {path} (watch): an event that is not JSON: {str(e)[:300]}") from e
                    except RecursionError as e:
                        raise ApiClientError(f"GET {path} (watch): an event nested too deeply to be an API "
                                             "object") from e
                    if not isinstance(event, dict):
                        raise ApiClientError(f"GET {path} (watch): an event that is not a JSON object")
                    yield event
        finally:
            stream.close()


def _segment(name: str) -> str:
    """`name` as one path segment: object names are DNS labels or subdomains, which need no quoting (quote costs
    a few microseconds per call, on every prepare); anything else is quoted."""
    return name if _PLAIN_NAME(name) else quote(name, safe="")


class KubeClaimLookup:
    """GET resource.k8s.io/v1 ResourceClaims (RBAC: resourceclaims get)."""

    def __init__(self, api: ApiClient | Any, seconds: float | None = None) -> None:
        self._api = KubeApi(api)
        self._seconds = seconds

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{_segment(namespace)}/resourceclaims/{_segment(name)}"
        try:
            return self._api.call("GET", path, seconds=self._seconds)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e.status} {e.reason}") from e
        except ApiClientError as e:
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e}") from e
