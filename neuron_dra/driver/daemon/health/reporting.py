"""What happens when a device's health changes: ResourceSlice taints, Kubernetes Events, Prometheus metrics.

The HealthMonitor (health_monitor.py) hands changes to `HealthReporter.on_change` on a thread of its own. Events
go on the Node (namespace `default`, as kubelet records node events): `DeviceUnhealthy` (Warning) and `DeviceHealthy`
(Normal), with the counters in the message, so `kubectl describe node` and `kubectl get events` say what happened.
Failures to record an event are logged and never block the taint or the health stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.kubeletplugin.toolkit import ApiClient, KubeApi
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.health_source import DeviceHealth, Health
from neuron_dra.driver.model.taints import published_health, unhealthy_taints

if TYPE_CHECKING:
    from neuron_dra.driver.daemon.observability.metrics import Metrics

log = logging.getLogger(__name__)
EVENT_NAMESPACE = "default"
REASONS = {Health.UNHEALTHY: ("DeviceUnhealthy", "Warning"), Health.HEALTHY: ("DeviceHealthy", "Normal"),
           Health.UNKNOWN: ("DeviceHealthUnknown", "Warning")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class HealthReporter:
    def __init__(self, monitor: HealthMonitor, host: NeuronHost, node_name: str, driver_name: str,
                 taint_effect: str, api: ApiClient | None = None, metrics: Metrics | None = None,
                 republish: Callable[[], None] | None = None) -> None:
        self.monitor = monitor
        self.host = host
        self.node_name = node_name
        self.driver_name = driver_name
        self.taint_effect = taint_effect
        self._api = KubeApi(api) if api is not None else None
        self._metrics = metrics
        self.republish = republish  # set once the publisher exists
        self._node_uid: str | None = None
        self._seen_first = False

    def taints(self) -> Mapping[str, tuple[Mapping[str, str], ...]]:
        """Device name -> taints for the slices (the publisher's TaintSource)."""
        return unhealthy_taints(published_health(self.host, self.monitor.current()), self.driver_name,
                                self.taint_effect)

    def in_background(self, stop: threading.Event) -> Callable[[Mapping[int, DeviceHealth]], None]:
        """A listener that hands changes to a thread of their own: a slow or unreachable API server (taint, event)
        must not hold up the polling thread, which feeds kubelet's health stream."""
        changes: queue.SimpleQueue[Mapping[int, DeviceHealth]] = queue.SimpleQueue()

        def work() -> None:
            while not stop.is_set():
                try:
                    changed = changes.get(timeout=0.5)
                except queue.Empty:
                    continue
                try:
                    self.on_change(changed)
                except Exception:
                    log.exception("reporting a device health change failed")

        threading.Thread(target=work, name="health-reporter", daemon=True).start()
        return changes.put

    def on_change(self, changed: Mapping[int, DeviceHealth]) -> None:
        current = self.monitor.current()
        if self._metrics is not None:
            for i, h in changed.items():
                self._metrics.device_health.labels(str(i)).set(
                    {Health.HEALTHY: 1, Health.UNHEALTHY: 0, Health.UNKNOWN: -1}[h.health])
                self._metrics.device_health_changes.labels(str(i), h.health.value).inc()
            self._metrics.tainted_devices.set(len(self.taints()))
        if self.republish is not None:
            self.republish()
        for i, h in sorted(changed.items()):
            # At start-up every device "changes" from nothing: only a device that is not healthy is news then.
            if h.health is Health.HEALTHY and not self._seen_first:
                continue
            self._event(i, h)
        self._seen_first = self._seen_first or bool(current)

    def _node_ref(self) -> dict[str, Any]:
        """The event's involvedObject: the Node, with its uid once a GET of it has answered."""
        ref = {"apiVersion": "v1", "kind": "Node", "name": self.node_name}
        if self._node_uid is None and self._api is not None:
            try:
                self._node_uid = self._api.call("GET", f"/api/v1/nodes/{quote(self.node_name, safe='')}")[
                    "metadata"]["uid"]
            except Exception:  # the event is still worth recording: without the uid
                return ref
        return {**ref, "uid": self._node_uid or ""}

    def _event(self, index: int, h: DeviceHealth) -> None:
        if self._api is None:
            return
        reason, kind = REASONS[h.health]
        device = f"neuron-device-{index}"
        if h.health is Health.UNHEALTHY:
            message = f"{device} is unhealthy: {h.message}; tainted {self.driver_name}/unhealthy:{self.taint_effect}"
        elif h.health is Health.HEALTHY:
            message = f"{device} is healthy again (hardware error counters are 0); taint removed"
        else:
            message = f"{device} health is unknown: {h.message}"
        now = _now()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{self.node_name}.{device}.", "namespace": EVENT_NAMESPACE},
                "involvedObject": self._node_ref(), "reason": reason, "message": message[:1024], "type": kind,
                "source": {"component": self.driver_name, "host": self.node_name},
                "reportingComponent": self.driver_name, "reportingInstance": self.node_name,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self._api.call("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)
        except Exception as e:
            log.warning("recording a device health event failed", extra={"device": device, "reason": reason,
                                                                          "error": f"{type(e).__name__}: {e}"[:300]})
