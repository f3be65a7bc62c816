"""driver/daemon/h2grpc.py (the daemon's gRPC server on h2) against grpcio's client (real gRPC) and raw HTTP/2 frames:
framing, statuses, Trailers-Only errors, limits, flow control, deadlines, cancellation, PING, GOAWAY."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from neuron_dra.driver.daemon import h2grpc
from neuron_dra.driver.daemon._generated import dra_health_v1beta1_pb2 as hpb
from neuron_dra.driver.daemon._generated import pluginregistration_pb2 as rpb
from neuron_dra.driver.daemon.h2grpc import CallContext, StatusCode
from tests.support.driver import short_dir

REGISTRATION = rpb.DESCRIPTOR.services_by_name["Registration"]
HEALTH = hpb.DESCRIPTOR.services_by_name["DRAResourceHealth"]
GET_INFO = "/pluginregistration.Registration/GetInfo"
NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
WATCH = "/v1beta1.DRAResourceHealth/NodeWatchResources"


@dataclass
class Behaviour:
    """What the test servicer does: GetInfo answers an endpoint of `endpoint_size` bytes after `delay` seconds."""

    endpoint_size: int = 10
    delay: float = 0.0
    seen_remaining: list[float | None] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # "cancelled" / "ended" per call, from the end callbacks
    stream_messages: int = 3
    started: threading.Event = field(default_factory=threading.Event)


class Servicer:
    def __init__(self, b: Behaviour) -> None:
        self.b = b

    def GetInfo(self, request: Any, context: CallContext) -> Any:
        self.b.seen_remaining.append(context.time_remaining())
        context.add_callback(lambda: self.b.ended.append("cancelled" if context.cancelled else "ended"))
        self.b.started.set()
        end = time.monotonic() + self.b.delay
        while time.monotonic() < end and context.is_active():
            time.sleep(0.01)
        return rpb.PluginInfo(type="DRAPlugin", name="t", endpoint="x" * self.b.endpoint_size)

    def NotifyRegistrationStatus(self, request: Any, context: CallContext) -> Any:
        if not request.plugin_registered:
            context.abort(StatusCode.FAILED_PRECONDITION, f"refused: {request.error}")
        if request.error == "boom":
            raise ValueError("boom in the handler")
        return rpb.RegistrationStatusResponse()

    def NodeWatchResources(self, request: Any, context: CallContext) -> Iterator[Any]:
        context.add_callback(lambda: self.b.ended.append("cancelled" if context.cancelled else "ended"))
        for i in range(self.b.stream_messages):
            yield hpb.NodeWatchResourcesResponse(devices=[hpb.DeviceHealth(message=f"m{i}")])
        self.b.started.set()
        while context.is_active():
            time.sleep(0.01)


@dataclass
class Running:
    server: h2grpc.Server
    path: Path
    behaviour: Behaviour
    channel: grpc.Channel

    def unary(self, path: str) -> Any:
        return self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)


@pytest.fixture
def running() -> Iterator[Running]:
    with short_dir() as d:
        b = Behaviour()
        server = h2grpc.Server("t", max_workers=2, max_concurrent=3, max_message=64 * 1024)
        server.add_service(REGISTRATION, Servicer(b))
        server.add_service(HEALTH, Servicer(b))
        path = d / "t.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        channel = grpc.insecure_channel(f"unix://{path}")
        try:
            yield Running(server, path, b, channel)
        finally:
            channel.close()
            server.stop(1)


def idle(server: h2grpc.Server, timeout: float = 3.0) -> bool:
    """No call in progress within `timeout` (a worker releases its call just after sending the last frame)."""
    end = time.monotonic() + timeout
    while server.active_calls and time.monotonic() < end:
        time.sleep(0.01)
    return server.active_calls == 0


def code_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, **kwargs)
    return e.value.code(), e.value.details() or ""


def test_unary_call_and_statuses_through_grpcio(running: Running) -> None:
    info = rpb.PluginInfo.FromString(running.unary(GET_INFO)(rpb.InfoRequest().SerializeToString(), timeout=5))
    assert (info.type, info.endpoint) == ("DRAPlugin", "x" * 10)
    # abort: the code and a message with characters that need percent-encoding, as sent
    refused = rpb.RegistrationStatus(plugin_registered=False, error="ünïcode 100% \n").SerializeToString()
    assert code_of(running.unary(NOTIFY), refused, timeout=5) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                                   "refused: ünïcode 100% \n")
    # an exception in the handler: UNKNOWN naming it, and the server keeps serving
    boom = rpb.RegistrationStatus(plugin_registered=True, error="boom").SerializeToString()
    code, details = code_of(running.unary(NOTIFY), boom, timeout=5)
    assert code is grpc.StatusCode.UNKNOWN and "ValueError: boom in the handler" in details
    code, details = code_of(running.unary(GET_INFO), b"\xff", timeout=5)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "pluginregistration.InfoRequest" in details
    code, details = code_of(running.unary("/pluginregistration.Registration/Nope"), b"", timeout=5)
    assert code is grpc.StatusCode.UNIMPLEMENTED and "/pluginregistration.Registration/Nope" in details
    assert idle(running.server)


def test_request_over_the_limit_is_resource_exhausted(running: Running) -> None:
    code, details = code_of(running.unary(GET_INFO), b"\x0a" * (200 * 1024), timeout=5)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "65536" in details
    assert running.unary(GET_INFO)(b"", timeout=5)  # the connection still serves
    assert idle(running.server)


def test_large_response_respects_flow_control(running: Running) -> None:
    """1 MiB is 16 times the initial HTTP/2 window: the server must wait for the client's WINDOW_UPDATEs."""
    running.behaviour.endpoint_size = 1024 * 1024
    info = rpb.PluginInfo.FromString(running.unary(GET_INFO)(b"", timeout=10))
    assert info.endpoint == "x" * (1024 * 1024)


def test_deadline_reaches_the_handler_and_expiry_cancels_it(running: Running) -> None:
    running.behaviour.delay = 5.0
    start = time.monotonic()
    code, _ = code_of(running.unary(GET_INFO), b"", timeout=0.5)
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    remaining = running.behaviour.seen_remaining[0]
    # The client's 0.5 s, less the time to get here. grpc-core keeps deadlines in whole milliseconds, rounded up,
    # so the grpc-timeout it sends can be "501m": CI saw 0.5008 s. 10 ms is the slack for that, not for delay.
    assert remaining is not None and 0 < remaining <= 0.51
    assert idle(running.server) and time.monotonic() - start < 2.5  # not the handler's 5 s
    # The end callbacks ran once: "cancelled" when the client's RST_STREAM came first, "ended" when the server saw
    # the deadline pass first (is_active() turned false at the deadline either way).
    assert running.behaviour.ended in (["cancelled"], ["ended"])


def test_calls_beyond_the_bound_are_resource_exhausted_at_once(running: Running) -> None:
    running.behaviour.delay = 2.5  # long enough for all 5 to be in flight at once, even on a loaded machine
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(running.unary(GET_INFO)(b"", timeout=10))
        except grpc.RpcError as e:
            results.append(e.code())

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2  # bound 3: 2 workers + 1 queued
    assert sum(isinstance(r, bytes) for r in results) == 3
    assert idle(running.server)


def test_server_streaming_and_cancellation(running: Running) -> None:
    call = running.channel.unary_stream(WATCH, request_serializer=None, response_deserializer=None)(b"", timeout=30)
    got = [hpb.NodeWatchResourcesResponse.FromString(next(call)).devices[0].message for _ in range(3)]
    assert got == ["m0", "m1", "m2"]
    assert running.behaviour.started.wait(5)
    assert running.server.active_calls == 1
    call.cancel()
    assert idle(running.server)
    assert running.behaviour.ended == ["cancelled"]


class RawClient:
    """HTTP/2 frames by hand (h2 client side), for what grpcio's client never sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(str(path))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def events(self, until: type, timeout: float = 5) -> list[Any]:
        out: list[Any] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            data = self.sock.recv(65536)
            if not data:
                out.append("closed")
                return out
            got = self.conn.receive_data(data)
            self.flush()
            out += got
            if any(isinstance(e, until) for e in got):
                return out
        raise AssertionError(f"no {until.__name__} in {out}")

    def request(self, path: str, content_type: bytes = b"application/grpc", body: bytes = b"\0\0\0\0\0") -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                                     (b":authority", b"x"), (b"content-type", content_type), (b"te", b"trailers")])
        self.conn.send_data(sid, body, end_stream=True)
        self.flush()
        return sid

    def close(self) -> None:
        self.sock.close()


def headers_of(events: list[Any]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for e in events:
        if isinstance(e, h2.events.ResponseReceived | h2.events.TrailersReceived):
            out.update((bytes(k), bytes(v)) for k, v in e.headers)
    return out


def test_trailers_only_errors_content_type_ping_and_goaway(running: Running) -> None:
    raw = RawClient(running.path)
    try:
        raw.request("/no/Such")
        events = raw.events(h2.events.StreamEnded)
        # Trailers-Only: one HEADERS frame with the status, no DATA
        assert not [e for e in events if isinstance(e, h2.events.DataReceived)]
        assert [isinstance(e, h2.events.ResponseReceived) for e in events].count(True) == 1
        h = headers_of(events)
        assert (h[b":status"], h[b"content-type"], h[b"grpc-status"]) == (b"200", b"application/grpc", b"12")
        raw.request(GET_INFO, content_type=b"text/plain")
        assert headers_of(raw.events(h2.events.StreamEnded))[b":status"] == b"415"
        raw.request(GET_INFO, body=b"\0\0\0\0\x09abc")  # the prefix promises 9 bytes, 3 arrive
        assert headers_of(raw.events(h2.events.StreamEnded))[b"grpc-status"] == str(int(StatusCode.INTERNAL)).encode()
        raw.conn.ping(b"12345678")
        raw.flush()
        acks = raw.events(h2.events.PingAckReceived)
        assert [e.ping_data for e in acks if isinstance(e, h2.events.PingAckReceived)] == [b"12345678"]
        sid = raw.request(GET_INFO)
        ok = raw.events(h2.events.StreamEnded)
        assert headers_of(ok)[b"grpc-status"] == b"0" and sid == 7
        stopper = threading.Thread(target=running.server.stop, args=(1,))
        stopper.start()
        events = raw.events(h2.events.ConnectionTerminated)
        stopper.join(5)
        goaway = next(e for e in events if isinstance(e, h2.events.ConnectionTerminated))
        assert goaway.error_code == 0 and goaway.last_stream_id == sid
    finally:
        raw.close()


def test_garbage_on_the_connection_closes_it_and_the_server_keeps_serving(running: Running) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(running.path))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 1000)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    assert b"\x07" in received[:200]  # a GOAWAY frame (type 7) before the close
    assert running.unary(GET_INFO)(b"", timeout=5)


def test_call_unary_client(running: Running) -> None:
    info = rpb.PluginInfo.FromString(h2grpc.call_unary(str(running.path), GET_INFO, b"", 5))
    assert info.type == "DRAPlugin"
    with pytest.raises(h2grpc.RpcError) as e:
        h2grpc.call_unary(str(running.path), NOTIFY, rpb.RegistrationStatus(error="x").SerializeToString(), 5)
    assert (e.value.code, e.value.details) == (StatusCode.FAILED_PRECONDITION, "refused: x")
    with pytest.raises(h2grpc.RpcError) as e:
        h2grpc.call_unary(str(running.path.with_name("none.sock")), GET_INFO, b"", 5)
    assert e.value.code is StatusCode.UNAVAILABLE
    running.behaviour.delay = 3
    with pytest.raises(h2grpc.RpcError) as e:
        h2grpc.call_unary(str(running.path), GET_INFO, b"", 0.3)
    assert e.value.code is StatusCode.DEADLINE_EXCEEDED


def test_many_concurrent_calls_on_one_connection_with_cancellations_and_large_answers() -> None:
    """One channel (as kubelet holds one connection): concurrent small, large (flow-controlled) and abandoned
    calls interleave; every call ends, none hangs, and the server is idle afterwards."""
    with short_dir() as d:
        b = Behaviour(endpoint_size=200 * 1024, delay=0.0)
        server = h2grpc.Server("stress", max_workers=4, max_concurrent=64, max_message=64 * 1024)
        server.add_service(REGISTRATION, Servicer(b))
        path = d / "s.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        outcomes: list[str] = []
        lock = threading.Lock()
        try:
            with grpc.insecure_channel(f"unix://{path}") as channel:
                call = channel.unary_unary(GET_INFO, request_serializer=None, response_deserializer=None)

                def worker(k: int) -> None:
                    for i in range(15):
                        try:
                            # every third call gets a deadline too short for a 200 KiB answer to arrive at times
                            raw = call(b"", timeout=0.005 if (k + i) % 3 == 0 else 10)
                            result = "ok" if len(rpb.PluginInfo.FromString(raw).endpoint) == 200 * 1024 else "bad"
                        except grpc.RpcError as e:
                            result = e.code().name
                        with lock:
                            outcomes.append(result)

                threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
                start = time.monotonic()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                assert not any(t.is_alive() for t in threads), "calls hung"
                assert time.monotonic() - start < 60
            assert len(outcomes) == 16 * 15
            assert set(outcomes) <= {"ok", "DEADLINE_EXCEEDED"}, set(outcomes)
            assert outcomes.count("ok") >= 16 * 10  # all the calls with a 10 s deadline
            assert idle(server)
        finally:
            server.stop(1)


def test_idle_connections_are_closed_but_not_while_a_call_runs() -> None:
    """The health port's setting: a connection without calls goes after idle_timeout (GOAWAY, close), so idle
    connections cannot use up max_connections; one waiting for a slow answer stays."""
    with short_dir() as d:
        b = Behaviour(delay=0.8)
        server = h2grpc.Server("idle", max_workers=2, max_concurrent=4, idle_timeout=0.3)
        server.add_service(REGISTRATION, Servicer(b))
        path = d / "i.sock"
        server.add_socket(h2grpc.listening_socket(socket.AF_UNIX, str(path)))
        server.start()
        try:
            raw = RawClient(path)
            start = time.monotonic()
            events = raw.events(h2.events.ConnectionTerminated, timeout=5)
            assert 0.25 < time.monotonic() - start < 3
            assert next(e for e in events if isinstance(e, h2.events.ConnectionTerminated)).error_code == 0
            raw.close()
            info = rpb.PluginInfo.FromString(h2grpc.call_unary(str(path), GET_INFO, b"", 5))  # 0.8 s > 0.3 s idle
            assert info.type == "DRAPlugin"
        finally:
            server.stop(1)


def connection_threads(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name in (f"{name}-conn", f"{name}-call"))


def test_calls_run_on_the_connections_threads_and_those_stay_few(running: Running) -> None:
    """The reader answers a call itself and hands the reading to a parked thread: sequential calls alternate
    between two threads; a burst of concurrent calls adds threads, which end after their calls, back to two."""
    for _ in range(50):
        assert running.unary(GET_INFO)(b"", timeout=5)
    assert connection_threads("t") == 2  # one reading, one parked
    running.behaviour.delay = 0.3
    threads = [threading.Thread(target=lambda: running.unary(GET_INFO)(b"", timeout=10)) for _ in range(3)]
    for t in threads:
        t.start()
    assert running.behaviour.started.wait(5)
    time.sleep(0.1)
    assert connection_threads("t") >= 3  # two calls running (the server's 2 worker slots) and a reader
    for t in threads:
        t.join(10)
    running.behaviour.delay = 0.0
    # Back to a reader and one or two parked threads (two when a call ended while the next reader had not yet
    # taken over), and no growth with further calls.
    for _ in range(20):
        assert running.unary(GET_INFO)(b"", timeout=5)
    assert 2 <= connection_threads("t") <= 3
