"""bench_scale's cluster side: the API objects (Nodes, ResourceSlices, pods), the API traffic and /proc readings.

The slices come from the driver's own model (driver/model/slices.py build_pool for an emulated trn2.48xlarge and
driver/model/efa.py for the EFA driver's devices). `aws_shaped` keeps only what AWS's Neuron DRA driver publishes
for the same devices (docs/neuron-hardware.md §3): its attribute names and group ids, no capacities, no
NeuronCores or counters.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import urllib3

from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.efa import EFA_DRIVER, efa_driver_devices
from neuron_dra.driver.model.partitions import CoreLayout
from neuron_dra.driver.model.slices import AWS_DOMAIN, NodeFacts, Pool, PublishOptions, build_pool, resource_slices

INSTANCE_TYPE = "trn2.48xlarge"
# ours: as the driver publishes without NeuronCores (--core-partitions off); ours-cores: with NeuronCores and
# counters (its default on 1.36); aws: AWS's attribute set only.
SLICE_MODELS = ("ours", "ours-cores", "aws")
# What AWS's driver publishes on a trn2.48xlarge device (docs/neuron-hardware.md §3), in its own domain.
AWS_ATTRIBUTES = frozenset({"deviceId", "instanceType", "neuronDriverVersion", "draDriverVersion", "resourceType",
                            "networkNodeLayer1", "networkNodeLayer2", "networkNodeLayer3", "topology_x", "topology_y",
                            "topology4_id", "topology8_id", "capacityBlockId", "ultraserverId", "workloadId"})
CLIENT_THREADS = 8


def aws_shaped(pool: Pool) -> Pool:
    """The pool as AWS's driver publishes the same devices: whole devices, AWS's attributes only."""
    devices = tuple(
        replace(d, attributes={k: v for k, v in d.attributes.items()
                               if k in AWS_ATTRIBUTES or k.startswith(f"{AWS_DOMAIN}/devicegroup")},
                capacity={}, consumes_counters=())
        for d in pool.devices if d.attributes.get("resourceType") == {"string": "neuron_device"})
    return replace(pool, devices=devices, counter_sets=())


def node_pool(host: NeuronHost, node: str, model: str) -> Pool:
    """The Neuron pool of `node` as `model` publishes it (SLICE_MODELS)."""
    if model not in SLICE_MODELS:
        raise ValueError(f"slice model {model!r} is not known; choose one of {', '.join(SLICE_MODELS)}")
    cores = CoreLayout.for_spec(host.spec) if model == "ours-cores" else None
    pool = build_pool(host, NodeFacts(node), PublishOptions(cores=cores))
    return aws_shaped(pool) if model == "aws" else pool


def node_slices(host: NeuronHost, node: str, model: str) -> list[dict[str, Any]]:
    """The node's Neuron slices and the EFA driver's slice (the same EFA devices under every model)."""
    slices = resource_slices(node_pool(host, node, model))
    efa = efa_driver_devices(node_pool(host, node, "ours"))
    slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                   "metadata": {"generateName": f"{node}-{EFA_DRIVER}-"},
                   "spec": {"driver": EFA_DRIVER, "nodeName": node,
                            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1}, "devices": efa}})
    return slices


def node_object(name: str) -> dict[str, Any]:
    """A Ready trn2.48xlarge Node with room for any number of pods (no kubelet ever reports on it)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "192", "memory": "2Ti", "pods": "1000"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              "kubernetes.io/arch": "amd64",
                                              "node.kubernetes.io/instance-type": INSTANCE_TYPE}},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": now, "lastTransitionTime": now}]},
    }


def pod_object(name: str, template: str | None) -> dict[str, Any]:
    """A pod that is never run: it tolerates every taint (no kubelet keeps the Nodes Ready) and, with a template,
    has one claim made from it."""
    container: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"containers": [container], "tolerations": [{"operator": "Exists"}],
                            "terminationGracePeriodSeconds": 0}
    if template is not None:
        spec["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "devices"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class ApiError(RuntimeError):
    pass


class Api:
    """A small JSON client of the control plane's API server (admin certificate), thread-safe."""

    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.http = urllib3.PoolManager(num_pools=2, maxsize=CLIENT_THREADS * 2, ca_certs=str(pki / "ca.crt"),
                                        cert_file=str(pki / "admin.crt"), key_file=str(pki / "admin.key"),
                                        retries=False, timeout=urllib3.Timeout(connect=5, read=60))

    def request(self, method: str, path: str, body: object = None, ok: Sequence[int] = (200, 201, 202)) -> Any:
        data = None if body is None else json.dumps(body).encode()
        resp = self.http.request(method, self.server + path, body=data,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
        if resp.status not in ok:
            raise ApiError(f"{method} {path}: HTTP {resp.status}: {resp.data[:300]!r}")
        return json.loads(resp.data) if resp.data else None

    def create_all(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """POST every (path, body), CLIENT_THREADS at a time."""
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            for _ in pool.map(lambda item: self.request("POST", item[0], item[1]), items):
                pass

    def count(self, path: str) -> int:
        return len(self.request("GET", path)["items"])


class ScheduledWatch:
    """Records when each pod of a namespace is first seen bound (spec.nodeName set), from a watch (the kubernetes
    client's, which hands over each event as it arrives). A watch that fails or ends early is listed and watched
    again from the listing's resourceVersion, so no binding goes unseen; what ended it is kept in `errors` (a pod
    first seen bound in a re-listing is timed at that listing)."""

    def __init__(self, api_client: Any, namespace: str, timeout_s: float) -> None:
        from kubernetes import client

        self.scheduled: dict[str, float] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._core = client.CoreV1Api(api_client)
        self._namespace = namespace
        self._deadline = time.monotonic() + timeout_s
        self._stopped = threading.Event()
        self._watch: Any = None
        version = self._list()
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True, name=f"watch-{namespace}")
        self._thread.start()

    def _seen(self, pod: Any) -> None:
        if pod.spec.node_name:
            with self._lock:
                self.scheduled.setdefault(pod.metadata.name, time.monotonic())

    def _list(self) -> str:
        listing: Any = self._core.list_namespaced_pod(self._namespace)
        for pod in listing.items:
            self._seen(pod)
        return str(listing.metadata.resource_version)

    def _run(self, version: str) -> None:
        from kubernetes import watch

        while not self._stopped.is_set() and (left := self._deadline - time.monotonic()) > 1:
            try:
                self._watch = watch.Watch()
                for event in self._watch.stream(self._core.list_namespaced_pod, self._namespace,
                                                resource_version=version, timeout_seconds=int(left)):
                    self._seen(event["object"])
                if self._stopped.is_set():
                    return
                self.errors.append("the watch ended before it was stopped")
            except Exception as e:  # any failure: recorded, then listed and watched again
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
            if len(self.errors) > 100:
                return
            try:
                version = self._list()
            except Exception as e:
                self.errors.append(f"re-list: {type(e).__name__}: {e}"[:300])
                self._stopped.wait(1.0)

    def count(self) -> int:
        with self._lock:
            return len(self.scheduled)

    def times(self) -> dict[str, float]:
        with self._lock:
            return dict(self.scheduled)

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()  # ends at the next event or at its timeout; the thread is a daemon


# --- /proc -----------------------------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def program_pid(wrapper_pid: int) -> int:
    """The program `timeout` (procs.spawn's wrapper, pid `wrapper_pid`) runs: its only child."""
    children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    if len(children) != 1:
        raise ApiError(f"process {wrapper_pid} has children {children}, expected the one program it wraps")
    return int(children[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads) from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ApiError(f"no VmRSS in /proc/{pid}/status")
