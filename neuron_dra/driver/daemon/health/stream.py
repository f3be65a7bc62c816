"""kubelet's device health stream: the DRAResourceHealth service, in every version a kubelet may dial.

kubelets 1.34-1.36 dial `v1alpha1` when their ResourceHealthStatus gate is on, 1.37 picks `v1` or `v1alpha1`
from the registration, upstream's Go helper serves `v1beta1` (docs/kubelet-dra-protocol.md §3). The messages are
identical on the wire, so one servicer answers all three with the v1beta1 messages (grpcserver.py's raw bytes).
The stream sends the full device list at once, on every change, and at least every `heartbeat` seconds:
kubelet turns a device Unknown when no update came within its health check timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.kubeletplugin.toolkit import (
    CallContext,
    Method,
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    service_methods,
)
from neuron_dra.driver.kubeletplugin.toolkit import dra_health_v1beta1_pb2 as pb
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.health_source import Health
from neuron_dra.driver.model.taints import published_health

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30  # what we tell kubelet; kubelet's own default is the same
DEFAULT_HEARTBEAT_S = 10.0  # a third of the timeout: two lost beats still leave the device known
_WIRE = {Health.HEALTHY: pb.HEALTHY, Health.UNHEALTHY: pb.UNHEALTHY, Health.UNKNOWN: pb.UNKNOWN}


class HealthStreamService:
    """Serves NodeWatchResources for every version in HEALTH_PACKAGES from one HealthMonitor."""

    def __init__(self, monitor: HealthMonitor, host: NeuronHost, pool_name: str, stop: threading.Event,
                 timeout_s: int = DEFAULT_TIMEOUT_S, heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 cores_per_device: int = 0) -> None:
        self.monitor = monitor
        self.cores_per_device = cores_per_device  # core devices (partitions.py) report their device's health
        self.host = host
        self.pool_name = pool_name
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self._stop = stop
        self.active_streams = 0
        self._lock = threading.Lock()

    def response(self) -> pb.NodeWatchResourcesResponse:
        now = int(time.time())
        resp = pb.NodeWatchResourcesResponse()
        for name, h in sorted(published_health(self.host, self.monitor.current(), self.cores_per_device).items()):
            resp.devices.append(pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self.pool_name, device_name=name), health=_WIRE[h.health],
                last_updated_time=now, health_check_timeout_seconds=self.timeout_s, message=h.message))
        return resp

    def NodeWatchResources(self, request: Any, context: CallContext
                           ) -> Iterator[pb.NodeWatchResourcesResponse]:
        """The stream kubelet holds open (the request message is empty in every version)."""
        with self._lock:
            self.active_streams += 1
        log.info("kubelet opened the device health stream", extra={"pool": self.pool_name})
        try:
            version = self.monitor.version
            yield self.response()
            next_beat = time.monotonic() + self.heartbeat_s
            while context.is_active() and not self._stop.is_set():
                # Short waits so a closed stream or a stopping daemon frees this worker thread promptly.
                wait = max(0.0, min(1.0, next_beat - time.monotonic()))
                new_version = self.monitor.wait_for_change(version, wait)
                if new_version == version and time.monotonic() < next_beat:
                    continue
                version = new_version
                yield self.response()
                next_beat = time.monotonic() + self.heartbeat_s
        finally:
            with self._lock:
                self.active_streams -= 1
            log.info("device health stream closed", extra={"pool": self.pool_name})

    def methods(self) -> dict[str, Method]:
        """NodeWatchResources in every package of HEALTH_PACKAGES, for the DRA socket's server."""
        out: dict[str, Method] = {}
        for module in (dra_health_v1_pb2, pb, dra_health_v1alpha1_pb2):
            out.update(service_methods(module.DESCRIPTOR.services_by_name["DRAResourceHealth"], self))
        return out
