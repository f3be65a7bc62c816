"""Call floods on the health port (issue 42, finding 1), many connections from one process on non-blocking sockets,
HTTP/2 written by hand with hpack (an implementation independent of grpc). Run as a separate process:

    python -m tests.support.h2flood KIND TARGET SECONDS CONNECTIONS [SOURCE]

KIND: calls-unread (each connection sends Check("") calls back to back and never reads), liveness-read (each
connection sends 8 Check("liveness") calls, reads the 8 answers, closes; reopened). TARGET host:port; SOURCE the
address to connect from (another loopback address: another peer than the probe's). Every loop is bounded by
SECONDS. Prints one JSON line of counts when done.
"""

from __future__ import annotations

import bisect
import errno
import json
import select
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


def calls_block(body: bytes, n: int, per_write: int = 0) -> tuple[bytes, list[int]]:
    """The client's bytes of a connection making `n` calls (stream 1, 3, ...): the preface, an empty SETTINGS, then
    each call's HEADERS (indexed after the first) and its message with END_STREAM; and where each write ends
    (`per_write` calls a write, after the preface and SETTINGS in the first; 0: one write). The same for every
    connection (each has its own HPACK state), so it is built once: the flood spends its CPU on sending, not on
    encoding, which would take the daemon's share of a small machine."""
    enc = Encoder()
    out = [PREFACE, SETTINGS]
    ends = []
    size = len(PREFACE) + len(SETTINGS)
    for i in range(n):
        stream = 1 + 2 * i
        call = (frame(1, 0x4, stream, enc.encode(request_headers(HEALTH_CHECK)))
                + frame(0, 0x1, stream, grpc_message(body)))
        out.append(call)
        size += len(call)
        if per_write and (i + 1) % per_write == 0:
            ends.append(size)
    if not ends or ends[-1] != size:
        ends.append(size)
    return b"".join(out), ends


def open_socket(target: str, source: str | None) -> socket.socket:
    host, port = target.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    s.setblocking(False)
    code = s.connect_ex((host, int(port)))
    if code not in (0, errno.EINPROGRESS):
        s.close()
        raise OSError(code, "connect")
    return s


# More calls than the front lets one connection make (its calls and its bytes): the front ends each connection
# before the client would run out.
UNREAD_CALLS = 1200
GONE = select.POLLHUP | select.POLLERR | select.POLLRDHUP | select.POLLNVAL


def calls_unread(target: str, seconds: float, connections: int, source: str | None) -> dict[str, int]:
    """`connections` connections at once, each sending Check("") calls back to back (8 a write) as fast as the server
    reads them, never reading an answer; a connection the server ends is replaced by a new one."""
    counts = {"connections": 0, "calls": 0, "closed_by_server": 0, "connect_failed": 0}
    block, ends = calls_block(b"", UNREAD_CALLS, per_write=8)
    per_call = (len(block) - len(PREFACE) - len(SETTINGS)) / UNREAD_CALLS
    poller = select.poll()
    socks: dict[int, tuple[socket.socket, int]] = {}  # fd -> (socket, bytes of `block` sent)
    view = memoryview(block)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(min(OPENS_PER_TURN, connections - len(socks))):
            try:
                s = open_socket(target, source)
            except OSError:
                counts["connect_failed"] += 1
                break
            socks[s.fileno()] = (s, 0)
            poller.register(s, select.POLLOUT | select.POLLRDHUP)
            counts["connections"] += 1
        for fd, events in poller.poll(50):
            s, sent = socks[fd]
            if events & GONE:
                counts["closed_by_server"] += 1
                counts["calls"] += int(max(0, sent - len(PREFACE) - len(SETTINGS)) / per_call)
                poller.unregister(fd)
                s.close()
                del socks[fd]
                continue
            upto = ends[bisect.bisect_right(ends, sent)]  # where this write ends (all sent: not polled for)
            try:
                sent += s.send(view[sent:upto])
            except BlockingIOError:
                pass
            except OSError:
                continue  # reported as gone next
            socks[fd] = (s, sent)
            if sent == len(block):
                poller.modify(fd, select.POLLRDHUP)  # all sent: only its end is of interest
    for s, sent in socks.values():
        counts["calls"] += int(max(0, sent - len(PREFACE) - len(SETTINGS)) / per_call)
        s.close()
    return counts


class Conn:
    """A liveness-read connection: what is left to send, what was read."""

    def __init__(self, sock: socket.socket, out: bytes) -> None:
        self.sock = sock
        self.out = out
        self.answers = 0
        self.inbuf = bytearray()


def liveness_read(target: str, seconds: float, connections: int, source: str | None) -> dict[str, int]:
    counts = {"connections": 0, "calls": 0, "answered": 0, "serving": 0, "not_serving": 0, "closed_by_server": 0,
              "connect_failed": 0}
    serving = grpc_message(b"\x08\x01")
    not_serving = grpc_message(b"\x08\x02")
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, Conn] = {}
    block, _ = calls_block(b"\x0a\x08liveness", 8)  # HealthCheckRequest(service="liveness"), 8 calls

    def drop(c: Conn) -> None:
        sel.unregister(c.sock)
        c.sock.close()
        del conns[c.sock]

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(min(OPENS_PER_TURN, connections - len(conns))):
            try:
                c = Conn(open_socket(target, source), block)
            except OSError:
                counts["connect_failed"] += 1
                break
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
