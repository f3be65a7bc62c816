"""driver/kubeletplugin/_grpcserver.py in-process against grpcio's client, for both kinds of server (the event loop's
`Server` and the `ThreadedServer` of the DRA socket): statuses, the bound on running calls (held until the work ends,
also for a cancelled call), deadlines and end callbacks, streams, inline calls beside a full pool, socket files."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2 as hpb
from tests.support.driver import REPO, short_dir

CHECK = "/t.Health/Check"
WATCH = "/t.Health/Watch"
OK = hpb.HealthCheckResponse(status=hpb.HealthCheckResponse.SERVING)


@dataclass
class Servicer:
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    deadlines: list[float | None] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)
    stream_closed: threading.Event = field(default_factory=threading.Event)

    def Check(self, request: Any, context: grpcserver.CallContext) -> Any:
        self.deadlines.append(context.time_remaining())
        context.add_callback(self.ended.set)
        if request.service == "boom":
            raise ValueError("boom")
        if request.service == "abort":
            context.abort(grpcserver.StatusCode.NOT_FOUND, "no such service 'abort'")
        if request.service == "wait":
            self.started.release()
            self.release.wait(10)
        return OK

    def Watch(self, request: Any, context: grpcserver.CallContext) -> Iterator[Any]:
        try:
            while context.is_active():
                yield OK
                time.sleep(0.05)
        finally:
            self.stream_closed.set()


AnyServer = grpcserver.Server | grpcserver.ThreadedServer
KINDS = {"loop": grpcserver.Server, "threads": grpcserver.ThreadedServer}


@dataclass
class Running:
    server: AnyServer
    servicer: Servicer
    path: Path
    channel: grpc.Channel

    def check(self, service: str, timeout: float = 5) -> Any:
        return self.channel.unary_unary(CHECK, request_serializer=hpb.HealthCheckRequest.SerializeToString,
                                        response_deserializer=hpb.HealthCheckResponse.FromString)(
            hpb.HealthCheckRequest(service=service), timeout=timeout)


@pytest.fixture(params=list(KINDS))
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    servicer = Servicer()
    server: AnyServer = KINDS[request.param]("t", grpcserver.Limits(max_concurrent=2))
    methods = grpcserver.service_methods(hpb.DESCRIPTOR.services_by_name["Health"], servicer)
    server.add_methods({p.replace("/grpc.health.v1.", "/t."): m for p, m in methods.items()})
    with short_dir() as d:
        path = d / "t.sock"
        server.add_unix(path)
        server.start()
        channel = grpc.insecure_channel(f"unix:{path}")
        try:
            yield Running(server, servicer, path, channel)
        finally:
            servicer.release.set()
            channel.close()
            server.stop(1)


def code_of(fn: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    code: grpc.StatusCode = e.value.code()
    return code


def test_statuses(running: Running) -> None:
    assert running.check("").status == hpb.HealthCheckResponse.SERVING
    raw = running.channel.unary_unary(CHECK)
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\xff", timeout=5)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "grpc.health.v1.HealthCheckRequest" in (e.value.details() or "")
    assert code_of(lambda: running.check("boom")) is grpc.StatusCode.INTERNAL
    with pytest.raises(grpc.RpcError) as e:
        running.check("abort")
    assert e.value.code() is grpc.StatusCode.NOT_FOUND and e.value.details() == "no such service 'abort'"
    assert code_of(lambda: running.channel.unary_unary("/t.Health/Nope")(b"", timeout=5)) \
        is grpc.StatusCode.UNIMPLEMENTED


def test_the_deadline_reaches_the_handler_and_end_callbacks_run(running: Running) -> None:
    running.check("", timeout=7)
    remaining = running.servicer.deadlines[-1]
    # grpc sends the timeout rounded up to its wire unit and the server adds it to its own clock: a few ms over.
    assert remaining is not None and 5 < remaining <= 7.5
    assert running.servicer.ended.wait(2)
    running.check("")  # no deadline from grpcio's client without a timeout is None; with one, as above
    running.servicer.ended.clear()
    with pytest.raises(grpc.RpcError) as e:
        running.check("wait", timeout=0.5)
    assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert running.servicer.ended.wait(2)  # the call ended while its handler still ran


def test_running_calls_are_bounded_until_their_work_ends(running: Running) -> None:
    """Two handlers block (the bound is 2); their callers give up; the third call is still refused while the
    abandoned work runs, and admitted once it has ended."""
    futures = [running.channel.unary_unary(CHECK).future(hpb.HealthCheckRequest(service="wait").SerializeToString(),
                                                         timeout=10) for _ in range(2)]
    for _ in range(2):
        assert running.servicer.started.acquire(timeout=5)
    for f in futures:
        f.cancel()
    time.sleep(0.3)
    with pytest.raises(grpc.RpcError) as e:
        running.check("", timeout=5)  # goes to the pool like any call not marked inline
    assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "2 calls" in (e.value.details() or "")
    running.servicer.release.set()
    deadline = time.monotonic() + 5
    while running.server.active_calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.server.active_calls == 0
    assert running.check("").status == hpb.HealthCheckResponse.SERVING


def test_a_cancelled_stream_runs_its_generators_cleanup(running: Running) -> None:
    call = running.channel.unary_stream(WATCH, request_serializer=hpb.HealthCheckRequest.SerializeToString,
                                        response_deserializer=hpb.HealthCheckResponse.FromString)(
        hpb.HealthCheckRequest(), timeout=10)
    got = [next(call), next(call)]
    assert all(r.status == hpb.HealthCheckResponse.SERVING for r in got)
    call.cancel()
    assert running.servicer.stream_closed.wait(5)
    deadline = time.monotonic() + 5
    while running.server.active_calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.server.active_calls == 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_inline_methods_answer_while_the_pool_is_full(kind: str) -> None:
    servicer = Servicer()
    server: AnyServer = KINDS[kind]("t", grpcserver.Limits(max_concurrent=1))
    methods = grpcserver.service_methods(hpb.DESCRIPTOR.services_by_name["Health"], servicer,
                                         {"Check": lambda r: r.service == ""})
    server.add_methods(methods)
    with short_dir() as d:
        server.add_unix(d / "i.sock")
        server.start()
        try:
            with grpc.insecure_channel(f"unix:{d / 'i.sock'}") as channel:
                check = channel.unary_unary("/grpc.health.v1.Health/Check")
                busy = check.future(hpb.HealthCheckRequest(service="wait").SerializeToString(), timeout=10)
                assert servicer.started.acquire(timeout=5)
                # in order: the inline check is answered while the busy call still holds the only slot
                assert hpb.HealthCheckResponse.FromString(check(b"", timeout=30)).status == 1
                assert not busy.done()
                servicer.release.set()
                busy.result(timeout=5)
        finally:
            server.stop(1)


# A child that stops its server while a handler never ends, then returns from its script.
_EXIT_WITH_A_HANDLER_RUNNING = """
import sys, threading
import grpc
from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2 as hpb
from tests.driver.kubeletplugin.test_grpcserver import KINDS, Servicer
class Forever(Servicer):
    def Check(self, request, context):
        self.started.release()
        threading.Event().wait()  # nothing sets it
servicer = Forever()
server = KINDS[sys.argv[1]]("t", grpcserver.Limits(max_concurrent=2))
server.add_methods(grpcserver.service_methods(hpb.DESCRIPTOR.services_by_name["Health"], servicer))
server.add_unix(sys.argv[2])
server.start()
channel = grpc.insecure_channel("unix:" + sys.argv[2])
busy = channel.unary_unary("/grpc.health.v1.Health/Check").future(
    hpb.HealthCheckRequest(service="wait").SerializeToString(), timeout=600)
assert servicer.started.acquire(timeout=30)
server.stop(0)
print("stopped", flush=True)
"""


@pytest.mark.process
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_handler_still_running_does_not_hold_the_process_exit(kind: str) -> None:
    # Handlers run on daemon threads: a prepare blocked on the API server or the other instance's lock when the
    # daemon stops must not keep the interpreter from exiting (a pool's threads are joined at exit).
    with short_dir() as d:
        done = subprocess.run([sys.executable, "-c", _EXIT_WITH_A_HANDLER_RUNNING, kind, str(d / "x.sock")],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


@pytest.mark.parametrize("kind", list(KINDS))
def test_unix_socket_is_private_and_removed_on_stop(kind: str) -> None:
    server: AnyServer = KINDS[kind]("t", grpcserver.Limits(max_concurrent=1))
    with short_dir() as d:
        path = d / "s.sock"
        server.add_unix(path)
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        server.start()
        server.stop(0)
        assert not path.exists()
        with pytest.raises(OSError, match="cannot listen on"):
            KINDS[kind]("u", grpcserver.Limits(max_concurrent=1)).add_unix(d / "missing" / "s.sock")


def test_a_tcp_port_is_not_shared_with_a_second_server() -> None:
    first = grpcserver.Server("a", grpcserver.Limits(max_concurrent=1))
    second = grpcserver.Server("b", grpcserver.Limits(max_concurrent=1))
    try:
        port = first.add_tcp("127.0.0.1", 0)
        first.start()
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            second.add_tcp("127.0.0.1", port)
    finally:
        first.stop(0)
        second.stop(0)


def test_servers_given_one_event_loop_share_it_and_a_stopped_one_leaves_it_running() -> None:
    """grpc.aio's poller wakes every bound loop for every completion: the daemon runs all its servers in one."""
    loop = grpcserver.EventLoopThread("shared-loop")
    servicer = Servicer()
    first = grpcserver.Server("first", grpcserver.Limits(max_concurrent=1), loop)
    first.add_service(hpb.DESCRIPTOR.services_by_name["Health"], servicer)
    second = grpcserver.Server("second", grpcserver.Limits(max_concurrent=1), loop)
    try:
        assert first._loop is second._loop is loop.loop
        with short_dir() as d:
            first.add_unix(d / "f.sock")
            first.start()
            second.stop(0)
            assert loop.running  # not the second server's to end
            with grpc.insecure_channel(f"unix:{d / 'f.sock'}") as channel:
                check = channel.unary_unary("/grpc.health.v1.Health/Check")
                answer = hpb.HealthCheckResponse.FromString(check(b"", timeout=5))
                assert answer.status == hpb.HealthCheckResponse.SERVING

            async def from_the_loop() -> None:
                nothing = asyncio.sleep(0)
                try:
                    first.run(nothing)
                finally:
                    nothing.close()

            with pytest.raises(RuntimeError, match="from its event loop"):
                asyncio.run_coroutine_threadsafe(from_the_loop(), loop.loop).result(5)
    finally:
        first.stop(0)
        second.stop(0)
        loop.close()
    assert not loop.running
    assert "shared-loop" not in [t.name for t in threading.enumerate()]


def test_a_server_without_a_loop_runs_its_own_and_ends_it_on_stop() -> None:
    server = grpcserver.Server("alone", grpcserver.Limits(max_concurrent=1))
    assert "alone-grpc" in [t.name for t in threading.enumerate()]
    server.stop(0)
    assert "alone-grpc" not in [t.name for t in threading.enumerate()]


def test_the_daemon_pool_runs_work_on_daemon_threads_and_cancels_what_waits_at_shutdown() -> None:
    pool = grpcserver.DaemonThreadPool(1, "p")
    release, started = threading.Event(), threading.Event()

    def busy() -> str:
        started.set()
        release.wait(30)
        return threading.current_thread().name if threading.current_thread().daemon else "not a daemon thread"

    running = pool.submit(busy)
    assert started.wait(10)
    waiting = pool.submit(str, "never")
    try:
        pool.shutdown(wait=False, cancel_futures=True)
        assert waiting.cancelled()  # at once, while the only thread is still busy
        with pytest.raises(RuntimeError, match="shut down"):
            pool.submit(str, "late")
    finally:
        release.set()
    assert running.result(10) == "p_0"
    boom = grpcserver.DaemonThreadPool(1, "q")
    with pytest.raises(ZeroDivisionError):
        boom.submit(lambda: 1 / 0).result(10)
    boom.shutdown()
