"""Prometheus metrics of the driver, in a registry of its own (no process-global state)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Prepare is expected in the low milliseconds; the claim GET can take longer.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
                   10.0, 45.0)


@dataclass
class MetricsServer:
    server: WSGIServer
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

    def serve(self, address: str, port: int) -> MetricsServer:
        """Serve /metrics over HTTP (port 0: a free port; see MetricsServer.port)."""
        server, thread = start_http_server(port, addr=address, registry=self.registry)
        return MetricsServer(server, thread)
