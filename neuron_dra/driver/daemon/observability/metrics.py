"""Prometheus metrics of the driver, in a registry of its own (no process-global state)."""

from __future__ import annotations

import contextlib
import io
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from neuron_dra.driver.daemon.observability.attribution import (
    AttributionCollector,
    Claims,
    Consumers,
    NodeDevices,
    Taints,
)
from neuron_dra.driver.model.partitions import CoreLayout

# Prepare is expected in the low milliseconds; the claim GET can take longer.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
                   10.0, 45.0)


# prometheus_client's own server starts a thread per connection: 1,500 idle connections made 1,510 threads and
# +37 MB. Here one thread (the server's) accepts every connection and reads request heads as they arrive
# (non-blocking, a selector); only a complete head goes to the pool of MAX_CONNECTIONS workers, which answer it and
# close. Each connection has REQUEST_SECONDS from its accept to its answer sent (a per-operation timeout let
# connections sending a byte every 4 s hold every worker) and MAX_HEAD_BYTES for its request line and headers; at
# most MAX_PENDING heads arrive at once, the oldest closed for a new one, so slow clients cannot keep a scrape out.
MAX_CONNECTIONS = 4
MAX_PENDING = 256
REQUEST_SECONDS = 5.0
MAX_HEAD_BYTES = 16 * 1024
_END_OF_HEAD = b"\r\n\r\n"
_SWEEP_SECONDS = 0.25


class _DeadlineWriter(io.RawIOBase):
    """The answer's writes on the connection, all within the request's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's time is over")
        self._sock.settimeout(left)
        self._sock.sendall(data)  # the timeout bounds the whole sendall (Python 3.5+)
        return len(data)


class _QuietHandler(WSGIRequestHandler):
    """Answers one request whose head has been read already: `request` is (socket, head, deadline)."""

    def setup(self) -> None:
        sock, head, deadline = self.request
        self.connection = sock
        self.rfile = io.BytesIO(head)  # what handle() reads: the head, nothing more
        self.wfile = _DeadlineWriter(sock, deadline)  # type: ignore[assignment]

    def finish(self) -> None:
        self.rfile.close()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


@dataclass
class _Pending:
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class BoundedWSGIServer(WSGIServer):
    """A WSGI server that reads request heads in its own thread and answers complete ones from a fixed pool,
    never more than `max_connections` at once, each connection within `request_seconds`."""

    request_queue_size = 128  # listen backlog

    def __init__(self, address: tuple[str, int], max_connections: int = MAX_CONNECTIONS,
                 request_seconds: float = REQUEST_SECONDS, max_pending: int = MAX_PENDING,
                 max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _QuietHandler)
        self.request_seconds = request_seconds
        self.max_pending = max_pending
        self.max_head_bytes = max_head_bytes
        self._slots = threading.BoundedSemaphore(max_connections)
        self._pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="metrics")
        self._pending: dict[socket.socket, _Pending] = {}  # accept order: the first is the oldest
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.refused = 0  # complete requests beyond the pool, and heads over the size limit
        self.expired = 0  # connections whose time ran out before their head was complete
        self.evicted = 0  # closed for a newer connection

    def serve_forever(self, poll_interval: float = _SWEEP_SECONDS) -> None:
        self._stopping.clear()
        self._stopped.clear()
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stopping.is_set():
                    for key, _ in selector.select(min(poll_interval, _SWEEP_SECONDS)):
                        if key.fileobj is self.socket:
                            self._accept(selector)
                        else:
                            assert isinstance(key.fileobj, socket.socket)
                            self._read(selector, key.fileobj)
                    self._expire(selector)
            finally:
                for sock in list(self._pending):
                    self._drop(selector, sock)
                self._stopped.set()

    def shutdown(self) -> None:
        self._stopping.set()
        self._stopped.wait()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(self.request_queue_size):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of files, a connection reset before accept: try again at the next event
                return
            sock.setblocking(False)
            if len(self._pending) >= self.max_pending:
                self.evicted += 1
                self._drop(selector, next(iter(self._pending)))
            self._pending[sock] = _Pending(time.monotonic() + self.request_seconds)
            selector.register(sock, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        pending = self._pending[sock]
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(selector, sock)
            return
        searched = max(0, len(pending.head) - len(_END_OF_HEAD) + 1)
        pending.head += data
        end = pending.head.find(_END_OF_HEAD, searched)
        if end < 0 and len(pending.head) <= self.max_head_bytes:
            return
        if end < 0 or end + len(_END_OF_HEAD) > self.max_head_bytes or not self._slots.acquire(blocking=False):
            self.refused += 1
            self._drop(selector, sock)
            return
        selector.unregister(sock)
        del self._pending[sock]
        head = bytes(pending.head[:end + len(_END_OF_HEAD)])
        try:
            self._pool.submit(self._answer, sock, head, pending.deadline)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._slots.release()
            sock.close()

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._pending and (oldest := next(iter(self._pending))) and self._pending[oldest].deadline <= now:
            self.expired += 1
            self._drop(selector, oldest)

    def _drop(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(sock)
        sock.close()

    def _answer(self, sock: socket.socket, head: bytes, deadline: float) -> None:
        try:
            sock.setblocking(True)
            self.finish_request((sock, head, deadline), sock.getpeername())  # type: ignore[arg-type]  # our handler's
        except Exception:  # a client that went away or ran out of time: nothing to do
            pass
        finally:
            sock.close()
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


FrontCounts = Callable[[], Mapping[str, Mapping[str, Mapping[str, int]]]]


class HealthFrontCollector(Collector):
    """The health port's fronts (kubeletplugin Lanes.counts: per lane, "node" for the node's own addresses and
    "other"), read at every scrape: connections closed by reason (evicted, expired, bytes, calls,
    calls_in_flight, unread, refused, backend), open by state, calls in flight."""

    def __init__(self, counts: FrontCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        lanes = self._counts()
        closed = CounterMetricFamily("neuron_dra_health_front_closed", "Connections to the health port the front "
                                     "closed, by lane and reason", labels=["lane", "reason"])
        open_ = GaugeMetricFamily("neuron_dra_health_front_connections", "Connections to the health port open, by "
                                  "lane and state (waiting: preface not complete, queued: for a forwarding slot, "
                                  "forwarded, held: a call held back)", labels=["lane", "state"])
        calls = GaugeMetricFamily("neuron_dra_health_front_calls_in_flight", "Health calls forwarded and not "
                                  "answered yet, by lane", labels=["lane"])
        for lane, counts in lanes.items():
            for reason, n in counts.get("closed", {}).items():
                closed.add_metric([lane, reason], n)
            for state, n in counts.get("open", {}).items():
                open_.add_metric([lane, state], n)
            calls.add_metric([lane], counts.get("calls", {}).get("in_flight", 0))
        yield closed
        yield open_
        yield calls


@dataclass
class MetricsServer:
    server: BoundedWSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.prepare_seconds = Histogram("neuron_dra_prepare_seconds", "Time to prepare one claim (including the "
                                         "claim GET)", buckets=LATENCY_BUCKETS, registry=r)
        self.unprepare_seconds = Histogram("neuron_dra_unprepare_seconds", "Time to unprepare one claim",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.errors = Counter("neuron_dra_errors", "Claims that failed, by operation and reason",
                              ["operation", "reason"], registry=r)
        self.published_devices = Gauge("neuron_dra_published_devices", "Devices in this node's published "
                                       "ResourceSlices", registry=r)
        self.prepared_claims = Gauge("neuron_dra_prepared_claims", "Claims prepared on this node (checkpoint "
                                     "entries)", registry=r)
        self.slice_writes = Counter("neuron_dra_resourceslice_writes", "ResourceSlice API writes, by verb",
                                    ["verb"], registry=r)
        self.api_errors = Counter("neuron_dra_api_errors", "Failed API server calls, by call", ["call"], registry=r)
        self.device_health = Gauge("neuron_dra_device_health", "Device health from the hardware error counters: "
                                   "1 healthy, 0 unhealthy, -1 unknown", ["device"], registry=r)
        self.device_health_changes = Counter("neuron_dra_device_health_changes", "Device health transitions, by "
                                             "device and new health", ["device", "health"], registry=r)
        self.tainted_devices = Gauge("neuron_dra_tainted_devices", "Devices carrying the unhealthy taint in this "
                                     "node's ResourceSlices", registry=r)

    def attribute(self, claims: Claims, node: str, indexes: Sequence[int], layout: CoreLayout,
                  taints: Taints | None = None, consumers: Consumers | None = None) -> AttributionCollector:
        """Add the per-claim attribution series (attribution.py), read from `claims` at every scrape."""
        collector = AttributionCollector(claims, node, NodeDevices(tuple(indexes), layout), taints,
                                         consumers=consumers)
        self.registry.register(collector)
        return collector

    def health_front(self, counts: FrontCounts) -> HealthFrontCollector:
        """Add the health front's series, read from `counts` at every scrape."""
        collector = HealthFrontCollector(counts)
        self.registry.register(collector)
        return collector

    def serve(self, address: str, port: int) -> MetricsServer:
        """Serve /metrics over HTTP (port 0: a free port; see MetricsServer.port)."""
        server = BoundedWSGIServer((address, port))
        server.set_app(make_wsgi_app(self.registry))
        thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
        thread.start()
        return MetricsServer(server, thread)
