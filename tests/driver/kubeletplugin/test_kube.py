"""The daemon's API client (driver/kubeletplugin/_kube.py, its answers parsed by httptools) against a scripted
loopback TLS server: the request on the wire, pooled connections, which requests are sent again, answers over the size
caps, malformed and cut answers, non-2xx answers, token rotation, watches, the client-side rate limit. (Attacks by a
hostile server: test_kube_attacks.py; the real kube-apiserver: test_driver_apiserver.py.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_dra.driver.kubeletplugin import _kube as kube
from neuron_dra.driver.kubeletplugin._claimref import ClaimLookupError
from neuron_dra.driver.kubeletplugin._kube import (
    AnswerTooLarge,
    ApiClientError,
    ApiException,
    ClientOptions,
    KubeApi,
    KubeClaimLookup,
    Limits,
)
from neuron_dra.driver.kubeletplugin._kubeconfig import ClusterConfig
from neuron_dra.driver.kubeletplugin._ratelimit import Rate, TokenBucket
from tests.support.fake_apiserver import FakeApiServer, Reply, Seen, answer, chunked, ok, ok_json, serve

FAST = ClientOptions(rate=Rate(1000, 1000))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeApiServer]:
    yield from serve(tmp_path)


def api(server: FakeApiServer, options: ClientOptions = FAST, **kw: object) -> KubeApi:
    return KubeApi(server.client(options=options, **kw))  # type: ignore[arg-type]


# --- the request and the connection ---------------------------------------------------------------------------

def test_the_request_on_the_wire(server: FakeApiServer) -> None:
    def echo(seen: Seen, reply: Reply) -> bool:
        reply.write(ok_json({"echo": seen.body.decode()}))
        return True

    server.script = echo
    client = api(server)
    assert client.call("GET", "/api/v1/nodes/n1", query={"a": "b c", "skip": None}) == {"echo": ""}
    assert client.call("POST", "/apis/x", body={"k": "v"}) == {"echo": '{"k": "v"}'}
    get, post = server.seen
    assert (get.method, get.target, get.body) == ("GET", "/api/v1/nodes/n1?a=b+c", b"")
    assert get.headers["host"] == f"127.0.0.1:{server.port}"
    assert (get.headers["authorization"], get.headers["accept"]) == ("Bearer t0k", "application/json")
    assert get.headers["user-agent"] == "neuron-dra-driver"
    assert "content-length" not in get.headers and get.headers["accept-encoding"] == "identity"
    assert (post.headers["content-type"], post.headers["content-length"]) == ("application/json", "10")


def test_a_merge_patch_names_its_content_type_and_other_bodies_stay_json(server: FakeApiServer) -> None:
    def echo(seen: Seen, reply: Reply) -> bool:
        reply.write(ok_json({"echo": seen.body.decode()}))
        return True

    server.script = echo
    client = api(server)
    patch = {"metadata": {"labels": {"k": None}}}
    assert client.merge_patch("/api/v1/nodes/n1", patch) == {"echo": json.dumps(patch)}
    client.call("PUT", "/api/v1/nodes/n1", body={"k": "v"})  # the header cache keeps the two apart
    (patched, put) = server.seen
    assert (patched.method, patched.headers["content-type"]) == ("PATCH", "application/merge-patch+json")
    assert (put.method, put.headers["content-type"]) == ("PUT", "application/json")


def test_connections_are_pooled_and_shared_by_threads(server: FakeApiServer) -> None:
    client = api(server)
    client.call("GET", "/a")
    client.call("PUT", "/b", body={})
    other = threading.Thread(target=client.call, args=("GET", "/c"))
    other.start()
    other.join(10)
    client.call("GET", "/d")
    assert [s.conn for s in server.seen] == [0, 0, 0, 0]


def test_chunked_and_until_close_answers(server: FakeApiServer) -> None:
    items = [{"name": f"slice-{i}", "pad": "x" * 300} for i in range(1000)]  # ~330 KB, many reads
    body = json.dumps({"kind": "List", "items": items}).encode()
    server.script = answer(chunked([body[i:i + 7000] for i in range(0, len(body), 7000)]))
    client = api(server)
    assert client.list("/apis/list")["items"] == items
    assert client.list("/apis/list")["items"] == items
    assert server.connections == 1  # a chunked answer read to its end keeps the connection
    server.script = answer(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"until": "close"}', keep=False)
    assert client.call("GET", "/a") == {"until": "close"}
    assert client.call("GET", "/b") == {"until": "close"}
    assert server.connections == 2  # the first on the kept connection, which it ends; the second on a new one


def test_an_idle_connection_the_server_closed_is_replaced_before_sending(server: FakeApiServer) -> None:
    """The API server's idle timeout: the pooled connection is found closed before the request goes out, so even
    a POST (never sent twice) is sent exactly once, on a new connection."""
    server.script = answer(ok(), keep=False)  # closes after each answer, without saying so
    client = api(server)
    client.call("GET", "/a")
    time.sleep(0.2)  # the FIN arrives
    client.call("POST", "/create", body={"metadata": {"generateName": "x-"}})
    assert [(s.method, s.conn) for s in server.seen] == [("GET", 0), ("POST", 1)]


def _close_second_request(seen: Seen, reply: Reply) -> bool:
    """Answers the first request of a connection; closes it on reading the next, without a byte of answer."""
    if seen.conn == 0 and seen.target != "/first":
        return False
    reply.write(ok())
    return True


def test_an_idempotent_request_is_sent_again_once_when_the_connection_closes_before_the_answer(
        server: FakeApiServer) -> None:
    server.script = _close_second_request
    client = api(server)
    client.call("GET", "/first")
    client.call("GET", "/again")
    assert [(s.target, s.conn) for s in server.seen] == [("/first", 0), ("/again", 0), ("/again", 1)]


def test_a_post_is_never_sent_twice(server: FakeApiServer) -> None:
    server.script = _close_second_request
    client = api(server)
    client.call("GET", "/first")
    with pytest.raises(ApiClientError, match=r"POST /create: .*(RemoteDisconnected|closed)"):
        client.call("POST", "/create", body={})
    assert [s.target for s in server.seen] == ["/first", "/create"]
    assert client.call("GET", "/next") == {"kind": "Status"}  # on a new connection


def test_a_server_that_never_answers_gets_a_get_twice_at_most(server: FakeApiServer) -> None:
    server.script = lambda seen, reply: False
    with pytest.raises(ApiClientError, match="GET /a: "):
        api(server).call("GET", "/a")
    assert len(server.seen) == 2


def test_redirects_are_not_followed_and_retry_after_is_not_obeyed(server: FakeApiServer) -> None:
    server.script = answer(b"HTTP/1.1 302 Found\r\nLocation: https://example.com/\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ApiException, match=r"\(302\) Found"):
        api(server).call("GET", "/a")
    server.script = answer(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3600\r\nContent-Length: 0\r\n\r\n")
    start = time.monotonic()
    with pytest.raises(ApiException, match=r"\(503\)"):
        api(server).call("GET", "/b")
    assert time.monotonic() - start < 2
    assert [s.target for s in server.seen] == ["/a", "/b"]


# --- answers --------------------------------------------------------------------------------------------------

def test_non_2xx_answers_raise_with_status_reason_and_body_and_keep_the_connection(server: FakeApiServer) -> None:
    status = b'{"kind":"Status","reason":"AlreadyExists","code":409}'
    server.script = answer(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(status), status))
    client = api(server)
    with pytest.raises(ApiException) as info:
        client.call("POST", "/x", body={})
    assert (info.value.status, info.value.reason, info.value.body) == (409, "Conflict", status.decode())
    with pytest.raises(ApiException):
        client.call("GET", "/y")
    assert [s.conn for s in server.seen] == [0, 0]


def test_claim_lookup_maps_404_to_none_and_other_failures_to_claim_lookup_errors(server: FakeApiServer) -> None:
    def script(seen: Seen, reply: Reply) -> bool:
        if "missing" in seen.target:
            reply.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
        elif "broken" in seen.target:
            reply.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n[1,2]")
        else:
            reply.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        return True

    server.script = script
    lookup = KubeClaimLookup(server.client(options=FAST))
    assert lookup.get("ns", "missing") is None
    with pytest.raises(ClaimLookupError, match="GET resourceclaims ns/c: 500 Internal Server Error"):
        lookup.get("ns", "c")
    with pytest.raises(ClaimLookupError, match="expected a JSON object from the API server, got list"):
        lookup.get("ns", "broken")


@pytest.mark.parametrize(("raw", "error"), [
    (b"HTTP/1.1 OK\r\n\r\n", "HttpParserInvalidStatusError: Invalid status code"),
    (b"ICY 200 OK\r\n\r\n", "HttpParserError: Expected HTTP/"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "IncompleteRead"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "Invalid character in chunk size"),
    (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n",
     "more than 100 header fields"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", r"head is over 65536 bytes \(a header line too long"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 200000, r"head is over 65536 bytes \(a header line too long"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", "Content-Encoding 'gzip'"),
    (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(), r"an interim answer \(103\)"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n" + b"\0" * 9,
     r"switches protocols \(101\)"),
])
def test_malformed_answers_fail_the_request_saying_what_was_wrong(server: FakeApiServer, raw: bytes,
                                                                  error: str) -> None:
    server.script = answer(raw, keep=False)
    with pytest.raises(ApiClientError, match=f"GET /a: .*({error})"):
        api(server).call("GET", "/a")


def test_bytes_after_a_complete_answer_end_its_connection(server: FakeApiServer) -> None:
    """What follows an answer on its connection is not an answer to the next request: the connection is closed."""
    server.script = answer(ok(b'{"n": 1}') + b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{\"n\": 2}")
    client = api(server)
    assert client.call("GET", "/a") == {"n": 1}
    assert client.call("GET", "/b") == {"n": 1}
    server.script = answer(ok(b'{"n": 3}') + b"garbage")
    assert client.call("GET", "/c") == {"n": 3}
    assert client.call("GET", "/d") == {"n": 3}
    assert [s.conn for s in server.seen] == [0, 1, 2, 3]


def test_100_continue_is_skipped(server: FakeApiServer) -> None:
    server.script = answer(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"final": 1}'))
    assert api(server).call("GET", "/a") == {"final": 1}


def test_answers_over_the_caps_are_refused_naming_them(server: FakeApiServer) -> None:
    client = api(server)
    server.script = answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (kube.MAX_OBJECT_BYTES + 1))
    with pytest.raises(AnswerTooLarge, match=rf"Content-Length {kube.MAX_OBJECT_BYTES + 1} is over the limit of "
                                             rf"{kube.MAX_OBJECT_BYTES} bytes \(MAX_OBJECT_BYTES\)"):
        client.call("GET", "/a")
    small = api(server, ClientOptions(rate=FAST.rate, limits=Limits(object_bytes=1000, list_bytes=2000)))
    for framing in (chunked([b"x" * 600, b"y" * 600]), b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 1200):
        server.script = answer(framing, keep=False)
        with pytest.raises(AnswerTooLarge, match=r"GET /a: the answer is over the limit of 1000 bytes "
                                                 r"\(MAX_OBJECT_BYTES\)"):
            small.call("GET", "/a")
    server.script = answer(chunked([b"[" + b"1," * 1100 + b"1]"]))
    with pytest.raises(AnswerTooLarge, match=r"over the limit of 2000 bytes \(MAX_LIST_BYTES\)"):
        small.list("/l")
    server.script = answer(ok(b'{"items": []}'))
    assert small.list("/l") == {"items": []}  # the connection after a refused answer was not reused


def test_a_rotated_token_file_is_sent_once_reread(server: FakeApiServer, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet rotates projected tokens: the cached header fields must follow the file."""
    token = tmp_path / "token"
    token.write_text("one\n")
    client = api(server, token=None, token_file=str(token))
    client.call("GET", "/a")
    token.write_text("two\n")
    client.call("GET", "/b")  # within TOKEN_RELOAD_SECONDS: the token read before
    monkeypatch.setattr(kube, "TOKEN_RELOAD_SECONDS", 0.0)
    client.call("POST", "/c", body={})
    client.call("GET", "/d")
    assert [s.headers["authorization"] for s in server.seen] == ["Bearer one", "Bearer one", "Bearer two",
                                                                "Bearer two"]


def test_a_missing_token_file_fails_the_request_naming_it(server: FakeApiServer, tmp_path: Path) -> None:
    with pytest.raises(ApiClientError, match=f"reading the token file {tmp_path}/gone: .*No such file"):
        api(server, token=None, token_file=str(tmp_path / "gone")).call("GET", "/a")
    assert server.seen == []


def test_nothing_can_split_the_request(server: FakeApiServer) -> None:
    with pytest.raises(ApiClientError, match="a CR or LF in a header field"):
        api(server, token="t\r\nX-Injected: 1").call("GET", "/a")
    assert server.seen == []
    api(server).call("GET", "/a b\r\nX-Injected: 1")
    assert [s.target for s in server.seen] == ["/a%20b%0D%0AX-Injected:%201"]
    assert "x-injected" not in server.seen[0].headers


def test_a_server_url_path_is_quoted_into_the_request_line(server: FakeApiServer) -> None:
    """The kubeconfig's server URL may carry a path (a proxy's prefix): whatever it holds, the request line stays
    ASCII and whole, and a bad prefix is never an error other than the client's own."""
    config = ClusterConfig(server=f"{server.url}/pré fix/", ca_file=str(server.pki["ca"]),
                           cert_file=str(server.pki["client.crt"]), key_file=str(server.pki["client.key"]))
    KubeApi(kube.ApiClient(config, FAST)).call("GET", "/a")
    assert [s.target for s in server.seen] == ["/pr%C3%A9%20fix/a"]


# --- watches --------------------------------------------------------------------------------------------------

def test_a_watch_yields_events_split_across_chunks_until_the_server_ends_it(server: FakeApiServer) -> None:
    events = [{"type": "ADDED", "object": {"n": i, "pad": "p" * 50}} for i in range(5)]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    server.script = answer(chunked([stream[:30], stream[30:31], stream[31:200], stream[200:]]))
    assert list(api(server).watch("/apis/w", {"rv": "1"}, 5, 5)) == events
    assert server.seen[0].target == "/apis/w?rv=1&watch=true"


def test_a_watch_event_is_read_as_it_arrives(server: FakeApiServer) -> None:
    gate = threading.Event()

    def script(seen: Seen, reply: Reply) -> bool:
        reply.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        line = b'{"type":"ADDED","object":{}}\n'
        reply.write(b"%x\r\n%s\r\n" % (len(line), line))
        gate.wait(10)
        reply.write(b"0\r\n\r\n")
        return True

    server.script = script
    events = api(server).watch("/w", {}, 20, 20)
    try:
        assert next(events) == {"type": "ADDED", "object": {}}  # before the answer ends
    finally:
        gate.set()
    assert list(events) == []


def test_a_watch_event_over_the_cap_is_refused(server: FakeApiServer) -> None:
    server.script = answer(chunked([b'{"type":"ADDED"}\n', b"x" * 600, b"y" * 600 + b"\n"]))
    small = api(server, ClientOptions(rate=FAST.rate, limits=Limits(object_bytes=1000)))
    events = small.watch("/w", {}, 5, 5)
    assert next(events) == {"type": "ADDED"}
    with pytest.raises(AnswerTooLarge, match=r"an event is over the limit of 1000 bytes \(MAX_OBJECT_BYTES\)"):
        next(events)


def test_a_watch_answered_with_an_error_raises(server: FakeApiServer) -> None:
    server.script = answer(b"HTTP/1.1 410 Gone\r\nContent-Length: 4\r\n\r\ngone")
    with pytest.raises(ApiException, match=r"\(410\) Gone: gone"):
        next(api(server).watch("/apis/w", {}, 5, 5))


# --- client-side rate limit -----------------------------------------------------------------------------------

def test_requests_beyond_the_burst_wait_for_the_rate(server: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []  # what each request waited for its token
    acquire = TokenBucket.acquire
    now = [time.monotonic()]  # the buckets' clock: it moves only when a bucket sleeps, never with the load

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def recorded(bucket: TokenBucket, deadline: float) -> float:
        waits.append(acquire(bucket, deadline))
        return waits[-1]

    monkeypatch.setattr(TokenBucket, "acquire", recorded)
    monkeypatch.setattr(kube, "TokenBucket", lambda rate: TokenBucket(rate, clock=lambda: now[0], sleep=sleep))
    client = api(server, ClientOptions(rate=Rate(qps=10, burst=3)))
    start = now[0]
    for i in range(3):
        client.call("GET", f"/burst-{i}")
    assert waits == [0.0, 0.0, 0.0]
    for i in range(3):
        client.call("GET", f"/paced-{i}")
    assert waits[3:] == pytest.approx([0.1, 0.1, 0.1]) and now[0] - start == pytest.approx(0.3)  # 10 per second
    assert [s.target for s in server.seen][-3:] == ["/paced-0", "/paced-1", "/paced-2"]
    slow = api(server, ClientOptions(rate=Rate(qps=0.2, burst=1), deadline=1.0))
    slow.call("GET", "/one")
    with pytest.raises(ApiClientError, match=r"client-side rate limit \(0.2 requests per second, burst 1\) would "
                                             r"delay the request [45].\d\d s, past its deadline"):
        slow.call("GET", "/two")
    assert server.seen[-1].target == "/one"


def test_the_daemon_flags_of_the_api_client(capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_dra.driver.daemon.options import parse_options

    default = parse_options(["--node-name", "n"], {})
    assert (default.kube_api_qps, default.kube_api_burst, default.kube_api_timeout) == (50.0, 100, 10.0)  # kubelet's
    from neuron_dra.driver.deploy import DriverDeployOptions

    deploy = DriverDeployOptions()  # the DaemonSet passes no flag for them: the defaults must agree
    assert (deploy.kube_api_qps, deploy.kube_api_burst, deploy.kube_api_timeout) == (
        default.kube_api_qps, default.kube_api_burst, default.kube_api_timeout)
    env = parse_options(["--node-name", "n", "--kube-api-burst", "30"], {"KUBE_API_QPS": "15", "KUBE_API_TIMEOUT": "3"})
    assert (env.kube_api_qps, env.kube_api_burst, env.kube_api_timeout) == (15.0, 30, 3.0)
    for flag, value, error in (("--kube-api-timeout", "60", "60.0: allowed 0.5 to 40"),
                               ("--kube-api-qps", "many", "'many' is not a number of requests per second"),
                               ("--kube-api-burst", "0", "0: allowed 1 to 1000")):
        with pytest.raises(SystemExit):
            parse_options(["--node-name", "n", flag, value], {})
        assert f"argument {flag}: {error}" in capsys.readouterr().err


@pytest.mark.process
def test_the_client_loads_no_http_library_beyond_its_parser() -> None:
    """The client parses answers with httptools (docs/hardening.md §4): importing it loads neither urllib3 nor
    importlib.metadata (which urllib3 loaded at import: 1.1 MiB of the daemon's start-up memory,
    docs/benchmarks.md §1) nor http.client. Run without `site` (as in the image, where nothing loads them before the
    daemon; here an editable install's finder does)."""
    import os
    import site
    import subprocess
    import sys

    code = ("import sys\n"
            "import neuron_dra.driver.kubeletplugin._kube\n"
            "print(sorted(m for m in ('urllib3', 'importlib.metadata', 'http.client', 'httptools') "
            "if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *site.getsitepackages()])}
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['httptools']"
