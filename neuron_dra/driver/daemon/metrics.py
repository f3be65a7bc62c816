"""Prometheus metrics of the driver, in a registry of its own (no process-global state)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from neuron_dra.driver.daemon.attribution import AttributionCollector, Claims, Consumers, NodeDevices, Taints
from neuron_dra.driver.model.partitions import CoreLayout

# Prepare is expected in the low milliseconds; the claim GET can take longer.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
                   10.0, 45.0)


# prometheus_client's own server starts a thread per connection: 1,500 idle connections made 1,510 threads and
# +37 MB. This one serves at most MAX_CONNECTIONS at once from a fixed pool; a connection beyond that is closed at
# once, and one that sends nothing is dropped after CONNECTION_TIMEOUT seconds.
MAX_CONNECTIONS = 4
CONNECTION_TIMEOUT = 5.0


class _QuietHandler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT  # socket timeout for reading the request and writing the answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


class BoundedWSGIServer(WSGIServer):
    """A WSGI server whose connections are handled by a fixed pool, never more than `max_connections` at once."""

    request_queue_size = 64  # listen backlog: excess connections are accepted and closed, not left to time out

    def __init__(self, address: tuple[str, int], max_connections: int = MAX_CONNECTIONS) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _QuietHandler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="metrics")
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        self._pool.submit(self._handle, request, client_address)

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # a client that went away or timed out: nothing to do
            pass
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


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

    def serve(self, address: str, port: int) -> MetricsServer:
        """Serve /metrics over HTTP (port 0: a free port; see MetricsServer.port)."""
        server = BoundedWSGIServer((address, port))
        server.set_app(make_wsgi_app(self.registry))
        thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
        thread.start()
        return MetricsServer(server, thread)
