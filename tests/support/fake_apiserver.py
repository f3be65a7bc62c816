"""A scripted HTTPS server on loopback for the API client's tests: the standard library's http.server reads each
request, and a script per test writes the answer's bytes as it likes (well-formed, malformed, trickling, endless),
so the client is exercised on the wire. A PKI from a throwaway CA; the client must present its certificate."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra.driver.kubeletplugin._kube import ApiClient, ClientOptions
from neuron_dra.driver.kubeletplugin._kubeconfig import ClusterConfig
from neuron_dra.localcluster.controlplane.pki import issue, make_ca


@dataclass(frozen=True)
class Seen:
    """A request as the server read it."""

    conn: int  # which accepted connection (0, 1, ...)
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class Reply:
    """What a script writes to: the raw socket file of the request's connection."""

    def __init__(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self._handler = handler

    def write(self, data: bytes) -> None:
        self._handler.wfile.write(data)
        self._handler.wfile.flush()

    def drip(self, data: bytes, every: float, stop: threading.Event) -> None:
        """`data` one byte at a time, `every` seconds apart, until the client goes away or `stop`."""
        for i in range(len(data)):
            if stop.wait(every):
                return
            try:
                self.write(data[i:i + 1])
            except OSError:
                return


# A script answers one request: writes to the reply and returns whether to keep the connection open.
Script = Callable[[Seen, Reply], bool]


def ok(body: bytes = b'{"kind":"Status"}', extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def ok_json(doc: Any) -> bytes:
    return ok(json.dumps(doc).encode())


def chunked(pieces: list[bytes], status: str = "200 OK", trailer: bytes = b"") -> bytes:
    out = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    for p in pieces:
        out += f"{len(p):x}".encode() + b"\r\n" + p + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


def answer_json(doc: Any) -> Script:
    """A 200 with `doc` to every request."""
    return answer(ok_json(doc))


def answer(data: bytes, keep: bool = True) -> Script:
    def script(seen: Seen, reply: Reply) -> bool:
        reply.write(data)
        return keep

    return script


@dataclass
class FakeApiServer:
    tls: ssl.SSLContext
    pki: dict[str, Path]
    script: Script = field(default=answer(ok()))
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    stop: threading.Event = field(default_factory=threading.Event)  # ends dripping scripts
    _conns: dict[tuple[str, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    def conn_index(self, address: tuple[str, int]) -> int:
        with self._lock:
            return self._conns.setdefault(address, len(self._conns))

    def client(self, token: str | None = "t0k", options: ClientOptions | None = None, **config: Any) -> ApiClient:
        cfg = ClusterConfig(server=self.url, ca_file=str(self.pki["ca"]), cert_file=str(self.pki["client.crt"]),
                            key_file=str(self.pki["client.key"]), token=token, **config)
        return ApiClient(cfg, options)

    def kubeconfig(self, path: Path) -> Path:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
               "clusters": [{"name": "k", "cluster": {"server": self.url,
                                                      "certificate-authority": str(self.pki["ca"])}}],
               "users": [{"name": "u", "user": {"client-certificate": str(self.pki["client.crt"]),
                                                "client-key": str(self.pki["client.key"])}}],
               "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
        path.write_text(json.dumps(doc))
        return path


def _handler(server: FakeApiServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one_request(self) -> None:
            try:
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen = Seen(server.conn_index(self.client_address), self.command, self.path,
                            {k.lower(): v for k, v in self.headers.items()}, body)
                server.seen.append(seen)
                self.close_connection = not server.script(seen, Reply(self))
            except OSError:
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.tls = tls

    def get_request(self) -> tuple[socket.socket, Any]:
        raw, address = self.socket.accept()
        return self.tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer: expected in these tests


def make_pki(base: Path) -> dict[str, Path]:
    ca = make_ca(base / "pki")
    srv = issue(ca, base / "pki", "server", common_name="server", server=True, ip_addresses=["127.0.0.1"])
    cli = issue(ca, base / "pki", "client", common_name="driver", client=True)
    return {"ca": ca.cert, "server.crt": srv.cert, "server.key": srv.key, "client.crt": cli.cert,
            "client.key": cli.key}


def serve(base: Path) -> Iterator[FakeApiServer]:
    """The server, running until the generator is closed (a fixture's body)."""
    pki = make_pki(base)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki["server.crt"], pki["server.key"])
    tls.load_verify_locations(pki["ca"])
    tls.verify_mode = ssl.CERT_REQUIRED
    fake = FakeApiServer(tls, pki)
    httpd = _Server(tls, _handler(fake))
    fake.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
