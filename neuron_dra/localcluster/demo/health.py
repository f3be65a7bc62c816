"""The demo's device-health stage (Kubernetes 1.36+: device taints on by default; docs/kubernetes-versions.md).

A hardware error counter is raised on two devices of the inf2 node, one in use by a ring segment and the free
device a new claim would get first. The driver taints both in the node's ResourceSlice, kubelet shows the used one
Unhealthy in its pod's status (the driver's health stream), a new one-device pod gets a third device, and clearing
the counters removes the taints and makes the device Healthy again (docs/neuron-health.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from neuron_dra.driver.model.emulate import clear_faults, inject_fault
from neuron_dra.driver.model.taints import unhealthy_taint_key
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.demo.report import PodOutcome
from neuron_dra.localcluster.demo.workloads import SPARE, pod_manifest

HEALTH_INSTANCE_TYPE = "inf2.48xlarge"
COUNTER = "mem_ecc_uncorrected"  # an HBM uncorrectable error: Unhealthy at the first event
TAINT_WITHIN_S = 15.0  # the driver polls the counters every second; the slice update is one API call
STATUS_WITHIN_S = 45.0  # kubelet's health stream to the pod's status (a status sync)

Wait = Callable[[str, Callable[[], bool], float], None]


@dataclass(frozen=True)
class FaultPlan:
    """Where the stage injects: `in_use` is a device of `pod`, `free` the lowest device no pod uses."""

    node: str
    pod: str
    in_use: int
    free: int


@dataclass(frozen=True)
class HealthOutcome:
    plan: FaultPlan
    taint: str  # key=value:effect as published
    taint_seconds: float  # fault -> both devices tainted in the ResourceSlice
    status_seconds: float  # fault -> the pod's status shows its device Unhealthy
    spare_device: int  # what the new one-device claim got
    cleared_seconds: float  # clear -> taints gone and the pod's device Healthy again


def plan_faults(outcomes: Sequence[PodOutcome], node: str, device_count: int) -> FaultPlan | None:
    """The first pod placed on `node` and one of its devices, and the lowest free device; None when the node has
    no pod or no free device."""
    on_node = [o for o in outcomes if o.node == node and o.neuron_devices]
    used = {d for o in on_node for d in o.neuron_devices}
    free = [d for d in range(device_count) if d not in used]
    if not on_node or not free:
        return None
    return FaultPlan(node, on_node[0].pod, min(on_node[0].neuron_devices), free[0])


def raw_json(resp: Any) -> dict[str, Any]:
    """The body of a `_preload_content=False` call (the client's models drop fields they do not know)."""
    data: dict[str, Any] = json.loads(resp.data)
    return data


def pod_claims(resource: client.ResourceV1Api, namespace: str, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(the pod's name for the claim, the ResourceClaim) of each claim in a pod's status."""
    return [(status["name"], raw_json(resource.read_namespaced_resource_claim(
        status["resourceClaimName"], namespace, _preload_content=False)))
        for status in pod.get("status", {}).get("resourceClaimStatuses") or ()]


def device_name(index: int) -> str:
    return f"neuron-device-{index}"


class HealthStage:
    """Runs the stage against the demo's cluster; every wait is bounded by `wait` (the demo's wait_until)."""

    def __init__(self, cluster: LocalCluster, api: client.ApiClient, namespace: str, say: Callable[[str], None],
                 wait: Wait, pod_timeout: float, image: str | None = None) -> None:
        self.cluster = cluster
        self.image = image  # the workload image of a containerd cluster (None: the fake runtime's placeholder)
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.namespace = namespace
        self.say = say
        self.wait = wait
        self.pod_timeout = pod_timeout
        self.taint_key = unhealthy_taint_key(cluster.driver_name)

    def _taints(self, node: str) -> dict[str, list[dict[str, Any]]]:
        resp = self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={self.cluster.driver_name}", _preload_content=False)
        return {d["name"]: d.get("taints") or [] for s in raw_json(resp)["items"]
                for d in s["spec"].get("devices") or ()}

    def _pod(self, name: str) -> dict[str, Any]:
        return raw_json(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False))

    def _exists(self, name: str) -> bool:
        return any(p.metadata is not None and p.metadata.name == name
                   for p in self.core.list_namespaced_pod(self.namespace).items)

    def _health(self, pod: str, device: str) -> str | None:
        """kubelet's view of one device in a pod's status (resourceID: the device's CDI id, ending in its name)."""
        for cs in self._pod(pod).get("status", {}).get("containerStatuses") or ():
            for rs in cs.get("allocatedResourcesStatus") or ():
                for r in rs.get("resources") or ():
                    if str(r.get("resourceID", "")).endswith(f"-{device}"):
                        return str(r.get("health"))
        return None

    def _spare_device(self) -> int | None:
        pod = self._pod(SPARE.pod)
        if pod.get("status", {}).get("phase") != "Running":
            return None
        for _, claim in pod_claims(self.resource, self.namespace, pod):
            for r in claim["status"]["allocation"]["devices"]["results"]:
                if r["driver"] == self.cluster.driver_name:
                    return int(r["device"].rsplit("-", 1)[1])
        return None

    def run(self, plan: FaultPlan) -> HealthOutcome:
        host = self.cluster.node_paths(plan.node).host_root
        used, free = device_name(plan.in_use), device_name(plan.free)
        self.say(f"device health: {COUNTER} +1 on {plan.node} {used} (used by {plan.pod}) and {free} (free)")
        started = time.monotonic()
        try:
            for index in (plan.in_use, plan.free):
                inject_fault(host, index, COUNTER)

            def tainted() -> bool:
                taints = self._taints(plan.node)
                return all(any(t["key"] == self.taint_key for t in taints.get(d, ())) for d in (used, free))

            self.wait(f"the driver to taint {used} and {free}", tainted, TAINT_WITHIN_S)
            taint_seconds = time.monotonic() - started
            first = next(t for t in self._taints(plan.node)[used] if t["key"] == self.taint_key)
            taint = f"{first['key']}={first.get('value', '')}:{first['effect']}"
            self.say(f"  taint {taint} on both devices after {taint_seconds:.1f} s")
            self.wait(f"{plan.pod}'s status to show {used} Unhealthy",
                      lambda: self._health(plan.pod, used) == "Unhealthy", STATUS_WITHIN_S)
            status_seconds = time.monotonic() - started
            self.say(f"  {plan.pod}'s status shows {used} Unhealthy after {status_seconds:.1f} s (kubelet's "
                     f"health stream); {plan.pod} keeps running ({first['effect']})")
            self.core.create_namespaced_pod(self.namespace, pod_manifest(SPARE, self.namespace, self.image))  # type: ignore[arg-type]
            got: list[int] = []

            def spare_running() -> bool:
                device = self._spare_device()
                got[:] = [] if device is None else [device]
                return device is not None

            self.wait(f"pod {SPARE.pod} to run", spare_running, self.pod_timeout)
            spare = got[0]
            self.say(f"  {SPARE.pod:<16} -> {plan.node:<16} {SPARE.shows}: got {device_name(spare)}, not the "
                     f"faulted {free}")
        finally:
            cleared = time.monotonic()
            for index in (plan.in_use, plan.free):
                clear_faults(host, index)

        def recovered() -> bool:
            taints = self._taints(plan.node)
            return not any(t["key"] == self.taint_key for d in (used, free) for t in taints.get(d, ())) \
                and self._health(plan.pod, used) == "Healthy"

        self.wait(f"the taints on {used} and {free} to go and {used} to be Healthy again", recovered,
                  STATUS_WITHIN_S)
        cleared_seconds = time.monotonic() - cleared
        self.say(f"  counters cleared: taints removed and {used} Healthy again after {cleared_seconds:.1f} s")
        # A kept cluster then runs what the table shows.
        self.core.delete_namespaced_pod(SPARE.pod, self.namespace, grace_period_seconds=0)
        self.wait(f"pod {SPARE.pod} to be deleted", lambda: not self._exists(SPARE.pod), self.pod_timeout)
        return HealthOutcome(plan, taint, taint_seconds, status_seconds, spare, cleared_seconds)
