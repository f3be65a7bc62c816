"""driver/daemon/http1.py through the daemon ApiClient (driver/daemon/kube.py) against a real local TLS server: a
socket
server in a thread that answers each request with the bytes a test scripts, so framing, keep-alive, closed
connections, limits and malformed answers are exercised on the wire. (The real kube-apiserver:
test_driver_apiserver.py.)"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon import http1, kube
from neuron_dra.driver.daemon.claims import ClaimLookupError
from neuron_dra.driver.daemon.kube import ApiClient, ApiException, ClusterConfig, KubeApi, KubeClaimLookup
from neuron_dra.localcluster.pki import issue, make_ca


@dataclass(frozen=True)
class Seen:
    """A request as the server read it."""

    conn: int  # which accepted connection (0, 1, ...)
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


# A script answers one request: it writes to the socket and returns whether to keep the connection open.
Script = Callable[[Seen, ssl.SSLSocket], bool]


def ok(body: bytes = b'{"kind":"Status"}', extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def _send(sock: ssl.SSLSocket, data: bytes, keep: bool = True) -> bool:
    sock.sendall(data)
    return keep


def chunked(pieces: list[bytes], status: str = "200 OK", trailer: bytes = b"") -> bytes:
    out = f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    for i, p in enumerate(pieces):
        ext = b";ext=1" if i == 0 else b""  # a chunk extension, ignored
        out += f"{len(p):x}".encode() + ext + b"\r\n" + p + b"\r\n"
    return out + b"0\r\n" + trailer + b"\r\n"


@dataclass
class Server:
    """A loopback TLS server (certificate from a throwaway CA) that reads HTTP/1.1 requests and runs `script`."""

    tls: ssl.SSLContext
    script: Script = field(default=lambda seen, sock: _send(sock, ok()))
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            index, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._connection, args=(raw, index), daemon=True).start()

    def _connection(self, raw: socket.socket, index: int) -> None:
        try:
            with self.tls.wrap_socket(raw, server_side=True) as sock, sock.makefile("rb") as reader:
                while (seen := _read_request(reader, index)) is not None:
                    self.seen.append(seen)
                    if not self.script(seen, sock):
                        return
        except (OSError, ValueError):
            return


def _read_request(reader: Any, index: int) -> Seen | None:
    line = reader.readline()
    if not line:
        return None
    method, target, _ = line.decode().split(" ")
    headers: dict[str, str] = {}
    while (h := reader.readline()) not in (b"\r\n", b""):
        name, _, value = h.decode().partition(":")
        headers[name.lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return Seen(index, method, target, headers, body)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = make_ca(tmp_path / "pki")
    srv = issue(ca, tmp_path / "pki", "server", common_name="server", server=True, ip_addresses=["127.0.0.1"])
    cli = issue(ca, tmp_path / "pki", "client", common_name="driver", client=True)
    return {"ca": ca.cert, "server.crt": srv.cert, "server.key": srv.key, "client.crt": cli.cert,
            "client.key": cli.key}


@pytest.fixture
def server(pki: dict[str, Path]) -> Iterator[Server]:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki["server.crt"], pki["server.key"])
    tls.load_verify_locations(pki["ca"])
    tls.verify_mode = ssl.CERT_REQUIRED  # the client must present its certificate
    listener = socket.create_server(("127.0.0.1", 0))
    srv = Server(tls, port=listener.getsockname()[1])
    thread = threading.Thread(target=srv.serve, args=(listener,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not, on Linux)
        listener.close()
        thread.join(5)
        assert not thread.is_alive()


def client(server: Server, pki: dict[str, Path], token: str | None = "t0k",
           limits: http1.Limits = http1.DEFAULT_LIMITS) -> ApiClient:
    return ApiClient(ClusterConfig(server=f"https://127.0.0.1:{server.port}", ca_file=str(pki["ca"]),
                                   cert_file=str(pki["client.crt"]), key_file=str(pki["client.key"]), token=token),
                     limits)


def answer(data: bytes, keep: bool = True) -> Script:
    return lambda seen, sock: _send(sock, data, keep)


# --- framing --------------------------------------------------------------------------------------------------

def test_content_length_answers_and_the_request_on_the_wire(server: Server, pki: dict[str, Path]) -> None:
    server.script = lambda seen, sock: _send(sock, ok(json.dumps({"echo": seen.body.decode()}).encode()))
    api = KubeApi(client(server, pki))
    assert api.call("GET", "/api/v1/nodes/n1", query={"a": "b c", "skip": None}) == {"echo": ""}
    assert api.call("POST", "/apis/x", body={"k": "v"}) == {"echo": '{"k": "v"}'}
    get, post = server.seen
    assert (get.method, get.target, get.body) == ("GET", "/api/v1/nodes/n1?a=b+c", b"")
    assert get.headers["host"] == f"127.0.0.1:{server.port}"
    assert get.headers["authorization"] == "Bearer t0k"
    assert get.headers["accept"] == "application/json"
    assert "content-length" not in get.headers
    assert (post.headers["content-type"], post.headers["content-length"]) == ("application/json", "10")


def test_chunked_answers_with_extensions_and_trailers_keep_the_connection(server: Server,
                                                                          pki: dict[str, Path]) -> None:
    items = [{"name": f"slice-{i}", "pad": "x" * 300} for i in range(1000)]  # ~330 KB, many recv calls
    body = json.dumps({"kind": "List", "items": items}).encode()
    pieces = [body[i:i + 7000] for i in range(0, len(body), 7000)]
    server.script = answer(chunked(pieces, trailer=b"X-Trailer: 1\r\n"))
    api = KubeApi(client(server, pki))
    assert api.call("GET", "/apis/list")["items"] == items
    assert api.call("GET", "/apis/list")["items"] == items
    assert server.connections == 1


def test_a_body_without_length_ends_at_close_and_the_next_request_connects_again(server: Server,
                                                                                 pki: dict[str, Path]) -> None:
    server.script = answer(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"until": "close"}',
                           keep=False)
    api = KubeApi(client(server, pki))
    assert api.call("GET", "/a") == {"until": "close"}
    assert api.call("GET", "/b") == {"until": "close"}
    assert [s.conn for s in server.seen] == [0, 1]


@pytest.mark.parametrize(("head", "connections"), [
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", [0, 1]),  # HTTP/1.0 closes unless it says keep-alive
    (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\n", [0, 0]),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n", [0, 1]),
])
def test_which_answers_keep_the_connection(server: Server, pki: dict[str, Path], head: bytes,
                                           connections: list[int]) -> None:
    server.script = answer(head + b"{}")
    api = KubeApi(client(server, pki))
    assert api.call("GET", "/a") == api.call("GET", "/b") == {}
    assert [s.conn for s in server.seen] == connections


def test_an_answer_without_body_keeps_the_connection(server: Server, pki: dict[str, Path]) -> None:
    server.script = answer(b"HTTP/1.1 204 No Content\r\n\r\n")
    api = client(server, pki)
    assert api.request("DELETE", "/a").read() == b""
    assert api.request("DELETE", "/b").read() == b""
    assert [s.conn for s in server.seen] == [0, 0]


def test_interim_1xx_answers_are_skipped(server: Server, pki: dict[str, Path]) -> None:
    server.script = answer(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(b'{"final": 1}'))
    assert KubeApi(client(server, pki)).call("GET", "/a") == {"final": 1}


# --- keep-alive -----------------------------------------------------------------------------------------------

def test_one_kept_connection_per_thread_with_nodelay(server: Server, pki: dict[str, Path]) -> None:
    api = client(server, pki)
    kube = KubeApi(api)
    kube.call("GET", "/a")
    kube.call("PUT", "/b", body={})
    assert [s.conn for s in server.seen] == [0, 0]
    conn = api._local.conn
    assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    other = threading.Thread(target=kube.call, args=("GET", "/c"))
    other.start()
    other.join(10)
    kube.call("GET", "/d")
    assert [s.conn for s in server.seen] == [0, 0, 1, 0]


def test_a_request_goes_out_in_one_write(pki: dict[str, Path]) -> None:
    """One sendall: request line, headers and body in one TLS record (under 16 KiB), so one server read gets all
    of it (a separate write for the body would arrive as a record of its own)."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki["server.crt"], pki["server.key"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        got: list[bytes] = []

        def serve() -> None:
            raw, _ = listener.accept()
            with tls.wrap_socket(raw, server_side=True) as sock:
                got.append(sock.recv(65536))
                sock.sendall(ok())

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        api = ApiClient(ClusterConfig(server=f"https://127.0.0.1:{listener.getsockname()[1]}", ca_file=str(pki["ca"]),
                                      token="t"))
        KubeApi(api).call("PUT", "/apis/x", body={"spec": "y" * 5000})
        thread.join(5)
    head, _, body = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"PUT /apis/x HTTP/1.1\r\n") and b"Content-Length: 5012" in head  # {"spec": "y..."}
    assert json.loads(body) == {"spec": "y" * 5000}


def test_connection_close_answers_close_the_connection(server: Server, pki: dict[str, Path]) -> None:
    server.script = answer(ok(extra="Connection: close\r\n"))  # the server keeps it open: the client must close
    api = client(server, pki)
    KubeApi(api).call("GET", "/a")
    assert api._local.conn.closed
    KubeApi(api).call("GET", "/b")
    assert [s.conn for s in server.seen] == [0, 1]


def test_an_idle_connection_the_server_closed_is_replaced_before_sending(server: Server,
                                                                         pki: dict[str, Path]) -> None:
    """The API server's idle timeout: the kept connection is found closed before the request goes out, so even a
    POST (not repeatable) is sent exactly once, on a new connection."""
    server.script = answer(ok(), keep=False)  # closes after each answer, without saying so
    api = KubeApi(client(server, pki))
    api.call("GET", "/a")
    time.sleep(0.2)  # the FIN arrives
    api.call("POST", "/create", body={"metadata": {"generateName": "x-"}})
    assert [(s.method, s.conn) for s in server.seen] == [("GET", 0), ("POST", 1)]


def _close_second_request(seen: Seen, sock: ssl.SSLSocket) -> bool:
    """Answers the first request of a connection; closes it on reading the second, without a byte of answer."""
    if seen.conn == 0 and seen.target != "/first":
        return False
    sock.sendall(ok())
    return True


def test_a_kept_connection_closed_before_any_byte_of_the_answer_is_retried_once_for_idempotent_methods(
        server: Server, pki: dict[str, Path]) -> None:
    server.script = _close_second_request
    api = KubeApi(client(server, pki))
    api.call("GET", "/first")
    api.call("GET", "/again")
    assert [(s.target, s.conn) for s in server.seen] == [("/first", 0), ("/again", 0), ("/again", 1)]


def test_a_post_is_not_sent_twice_when_the_kept_connection_closes_after_it_went_out(
        server: Server, pki: dict[str, Path]) -> None:
    server.script = _close_second_request
    api = KubeApi(client(server, pki))
    api.call("GET", "/first")
    with pytest.raises(http1.ClosedBeforeAnswer, match="before any byte of the answer"):
        api.call("POST", "/create", body={})
    assert [s.target for s in server.seen] == ["/first", "/create"]
    assert api.call("GET", "/next") == {"kind": "Status"}  # on a new connection


def test_a_new_connection_closed_before_the_answer_is_not_retried(server: Server, pki: dict[str, Path]) -> None:
    server.script = lambda seen, sock: False
    with pytest.raises(http1.ClosedBeforeAnswer):
        KubeApi(client(server, pki)).call("GET", "/a")
    assert len(server.seen) == 1


# --- errors ---------------------------------------------------------------------------------------------------

def test_non_2xx_answers_raise_with_status_reason_and_body_and_keep_the_connection(server: Server,
                                                                                    pki: dict[str, Path]) -> None:
    status = b'{"kind":"Status","reason":"AlreadyExists","code":409}'
    server.script = answer(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(status), status))
    api = KubeApi(client(server, pki))
    with pytest.raises(ApiException) as info:
        api.call("POST", "/x", body={})
    assert (info.value.status, info.value.reason, info.value.body) == (409, "Conflict", status.decode())
    with pytest.raises(ApiException):
        api.call("GET", "/y")
    assert [s.conn for s in server.seen] == [0, 0]


def test_claim_lookup_maps_404_to_none_and_other_failures_to_claim_lookup_errors(server: Server,
                                                                                 pki: dict[str, Path]) -> None:
    def script(seen: Seen, sock: ssl.SSLSocket) -> bool:
        if "missing" in seen.target:
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
        elif "broken" in seen.target:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
        else:
            sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        return True

    server.script = script
    lookup = KubeClaimLookup(client(server, pki), timeout=(3.0, 5.0))
    assert lookup.get("ns", "missing") is None
    with pytest.raises(ClaimLookupError, match="GET resourceclaims ns/c: 500 Internal Server Error"):
        lookup.get("ns", "c")
    with pytest.raises(ClaimLookupError, match="malformed Content-Length 'x'"):
        lookup.get("ns", "broken")


@pytest.mark.parametrize(("raw", "error"), [
    (b"HTTP/1.1 OK\r\n\r\n", "malformed status line 'HTTP/1.1 OK'"),
    (b"ICY 200 OK\r\n\r\n", "malformed status line 'ICY 200 OK'"),
    (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "malformed header field line ' folded: x'"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header field line 'no colon'"),
    (b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", "a bare CR or LF in the answer's header section"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", "malformed Content-Length '1, 2'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size line b'zz'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", "chunk data not followed by CRLF"),
    (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "switched protocols"),
])
def test_malformed_answers_say_what_was_wrong(server: Server, pki: dict[str, Path], raw: bytes, error: str) -> None:
    server.script = answer(raw)
    with pytest.raises(http1.ProtocolError, match=error):
        KubeApi(client(server, pki)).call("GET", "/a")


@pytest.mark.parametrize(("raw", "error"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "8 bytes short of the Content-Length 10"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "closed the connection within the answer's header section after 27 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}", "3 bytes short of the chunk size 5"),
])
def test_answers_cut_short_say_where(server: Server, pki: dict[str, Path], raw: bytes, error: str) -> None:
    server.script = answer(raw, keep=False)
    with pytest.raises(http1.ProtocolError, match=error):
        KubeApi(client(server, pki)).call("GET", "/a")


def test_a_header_section_over_the_limit_is_refused(server: Server, pki: dict[str, Path]) -> None:
    big = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(70))  # ~71 KB
    server.script = answer(b"HTTP/1.1 200 OK\r\n" + big + b"Content-Length: 2\r\n\r\n{}")
    with pytest.raises(http1.LimitError, match=r"header section is over the limit of 65536 bytes \(MAX_HEADER_BYTES"):
        KubeApi(client(server, pki)).call("GET", "/a")


def test_bodies_over_the_limit_are_refused_whatever_their_framing(server: Server, pki: dict[str, Path]) -> None:
    # The default limit (64 MiB) from a declared length, nothing else read.
    server.script = answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (64 * 1024 * 1024 + 1))
    with pytest.raises(http1.LimitError, match=r"Content-Length 67108865 is over the limit of 67108864 bytes"):
        KubeApi(client(server, pki)).call("GET", "/a")
    small = http1.Limits(body_bytes=1000)
    for framing in (chunked([b"x" * 600, b"y" * 600]), b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 1200):
        server.script = answer(framing, keep=False)
        with pytest.raises(http1.LimitError, match=r"body is over the limit of 1000 bytes \(MAX_BODY_BYTES\)"):
            KubeApi(client(server, pki, limits=small)).call("GET", "/a")


def test_a_read_timeout_fails_the_request_in_time(server: Server, pki: dict[str, Path]) -> None:
    gate = threading.Event()
    server.script = lambda seen, sock: gate.wait(10)  # never answers until the test ends
    lookup = KubeClaimLookup(client(server, pki), timeout=(3.0, 0.3))
    start = time.monotonic()
    try:
        with pytest.raises(ClaimLookupError, match="GET resourceclaims ns/c: TimeoutError"):
            lookup.get("ns", "c")
    finally:
        gate.set()
    assert 0.25 < time.monotonic() - start < 2.0


def test_a_rotated_token_file_is_sent_once_reread(server: Server, pki: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet rotates projected tokens: the cached header block must follow the file."""
    token = tmp_path / "token"
    token.write_text("one\n")
    api = ApiClient(ClusterConfig(server=f"https://127.0.0.1:{server.port}", ca_file=str(pki["ca"]),
                                  cert_file=str(pki["client.crt"]), key_file=str(pki["client.key"]),
                                  token_file=str(token)))
    KubeApi(api).call("GET", "/a")
    token.write_text("two\n")
    KubeApi(api).call("GET", "/b")  # within TOKEN_RELOAD_SECONDS: the token read before
    monkeypatch.setattr(kube, "TOKEN_RELOAD_SECONDS", 0.0)
    KubeApi(api).call("POST", "/c", body={})
    KubeApi(api).call("GET", "/d")
    assert [s.headers["authorization"] for s in server.seen] == ["Bearer one", "Bearer one", "Bearer two",
                                                                "Bearer two"]


def test_a_value_with_a_line_break_is_not_sent(server: Server, pki: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="a CR or LF in a header field would change the request"):
        KubeApi(client(server, pki, token="t\r\nX-Injected: 1")).call("GET", "/a")
    with pytest.raises(ValueError, match="a space, CR or LF in the request target would change the request"):
        KubeApi(client(server, pki)).call("GET", "/a b")
    assert server.seen == []


# --- watches --------------------------------------------------------------------------------------------------

def test_a_watch_yields_events_split_across_chunks_until_the_server_ends_it(server: Server,
                                                                            pki: dict[str, Path]) -> None:
    events = [{"type": "ADDED", "object": {"n": i, "pad": "p" * 50}} for i in range(5)]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    pieces = [stream[:30], stream[30:31], stream[31:200], stream[200:]]  # lines cut anywhere
    server.script = answer(chunked(pieces))
    api = client(server, pki)
    assert list(KubeApi(api).watch("/apis/w", {"rv": "1"}, timeout=(3.0, 5.0))) == events
    assert server.seen[0].target == "/apis/w?rv=1&watch=true"


def test_a_watch_line_over_the_limit_is_refused(server: Server, pki: dict[str, Path]) -> None:
    server.script = answer(chunked([b'{"type":"ADDED"}\n', b"x" * 600, b"y" * 600 + b"\n"]))
    events = KubeApi(client(server, pki, limits=http1.Limits(body_bytes=1000))).watch("/w", {}, timeout=(3.0, 5.0))
    assert next(events) == {"type": "ADDED"}
    with pytest.raises(http1.LimitError, match=r"a line of the answer's body is over the limit of 1000 bytes"):
        next(events)


def test_a_watch_answered_with_an_error_raises_and_closes_its_connection(server: Server,
                                                                          pki: dict[str, Path]) -> None:
    server.script = answer(b"HTTP/1.1 410 Gone\r\nContent-Length: 4\r\n\r\ngone")
    with pytest.raises(ApiException, match=r"\(410\) Gone: gone"):
        next(KubeApi(client(server, pki)).watch("/apis/w", {}, timeout=(3.0, 5.0)))
