"""The daemon's API client: JSON over HTTPS to the API server on the standard library's http.client, and the claim
lookup of prepare.

What client-go gives a Go driver (docs/hardening.md §4): TLS from the kubeconfig or service account (kubeconfig.py)
with a token file re-read every TOKEN_RELOAD_SECONDS (kubelet rotates it); keep-alive connections (`_Connections`,
http.client's, at most POOL_SIZE kept idle), a request sent again only when that cannot do it twice (never a POST:
generateName creates); one
deadline over each whole request (deadline.py), so an answer that trickles in fails in time; a cap on each
answer's size, read incrementally (a watch's: per event); client-side QPS and burst (ratelimit.py). No redirects,
no Retry-After (a server could make the daemon sleep for an hour), no content coding (it could hide a size).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import shutil
import ssl
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

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


Connection = http.client.HTTPSConnection
Answer = http.client.HTTPResponse


class _Connections:
    """Kept-alive connections to one API server, shared by all threads: at most `size` kept idle (the last one
    returned is taken first); more at once are made as needed and closed when returned. A kept connection the
    server has closed (or sent anything on) while it was idle is dropped before a request is sent on it, as
    urllib3's pool does."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, size: int) -> None:
        self._host = host
        self._port = port
        self._context = context
        self._size = size
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return Connection(self._host, self._port, timeout=CONNECT_TIMEOUT, context=self._context)
            if conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()

    def give_back(self, conn: Connection) -> None:
        """`conn` after an answer read to its end (else close it instead)."""
        if conn.sock is not None:
            with self._lock:
                if not self._closed and len(self._idle) < self._size:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


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
        self._prefix = url.path.rstrip("/")
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
        self._bucket = TokenBucket(self.options.rate)
        self._token_lock = threading.Lock()
        self._token = config.token
        self._token_read = 0.0
        self._headers_by_auth: dict[tuple[str | None, str], dict[str, str]] = {}  # (auth, content type or "")

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

    def _headers(self, with_body: bool, content_type: str = JSON) -> dict[str, str]:
        """The request's header fields, made again only when the token changes (never mutated once made)."""
        try:
            auth = self._authorization()
        except OSError as e:
            raise ApiClientError(f"reading the token file {self.config.token_file}: {e}") from e
        key = (auth, content_type if with_body else "")
        headers = self._headers_by_auth.get(key)
        if headers is None:
            headers = {"Accept": "application/json", "User-Agent": "neuron-dra-driver"}
            if auth:
                headers["Authorization"] = auth
            if with_body:
                headers["Content-Type"] = content_type
            if any("\r" in v or "\n" in v for v in headers.values()):
                raise ApiClientError("refusing to send the request: a CR or LF in a header field (the token?) "
                                     "would change it")
            self._headers_by_auth = {key: headers, **{k: v for k, v in self._headers_by_auth.items()
                                                      if k[0] == auth}}
        return headers

    def _open(self, method: str, path: str, query: Mapping[str, Any] | None, body: Mapping[str, Any] | None,
              deadline: Deadline, content_type: str = JSON) -> tuple[Connection, Answer]:
        """The answer with its head read (the body not yet) and its connection; non-2xx raise ApiException."""
        target = self._prefix + (path if _PLAIN_PATH(path) else quote(path, safe=_PATH_SAFE))
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        if params:
            target += "?" + urlencode(params)
        payload = None if body is None else json.dumps(body).encode()
        headers = self._headers(payload is not None, content_type)
        try:
            self._bucket.acquire(deadline.at)
        except RateLimited as e:
            raise ApiClientError(f"{method} {path}: {e}") from e
        try:
            with applied(deadline):
                conn, resp = self._send(method, target, payload, headers, deadline)
        except DeadlineExceeded:
            raise self._deadline_error(method, path, deadline) from None
        except (http.client.HTTPException, OSError, ValueError) as e:
            raise ApiClientError(f"{method} {path}: {_cause(e)}") from e
        if 200 <= resp.status <= 299:
            return conn, resp
        if resp.status < 200:  # http.client skips only 100 Continue: another 1xx would desync the connection
            conn.close()
            raise ApiClientError(f"{method} {path}: an interim answer ({resp.status}) where the final one belongs")
        try:
            text = self._read(conn, resp, method, path, MAX_ERROR_BYTES, "MAX_ERROR_BYTES", deadline, cut=True)
        except ApiClientError:
            text = b""
        raise ApiException(status=resp.status, reason=resp.reason or "", body=text.decode("utf-8", "replace"))

    def _send(self, method: str, target: str, payload: bytes | None, headers: Mapping[str, str],
              deadline: Deadline) -> tuple[Connection, Answer]:
        """Send the request and read the answer's head, at most twice more: once after a connection that could
        not be made (nothing was sent), once after one that failed once sent, for an idempotent method only (RFC
        9110 §9.2.2; a kept connection the server has just closed). A TLS error or the deadline: never again."""
        connects, resends = 1, 1
        while True:
            conn = self._connections.take()
            try:
                if conn.sock is None:
                    conn.timeout = max(0.001, min(CONNECT_TIMEOUT, deadline.left()))  # the TCP connect's
                    try:
                        conn.connect()
                    except ssl.SSLError:
                        raise
                    except OSError:
                        if connects and deadline.left() > 0:
                            connects -= 1
                            conn.close()
                            continue
                        raise
                conn.request(method, target, body=payload, headers=headers)
                return conn, conn.getresponse()
            except DeadlineExceeded:
                conn.close()
                raise
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                if (resends and method in IDEMPOTENT and not isinstance(e, ssl.SSLError)
                        and deadline.left() > 0):
                    resends -= 1
                    continue
                raise

    def _deadline_error(self, method: str, path: str, deadline: Deadline) -> RequestDeadlineExceeded:
        return RequestDeadlineExceeded(f"{method} {path}: no complete answer within the request deadline of "
                                       f"{deadline.seconds:g} s (--kube-api-timeout); an answer that trickles in "
                                       "or never ends is cut off there")

    def _read(self, conn: Connection, resp: Answer, method: str, path: str, cap: int, cap_name: str,
              deadline: Deadline, cut: bool = False) -> bytes:
        """The whole body, at most `cap` bytes (`cut`: the first `cap` bytes of a longer one), read piece by piece
        within the deadline; the connection is kept only when the answer was read to its end."""
        done = False
        try:
            coding = (resp.getheader("content-encoding") or "identity").strip().lower()
            if coding != "identity":
                raise ApiClientError(f"{method} {path}: the answer has Content-Encoding {coding[:40]!r}, which "
                                     "this client never asks for")
            length = resp.getheader("content-length") or ""
            if length and resp.getheader("transfer-encoding") is not None:
                # RFC 9112 §6.3: a sender must not send both; which one frames the body is ambiguous (smuggling).
                raise ApiClientError(f"{method} {path}: the answer has both Content-Length and Transfer-Encoding; "
                                     "its framing is ambiguous, so it is refused")
            if length.isdigit() and int(length) > cap and not cut:
                raise AnswerTooLarge(f"{method} {path}: the answer's Content-Length {length} is over the limit of "
                                     f"{cap} bytes ({cap_name})")
            parts: list[bytes] = []
            total = 0
            with applied(deadline):
                # Piece by piece whatever the framing says (a declared length only refuses early): what is read
                # is what is counted.
                while piece := resp.read(READ_BYTES):
                    total += len(piece)
                    if total > cap:
                        if cut:
                            parts.append(piece[:cap - total + len(piece)])
                            return b"".join(parts)
                        raise AnswerTooLarge(f"{method} {path}: the answer is over the limit of {cap} bytes "
                                             f"({cap_name}); refused after reading {total} bytes")
                    parts.append(piece)
            if resp.length:  # http.client ends a read of a declared length cut short without an error
                raise ApiClientError(f"{method} {path}: reading the answer: IncompleteRead: {total} bytes read, "
                                     f"{resp.length} more expected")
            done = True
            return b"".join(parts)
        except DeadlineExceeded:
            raise self._deadline_error(method, path, deadline) from None
        except (http.client.HTTPException, OSError, ValueError) as e:
            raise ApiClientError(f"{method} {path}: reading the answer: {_cause(e)}") from e
        finally:
            if done:
                self._connections.give_back(conn)
            else:
                conn.close()

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, seconds: float | None = None, list_answer: bool = False,
                content_type: str = JSON) -> bytes:
        """The body of a 2xx answer (at most the object or list limit), else ApiException or ApiClientError.
        `content_type`: the body's (a PATCH names its kind of patch: MERGE_PATCH)."""
        deadline = Deadline.after(self.options.deadline if seconds is None else seconds)
        conn, resp = self._open(method, path, query, body, deadline, content_type)
        limits = self.options.limits
        cap, name = (limits.list_bytes, "MAX_LIST_BYTES") if list_answer else (limits.object_bytes,
                                                                                "MAX_OBJECT_BYTES")
        return self._read(conn, resp, method, path, cap, name, deadline)

    def stream(self, path: str, query: Mapping[str, Any], seconds: float, idle_seconds: float) -> Watch:
        """A GET whose answer is a stream of lines (a watch), over within `seconds`, each wait for data at most
        `idle_seconds`; each line at most the object limit."""
        deadline = Deadline.after(seconds, idle_seconds)
        conn, resp = self._open("GET", path, query, None, deadline)
        return Watch(conn, resp, path, deadline, self.options.limits.object_bytes,
                     self._deadline_error("GET", path, deadline))

    def close(self) -> None:
        """Close the kept connections (requests after this make and close their own)."""
        self._connections.close()


class Watch:
    """An open watch answer: its lines, read as they arrive."""

    def __init__(self, conn: Connection, resp: Answer, path: str, deadline: Deadline, line_bytes: int,
                 late: RequestDeadlineExceeded) -> None:
        self._conn = conn  # never kept: a watch ends when either side stops it
        self._resp = resp
        self._path = path
        self._deadline = deadline
        self._line_bytes = line_bytes
        self._late = late

    def _piece(self) -> bytes:
        try:
            with applied(self._deadline):
                return self._resp.read1(READ_BYTES)
        except DeadlineExceeded:
            raise self._late from None
        except (http.client.HTTPException, OSError, ValueError) as e:
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
        self._conn.close()


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
