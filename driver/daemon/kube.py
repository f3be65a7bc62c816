"""The API server side of the driver: connection settings, the few REST calls it makes, and the claim lookup.

A small JSON-over-HTTPS client on the standard library (ssl, socket) instead of the `kubernetes` package:
that package's import alone costs 17-19 MiB of resident memory and, on a loaded node, seconds of start-up, for
six REST calls. What it would have provided and the daemon needs is here: the kubeconfig (server, CA, client
certificate, bearer token or token file; no exec or auth-provider plugins) and the in-cluster service account
(KUBERNETES_SERVICE_HOST/PORT, the projected token re-read every minute as client-go does, since kubelet rotates
it), one keep-alive connection per thread. HTTP/1.1 itself is driver/daemon/http1.py (not http.client, which costs a
claim GET ~0.2 ms more: see there), for plain requests and watches alike (a watch is a chunked answer read line by
line on a connection of its own). A kept connection the server closed while idle is replaced before the request
goes out; one found closed only after the request was sent (before any byte of the answer) is retried once on a
new connection for idempotent methods, never for POST (a create by generateName would run twice).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from neuron_dra.driver.daemon import http1
from neuron_dra.driver.daemon.claims import ClaimLookupError

# (connect, read) seconds: kubelet gives prepare 45 s; a claim GET must fail well before that.
DEFAULT_TIMEOUT = (3.0, 10.0)
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_PLAIN_NAME = re.compile(r"[a-z0-9.-]+").fullmatch
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_RELOAD_SECONDS = 60.0
Timeout = float | tuple[float, float]


class KubeConfigError(RuntimeError):
    pass


class ApiException(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int | None = None, reason: str = "", body: str = "") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(f"({status}) {reason}: {body[:500]}" if body else f"({status}) {reason}")


@dataclass(frozen=True)
class ClusterConfig:
    """Where the API server is and how to authenticate: what the kubeconfig or the service account says."""

    server: str  # https://host:port
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None  # re-read every TOKEN_RELOAD_SECONDS (rotated projected tokens)
    insecure: bool = False
    temp_dir: str | None = None  # inline kubeconfig data written out for ssl; removed once the client holds it


def _kubeconfig_file(data: str, directory: Path, name: str) -> str:
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return str(path)


def _parse_kubeconfig(text: str) -> Any:
    """JSON (a kubeconfig may be JSON, as client-go reads it) without importing yaml; YAML otherwise. Only with
    --kubeconfig (tests, local clusters): in-cluster start-up parses nothing."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML: {e}") from None


def load_kubeconfig(path: str) -> ClusterConfig:
    """The current context's cluster and user of a kubeconfig file (inline `*-data` fields are written to a
    private temporary directory, since ssl loads certificates from files; `api_client` removes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        doc = _parse_kubeconfig(text)
        by_name = {kind: {e["name"]: e[kind[:-1]] for e in doc.get(kind) or ()} for kind in
                   ("clusters", "users", "contexts")}
        context = by_name["contexts"][doc["current-context"]]
        cluster = by_name["clusters"][context["cluster"]]
        user = by_name["users"].get(context.get("user"), {}) or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KubeConfigError(f"cannot load kubeconfig {path}: {e!r}") from None
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(f"kubeconfig {path}: user credentials by exec or auth-provider plugins are not "
                              "supported; use a client certificate or a token")
    base = Path(path).resolve().parent
    directory = Path(tempfile.mkdtemp(prefix="neuron-dra-kubeconfig-"))

    def file_of(key: str, name: str, section: Mapping[str, Any]) -> str | None:
        if section.get(f"{key}-data"):
            return _kubeconfig_file(section[f"{key}-data"], directory, name)
        value = section.get(key)
        return str(base / value) if value else None

    server = str(cluster.get("server", ""))
    if not server.startswith("https://"):
        raise KubeConfigError(f"kubeconfig {path}: server {server!r} is not allowed: an https:// URL is required")
    return ClusterConfig(server=server, ca_file=file_of("certificate-authority", "ca.crt", cluster),
                         cert_file=file_of("client-certificate", "client.crt", user),
                         key_file=file_of("client-key", "client.key", user), token=user.get("token"),
                         token_file=str(base / user["tokenFile"]) if user.get("tokenFile") else None,
                         insecure=bool(cluster.get("insecure-skip-tls-verify")), temp_dir=str(directory))


def incluster_config(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError("cannot load in-cluster config (no --kubeconfig given): KUBERNETES_SERVICE_HOST and "
                              "KUBERNETES_SERVICE_PORT are not set (not running in a pod?)")
    for name in ("token", "ca.crt"):
        if not (account / name).is_file():
            raise KubeConfigError(f"cannot load in-cluster config: {account / name} does not exist "
                                  "(is the service account token mounted?)")
    host = f"[{host}]" if ":" in host else host
    return ClusterConfig(server=f"https://{host}:{port}", ca_file=str(account / "ca.crt"),
                         token_file=str(account / "token"))


class ApiClient:
    """HTTPS to one API server: a keep-alive connection per thread, bearer token or client certificate."""

    def __init__(self, config: ClusterConfig, limits: http1.Limits = http1.DEFAULT_LIMITS) -> None:
        self.config = config
        url = urlsplit(config.server)
        if url.scheme != "https" or not url.hostname:
            raise KubeConfigError(f"API server {config.server!r} is not allowed: an https:// URL is required")
        self._host = url.hostname
        self._port = url.port or 443
        self._prefix = url.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host  # an IPv6 literal in brackets (RFC 3986)
        self._host_field = host if self._port == 443 else f"{host}:{self._port}"
        self._limits = limits
        try:
            ctx = ssl.create_default_context(cafile=config.ca_file)
            if config.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if config.cert_file:
                ctx.load_cert_chain(config.cert_file, config.key_file)
        except (OSError, ssl.SSLError) as e:
            raise KubeConfigError(f"TLS settings for {config.server}: {e}") from None
        self._ssl = ctx
        self._local = threading.local()
        self._token_lock = threading.Lock()
        self._token = config.token
        self._token_read = 0.0
        # (authorization, with a body) -> header block; replaced as a whole (threads share it, never mutate it)
        self._header_blocks: dict[tuple[str | None, bool], str] = {}

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

    def connection(self, timeout: Timeout) -> http1.Connection:
        connect, read = _timeouts(timeout)
        return http1.connect(self._host, self._port, self._ssl, connect, read, self._limits)

    def _headers(self, with_body: bool) -> str:
        """The header block of a request (http1.header_block), made again only when the token changes."""
        auth = self._authorization()
        key = (auth, with_body)
        block = self._header_blocks.get(key)
        if block is None:
            fields = [("Accept", "application/json"), ("User-Agent", "neuron-dra-driver")]
            if auth:
                fields.append(("Authorization", auth))
            if with_body:
                fields.append(("Content-Type", "application/json"))
            block = http1.header_block(self._host_field, fields)
            self._header_blocks = {key: block, **{k: v for k, v in self._header_blocks.items() if k[0] == auth}}
        return block

    def _request_bytes(self, method: str, path: str, query: Mapping[str, Any] | None,
                       body: Mapping[str, Any] | None) -> bytes:
        target = self._prefix + path
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        if params:
            target += "?" + urlencode(params)
        payload = None if body is None else json.dumps(body).encode()
        return http1.request_bytes(method, target, self._headers(payload is not None), payload)

    def _kept(self, read_timeout: float) -> http1.Connection | None:
        """This thread's kept connection if it can carry a request (see http1.Connection.reusable)."""
        conn: http1.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            return None
        if conn.reusable():
            conn.settimeout(read_timeout)
            return conn
        conn.close()
        self._local.conn = None
        return None

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, timeout: Timeout = DEFAULT_TIMEOUT,
                stream: bool = False) -> http1.Response:
        """The response (body not yet read) of a 2xx answer, else ApiException. `stream`: on a connection of its
        own, closed by the caller (watches)."""
        data = self._request_bytes(method, path, query, body)
        for attempt in (0, 1):
            kept = None if stream else self._kept(_timeouts(timeout)[1])
            conn = kept or self.connection(timeout)
            if not stream:
                self._local.conn = conn
            try:
                resp = conn.exchange(data, method, stream=stream)
            except http1.ClosedBeforeAnswer:
                # A kept connection the server closed as the request went out (its idle timeout): send it
                # again on a new one, unless repeating it could do it twice (a POST creating an object).
                if kept is not None and attempt == 0 and method in http1.IDEMPOTENT:
                    continue
                raise
            if not 200 <= resp.status <= 299:
                text = resp.read().decode("utf-8", "replace")
                resp.close()
                raise ApiException(status=resp.status, reason=resp.reason, body=text[:2000])
            return resp
        raise AssertionError("unreachable")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _timeouts(timeout: Timeout) -> tuple[float, float]:
    """(connect, read) seconds."""
    return timeout if isinstance(timeout, tuple) else (timeout, timeout)


def api_client(kubeconfig: str | None, env: Mapping[str, str] | None = None) -> ApiClient:
    """A client from a kubeconfig file, or the in-cluster service account when `kubeconfig` is None."""
    config = load_kubeconfig(kubeconfig) if kubeconfig else incluster_config(os.environ if env is None else env)
    try:
        return ApiClient(config)  # the TLS context has read the certificate files
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


def read_json(resp: http1.Response) -> dict[str, Any]:
    data = json.loads(resp.read())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object from the API server, got {type(data).__name__}")
    return data


class KubeApi:
    """JSON requests to the API server; a non-2xx answer raises ApiException (with .status)."""

    def __init__(self, api: ApiClient | Any) -> None:
        self._api = api if isinstance(api, ApiClient) else _from_kubernetes(api)

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, timeout: Timeout = DEFAULT_TIMEOUT,
                stream: bool = False) -> http1.Response:
        """The response (not yet read), for streaming; see `call` for JSON."""
        return self._api.request(method, path, query=query, body=body, timeout=timeout, stream=stream)

    def call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
             body: Mapping[str, Any] | None = None, timeout: Timeout = DEFAULT_TIMEOUT) -> dict[str, Any]:
        return read_json(self.request(method, path, query=query, body=body, timeout=timeout))

    def watch(self, path: str, query: Mapping[str, Any], timeout: Timeout) -> Generator[dict[str, Any], None, None]:
        """Watch events ({"type", "object"}) until the server ends the watch."""
        resp = self.request("GET", path, query={**query, "watch": "true"}, timeout=timeout, stream=True)
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.close()


def _segment(name: str) -> str:
    """`name` as one path segment: object names are DNS labels or subdomains, which need no quoting (quote costs
    a few microseconds per call, on every prepare); anything else is quoted."""
    return name if _PLAIN_NAME(name) else quote(name, safe="")


class KubeClaimLookup:
    """GET resource.k8s.io/v1 ResourceClaims (RBAC: resourceclaims get)."""

    def __init__(self, api: ApiClient | Any, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self._api = KubeApi(api)
        self._timeout = timeout

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{_segment(namespace)}/resourceclaims/{_segment(name)}"
        try:
            return self._api.call("GET", path, timeout=self._timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e.status} {e.reason}") from None
        except (http1.HttpError, OSError, ValueError) as e:
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e!r}") from None
