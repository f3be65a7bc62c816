"""The health port's TCP front (tcpfront.py): forwards bytes both ways once a preface's worth arrived, closes the
least recently active connection not forwarded for a new one beyond its limit, and ends connections at their
lifetime or byte limit."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from neuron_dra.driver.kubeletplugin._tcpfront import FORWARD_BYTES, Front, FrontLimits, Lanes

T = TypeVar("T")


def run(limits: FrontLimits, body: Callable[[Front, int], T], clock: Callable[[], float] = time.monotonic) -> T:
    """`body(front, port)` in a thread while the front runs in an event loop, forwarding to an echo server."""
    name = f"\0neuron-dra-test-{os.getpid()}-{secrets.token_hex(4)}"

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
        writer.close()

    async def main() -> T:
        backend = await asyncio.start_unix_server(echo, name)
        front = Front(name, limits, clock=clock)
        port = await front.listen("127.0.0.1", 0)
        await front.start()
        try:
            result: Awaitable[T] = asyncio.get_running_loop().run_in_executor(None, body, front, port)
            return await result
        finally:
            await front.close()
            backend.close()

    return asyncio.run(main())


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def closed(s: socket.socket) -> bool:
    s.settimeout(3)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bytes_are_forwarded_both_ways_once_a_preface_arrived() -> None:
    def body(front: Front, port: int) -> bytes:
        with connect(port) as s:
            s.sendall(b"x" * (FORWARD_BYTES - 1))
            time.sleep(0.2)
            assert front.connections == 1 and not front._forwarded  # not forwarded yet
            s.sendall(b"yz")
            got = b""
            while len(got) < FORWARD_BYTES + 1:
                got += s.recv(4096)
            return got

    assert run(FrontLimits(), body) == b"x" * (FORWARD_BYTES - 1) + b"yz"


def test_a_new_connection_beyond_the_limit_closes_the_least_recently_active_waiting_one() -> None:
    def body(front: Front, port: int) -> None:
        forwarded = connect(port)
        forwarded.sendall(b"p" * FORWARD_BYTES)  # forwarded: closed only when no waiting connection is left
        time.sleep(0.2)
        idle = [connect(port) for _ in range(3)]
        time.sleep(0.2)
        idle[0].sendall(b"a")  # activity: idle[1] is now the least recently active
        time.sleep(0.2)
        newest = connect(port)
        assert closed(idle[1])
        assert front.evicted == 1 and front.connections == 4
        newest.sendall(b"q" * FORWARD_BYTES)
        assert newest.recv(FORWARD_BYTES) == b"q" * FORWARD_BYTES  # the new one works
        for s in (forwarded, newest, *idle):
            s.close()

    run(FrontLimits(max_connections=4), body)


class FakeClock:
    """The front's clock, set by the test; counts its reads, so the test can wait for the sweep to have read it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0
        self._changed = threading.Condition()

    def __call__(self) -> float:
        with self._changed:
            self.reads += 1
            self._changed.notify_all()
            return self.now

    def set(self, now: float) -> None:
        with self._changed:
            self.now = now

    def read_again(self, times: int) -> bool:
        with self._changed:
            target = self.reads + times
            return self._changed.wait_for(lambda: self.reads >= target, timeout=30)


def test_connections_end_at_their_lifetime_and_their_byte_limit() -> None:
    clock = FakeClock()

    def body(front: Front, port: int) -> None:
        quiet = connect(port)  # accepted at 0.0 on the fake clock
        chatty = connect(port)
        chatty.sendall(b"c" * 2048)  # over the 1 KiB limit
        assert closed(chatty) and front.cut == 1
        clock.set(0.9)
        # only the sweep reads the clock now: at the second read, a whole sweep has run at 0.9
        assert clock.read_again(2)
        assert front.expired == 0 and front.connections == 1  # the quiet one is kept before its lifetime ends
        clock.set(1.1)
        assert closed(quiet) and front.expired == 1

    run(FrontLimits(lifetime=1.0, max_bytes=1024), body, clock)


def test_limits_shrink_with_the_open_files_limit() -> None:
    assert FrontLimits.for_open_files(1 << 20) == FrontLimits()
    small = FrontLimits.for_open_files(1024)
    assert small.max_connections + 2 * small.max_forwarded <= 1024 - 512
    assert small.max_forwarded >= 8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CALL = 0x1, 0x4  # HEADERS, END_HEADERS (no END_STREAM: the echo never ends the call)


def test_a_connection_with_a_call_in_flight_is_not_closed_for_another_which_waits() -> None:
    """Issue 42: beyond the forwarded connections the front closed the least recently active one, the probe awaiting
    its answer. Now a newcomer waits (not read) for a slot; it is forwarded when the one in flight ends."""
    def body(front: Front, port: int) -> None:
        busy = connect(port)
        busy.sendall(PREFACE + frame(*CALL, 1))
        assert busy.recv(64)  # the echo: forwarded, one call in flight
        newcomer = connect(port)
        newcomer.sendall(PREFACE)
        wait(lambda: front.counts()["open"]["queued"] == 1)
        assert front.evicted == 0 and front.counts()["calls"]["in_flight"] == 1
        busy.sendall(b"x")
        assert busy.recv(1) == b"x"  # still served
        busy.close()
        assert newcomer.recv(len(PREFACE)) == PREFACE  # forwarded once the slot was free
        newcomer.close()

    run(FrontLimits(max_forwarded=1, max_forwarded_per_peer=1), body)


def test_calls_over_the_per_connection_limit_close_it_and_are_exported_by_reason() -> None:
    from prometheus_client import generate_latest

    from neuron_dra.driver.daemon.observability.metrics import Metrics

    def body(front: Front, port: int) -> bytes:
        s = connect(port)
        s.sendall(PREFACE + frame(*CALL, 1) + frame(*CALL, 3))
        assert closed(s)
        metrics = Metrics()
        metrics.health_front(lambda: {"other": front.counts()})
        return generate_latest(metrics.registry)

    text = run(FrontLimits(max_calls=1), body).decode()
    assert 'neuron_dra_health_front_closed_total{lane="other",reason="calls"} 1.0' in text
    assert 'neuron_dra_health_front_closed_total{lane="other",reason="evicted"} 0.0' in text


def test_a_peer_over_its_calls_at_once_is_held_and_released_as_calls_end() -> None:
    """A call beyond the peer's gate waits (its bytes kept, the connection not read) until a call of the peer ends."""
    def body(front: Front, port: int) -> None:
        first = connect(port)
        first.sendall(PREFACE + frame(*CALL, 1))
        assert first.recv(64)
        second = connect(port)
        second.sendall(PREFACE + frame(*CALL, 1))
        wait(lambda: front.counts()["open"]["held"] == 1)
        assert front.counts()["calls"]["in_flight"] == 1
        first.close()  # its call ends with it
        got = b""
        while len(got) < len(PREFACE) + 9:
            got += second.recv(64)
        assert got == PREFACE + frame(*CALL, 1)
        second.close()

    run(FrontLimits(call_gate_per_peer=1), body)


def wait(condition: Callable[[], bool]) -> None:
    """Until `condition` holds (the front's loop runs in another thread), at most 10 s."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_the_nodes_address_has_a_lane_of_its_own_that_a_stalled_full_lane_does_not_hold_up() -> None:
    """Issue 42: the probe's connection shared the listen queue and the event loop with the flood (the queue
    overflowed: SYNs dropped, a probe took 1-7 s to connect; the loop's turns took the flood's time). The node's
    address now has its own socket in the port's SO_REUSEPORT group (the kernel steers by source address) and its
    own front in its own thread: with the other lane's loop stopped and its queue full, the node's connections are
    still accepted and forwarded."""
    name = f"\0neuron-dra-test-{os.getpid()}-{secrets.token_hex(4)}"
    echo = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    echo.bind(name)
    echo.listen(64)

    def serve_echo() -> None:
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    threading.Thread(target=serve_echo, daemon=True).start()
    lanes = Lanes(name, "127.0.0.1", 0, ["127.0.0.1"], FrontLimits(backlog=4))
    stalled = threading.Event()
    release = threading.Event()
    others: list[socket.socket] = []
    try:
        lanes.start()
        assert lanes.lanes == ["other", "node"]
        # SO_REUSEPORT does not let a second daemon (a surge pod with the node's network) share the port
        with pytest.raises(OSError, match="Address already in use"):
            Lanes(name, "127.0.0.1", lanes.port, ["127.0.0.1"])
        other_loop = lanes.fronts["other"][1].loop

        def stall() -> None:  # the flooded lane's loop stops
            stalled.set()
            release.wait(30)

        other_loop.call_soon_threadsafe(stall)
        assert stalled.wait(10)
        for _ in range(16):  # its accept queue (4) fills: connections beyond it are not even acknowledged
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", lanes.port))
            others.append(s)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        probe.settimeout(5)
        probe.connect(("127.0.0.1", lanes.port))
        probe.sendall(b"p" * FORWARD_BYTES)
        got = b""
        while len(got) < FORWARD_BYTES:
            got += probe.recv(4096)
        assert got == b"p" * FORWARD_BYTES
        counts = lanes.counts()
        assert counts["node"]["open"]["forwarded"] == 1 and counts["other"]["open"]["forwarded"] == 0, counts
        probe.close()
    finally:
        release.set()
        for s in others:
            s.close()
        lanes.close()
        echo.close()


def test_the_steering_program_sends_each_listed_address_to_the_node_lane_and_no_other() -> None:
    """Both families: the v4 source word, the v6 source's four words; one word off is not a match."""
    from neuron_dra.driver.kubeletplugin._tcpfront import steering_program

    def run_program(program: list[tuple[int, int, int, int]], header: bytes) -> int:
        """A classic BPF interpreter for the instructions the program uses (the kernel's semantics)."""
        base = 0xFFFFFFFF & -0x100000
        a, pc = 0, 0
        while True:
            code, jt, jf, k = program[pc]
            if code == 0x20:
                off = k - base
                a = int.from_bytes(header[off:off + 4], "big")
            elif code == 0x30:
                a = header[k - base]
            elif code == 0x54:
                a &= k
            elif code == 0x15:
                pc += jt if a == k else jf
            elif code == 0x06:
                return k
            pc += 1

    def v4(src: str) -> bytes:
        return bytes([0x45]) + bytes(11) + socket.inet_aton(src) + bytes(4)

    def v6(src: str) -> bytes:
        return bytes([0x60]) + bytes(7) + socket.inet_pton(socket.AF_INET6, src) + bytes(16)

    program = steering_program(["10.0.0.7", "fd00::7", "192.168.1.1", "fd00::8"])
    assert [run_program(program, h) for h in (v4("10.0.0.7"), v4("192.168.1.1"), v4("10.0.0.8"))] == [1, 1, 0]
    assert [run_program(program, h) for h in (v6("fd00::7"), v6("fd00::8"), v6("fd00::9"), v6("fd01::7"))] == [
        1, 1, 0, 0]
    assert run_program(steering_program(["10.0.0.7"]), v6("fd00::7")) == 0
    assert run_program(steering_program(["fd00::7"]), v4("10.0.0.7")) == 0


def test_the_nodes_addresses_come_from_host_ip_or_the_flag_and_a_bad_one_names_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_dra.driver.daemon.options import parse_options

    env = {"NODE_NAME": "node-7"}
    assert parse_options([], env).node_addresses == ()
    assert parse_options([], env | {"HOST_IP": "10.0.0.1"}).node_addresses == ("10.0.0.1",)
    assert parse_options(["--node-address", "10.0.0.1, fd00::1"], env).node_addresses == ("10.0.0.1", "fd00::1")
    with pytest.raises(SystemExit):
        parse_options(["--node-address", "10.0.0.1,node-7"], env)
    err = capsys.readouterr().err
    assert "--node-address" in err and "'10.0.0.1,node-7' is not a comma-separated list of IP addresses" in err
