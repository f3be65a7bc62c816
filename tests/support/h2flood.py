"""Call floods on the health port (issue 42, finding 1), many connections from one process on non-blocking sockets,
HTTP/2 written by hand with hpack (an implementation independent of grpc). Run as a separate process:

    python -m tests.support.h2flood KIND TARGET SECONDS CONNECTIONS [SOURCE]

KIND: calls-unread (each connection sends Check("") calls back to back and never reads), liveness-read (each
connection sends 8 Check("liveness") calls, reads the 8 answers, closes; reopened). TARGET host:port; SOURCE the
address to connect from (another loopback address: another peer than the probe's). Every loop is bounded by
SECONDS. Prints one JSON line of counts when done.
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import struct
import sys
import time

from hpack import Encoder

from tests.support.h2attack import HEALTH_CHECK, PREFACE, request_headers

SETTINGS = struct.pack(">I", 0)[1:] + bytes([4, 0]) + struct.pack(">I", 0)  # an empty SETTINGS frame
SETTINGS_ACK = struct.pack(">I", 0)[1:] + bytes([4, 1]) + struct.pack(">I", 0)
OPENS_PER_TURN = 200


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


class Conn:
    """One connection's calls: HEADERS (indexed after the first) and the message with END_STREAM."""

    def __init__(self, sock: socket.socket, body: bytes) -> None:
        self.sock = sock
        enc = Encoder()
        self.first = enc.encode(request_headers(HEALTH_CHECK))
        self.again = enc.encode(request_headers(HEALTH_CHECK))
        self.message = grpc_message(body)
        self.stream = 1
        self.out = PREFACE + SETTINGS
        self.answers = 0
        self.inbuf = bytearray()

    def calls(self, n: int) -> bytes:
        out = b""
        for _ in range(n):
            block = self.first if self.stream == 1 else self.again
            out += frame(1, 0x4, self.stream, block) + frame(0, 0x1, self.stream, self.message)
            self.stream += 2
        return out


def open_conn(target: str, source: str | None, body: bytes) -> Conn:
    host, port = target.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    s.setblocking(False)
    code = s.connect_ex((host, int(port)))
    if code not in (0, errno.EINPROGRESS):
        s.close()
        raise OSError(code, "connect")
    return Conn(s, body)


def calls_unread(target: str, seconds: float, connections: int, source: str | None) -> dict[str, int]:
    counts = {"connections": 0, "calls": 0, "closed_by_server": 0, "connect_failed": 0}
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, Conn] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(min(OPENS_PER_TURN, connections - len(conns))):
            try:
                c = open_conn(target, source, b"")
            except OSError:
                counts["connect_failed"] += 1
                break
            conns[c.sock] = c
            sel.register(c.sock, selectors.EVENT_WRITE)
            counts["connections"] += 1
        for key, _ in sel.select(0.05):
            c = conns[key.fileobj]  # type: ignore[index]
            if not c.out:
                c.out = c.calls(8)
                counts["calls"] += 8
            try:
                sent = c.sock.send(c.out)
                c.out = c.out[sent:]
            except BlockingIOError:
                pass
            except OSError:
                counts["closed_by_server"] += 1
                sel.unregister(c.sock)
                c.sock.close()
                del conns[c.sock]
    for s in conns:
        s.close()
    return counts


def liveness_read(target: str, seconds: float, connections: int, source: str | None) -> dict[str, int]:
    counts = {"connections": 0, "calls": 0, "answered": 0, "serving": 0, "not_serving": 0, "closed_by_server": 0,
              "connect_failed": 0}
    serving = grpc_message(b"\x08\x01")
    not_serving = grpc_message(b"\x08\x02")
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, Conn] = {}
    body = b"\x0a\x08liveness"  # HealthCheckRequest(service="liveness")

    def drop(c: Conn) -> None:
        sel.unregister(c.sock)
        c.sock.close()
        del conns[c.sock]

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(min(OPENS_PER_TURN, connections - len(conns))):
            try:
                c = open_conn(target, source, body)
            except OSError:
                counts["connect_failed"] += 1
                break
            c.out += c.calls(8)
            counts["calls"] += 8
            conns[c.sock] = c
            sel.register(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            counts["connections"] += 1
        for key, events in sel.select(0.05):
            c = conns.get(key.fileobj)  # type: ignore[call-overload]
            if c is None:
                continue
            try:
                if events & selectors.EVENT_WRITE and c.out:
                    c.out = c.out[c.sock.send(c.out):]
                    if not c.out:
                        sel.modify(c.sock, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    data = c.sock.recv(65536)
                    if not data:
                        raise ConnectionResetError
                    c.inbuf += data
            except BlockingIOError:
                continue
            except OSError:
                counts["closed_by_server"] += 1
                drop(c)
                continue
            while len(c.inbuf) >= 9:  # whole frames: count answers and trailers, acknowledge SETTINGS
                length = int.from_bytes(c.inbuf[:3], "big")
                if len(c.inbuf) < 9 + length:
                    break
                kind, flags, payload = c.inbuf[3], c.inbuf[4], bytes(c.inbuf[9:9 + length])
                del c.inbuf[:9 + length]
                if kind == 4 and not flags & 1:
                    c.out += SETTINGS_ACK
                    sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
                elif kind == 0:
                    counts["serving"] += payload == serving
                    counts["not_serving"] += payload == not_serving
                elif kind in (1, 3) and (flags & 1 or kind == 3):
                    c.answers += 1
                    counts["answered"] += 1
            if c.answers >= 8:
                drop(c)
    for s in conns:
        s.close()
    return counts


def main(argv: list[str]) -> int:
    kind, target, seconds, connections = argv[0], argv[1], float(argv[2]), int(argv[3])
    source = argv[4] if len(argv) > 4 else None
    flood = {"calls-unread": calls_unread, "liveness-read": liveness_read}[kind]
    print(json.dumps({"attack": kind, **flood(target, seconds, connections, source)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
