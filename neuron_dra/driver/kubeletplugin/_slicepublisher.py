"""Publishing a node's ResourceSlices with the reference publisher's semantics (k8s.io/dynamic-resource-allocation
resourceslice controller); what the slices hold is the driver's (`desired`).

Slices are named by generateName and owned by the Node; any change bumps the pool generation; obsolete slices
are deleted before the others are updated or created. A watch on this node's slices notices deletion (kubelet
wipes them when it starts) and republishes at once. API errors and a watch that ends early without a change
(as client-go's reflector treats it) are retried with exponential backoff; only a watch that lasted or saw a
change resets it, so a server that ends every watch at once cannot drive the loop faster. The loop never raises.

The slices come in as data: `resources(feedback)` returns them (generation 0), called at every pass; the
publisher is the `feedback` (`PublishFeedback`): whether the API server keeps device taints, and a probe of
whether it keeps shared counters (partitionable devices), so a driver can leave out what would be dropped.

Ownership: a slice is ours when its spec names this node, this driver and this node's pool (named after the
node); only those are updated or deleted. One of this node and driver in another pool is left alone and logged
once: pool names cannot change (422), so taking it over would stall publishing for good.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from neuron_dra.driver.kubeletplugin._kube import RESOURCE_SLICES, ApiClient, ApiException, KubeApi

log = logging.getLogger(__name__)

Slice = dict[str, Any]
WATCH_SLACK = 30.0  # seconds beyond the watch's timeoutSeconds before the client cuts it off


class _Counter(Protocol):
    def inc(self) -> None: ...


class _LabelledCounter(Protocol):
    def labels(self, *values: str) -> _Counter: ...


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class PublisherMetrics(Protocol):
    """The metrics the publisher updates (the driver's prometheus_client collectors)."""

    @property
    def slice_writes(self) -> _LabelledCounter: ...
    @property
    def api_errors(self) -> _LabelledCounter: ...
    @property
    def published_devices(self) -> _Gauge: ...


class PublishFeedback(Protocol):
    """What the publisher tells the driver's `resources` about the API server."""

    @property
    def taints_supported(self) -> bool: ...

    def probe_partitionable(self) -> tuple[bool, str]: ...


Resources = Callable[[PublishFeedback], list[Slice]]


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.5
    maximum: float = 30.0

    def next(self, current: float) -> float:
        return min(self.maximum, max(self.initial, current * 2))


@dataclass(frozen=True)
class PublishResult:
    generation: int
    devices: int
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _content(spec: Mapping[str, Any]) -> str:
    """What must match for a slice to be up to date (everything but the generation)."""
    pool = spec.get("pool") or {}
    devices = sorted(spec.get("devices") or (), key=lambda d: str(d.get("name")))
    return _canonical({"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "pool": pool.get("name"),
                       "count": pool.get("resourceSliceCount"), "devices": devices,
                       "sharedCounters": spec.get("sharedCounters") or []})


def _keep_taint_times(desired: list[Slice], existing: list[Slice]) -> None:
    """A taint already published (same device, key, value, effect) keeps its timeAdded: a restarted daemon
    neither rewrites its slices nor restarts the clock of NoExecute tolerationSeconds."""
    published = {(d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t.get("timeAdded")
                 for s in existing for d in (s.get("spec") or {}).get("devices") or () for t in d.get("taints") or ()}
    for s in desired:
        for d in s["spec"].get("devices") or ():
            for t in d.get("taints") or ():
                when = published.get((d.get("name"), t.get("key"), t.get("value"), t.get("effect")))
                if when:
                    t["timeAdded"] = when


class ResourceSlicePublisher:
    """Keeps the API's slices of `node_name`'s pool equal to what `resources` returns (`desired`)."""

    def __init__(self, api: ApiClient, node_name: str, driver_name: str, resources: Resources,
                 metrics: PublisherMetrics | None = None, resync_seconds: float = 60.0,
                 backoff: Backoff | None = None) -> None:
        self.resources = resources
        self._api = KubeApi(api)
        self.node_name = node_name
        self.driver_name = driver_name
        self._metrics = metrics
        self._resync = resync_seconds
        self._backoff = backoff or Backoff()
        self._generation = 0
        self.pool_name = node_name  # the pool is named after the node
        self._foreign_seen: set[str] = set()  # uids of foreign slices already logged
        self._selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self._thread: threading.Thread | None = None
        self.published = threading.Event()  # set after the first successful reconcile
        # Device taints: dropped for good once the API server is seen to drop them (DRADeviceTaints off,
        # Kubernetes < 1.36); `desired` then leaves them out.
        self.taints_supported = True
        self._lock = threading.Lock()  # reconcile runs from the loop and from the driver's changes
        self._withdrawn = False  # set by `withdraw`: nothing is published again

    def desired(self) -> list[Slice]:
        """The slices the pool should have (generation 0: the publisher sets it)."""
        return self.resources(self)

    # --- one pass --------------------------------------------------------------------------------------------

    def _ours(self, s: Mapping[str, Any]) -> bool:
        spec = s.get("spec") or {}
        return (spec.get("nodeName") == self.node_name and spec.get("driver") == self.driver_name
                and (spec.get("pool") or {}).get("name") == self.pool_name)

    def _note_foreign(self, s: Mapping[str, Any]) -> None:
        meta = s.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if uid in self._foreign_seen:
            return
        self._foreign_seen.add(uid)
        log.warning("ignoring a ResourceSlice of this node and driver in another pool: not ours, left alone",
                    extra={"node": self.node_name, "slice": str(meta.get("name", ""))[:253],
                           "pool": str(((s.get("spec") or {}).get("pool") or {}).get("name", ""))[:253],
                           "our_pool": self.pool_name})

    def list_slices(self) -> tuple[list[Slice], str]:
        """This node's slices of this driver in our pool (sorted by name) and the list's resourceVersion."""
        data = self._api.list(RESOURCE_SLICES, query={"fieldSelector": self._selector})
        items = []
        for s in data.get("items") or ():
            if self._ours(s):
                items.append(s)
            else:
                self._note_foreign(s)
        items.sort(key=lambda s: s["metadata"]["name"])
        return items, str(data.get("metadata", {}).get("resourceVersion", ""))

    def probe_partitionable(self) -> tuple[bool, str]:
        """Does the API server keep `sharedCounters`? A dry-run create of a counter-only slice of this node answers
        without storing anything: a server without DRAPartitionableDevices drops the field (1.34/1.35 default),
        an older one rejects it."""
        probe = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                 "metadata": {"generateName": f"{self.node_name}-{self.driver_name}-probe-"},
                 "spec": {"driver": self.driver_name, "nodeName": self.node_name,
                          "pool": {"name": self.node_name, "generation": 0, "resourceSliceCount": 1},
                          "sharedCounters": [{"name": "probe", "counters": {"probe": {"value": "1"}}}]}}
        try:
            stored = self._api.call("POST", RESOURCE_SLICES, query={"dryRun": "All"}, body=probe)
        except ApiException as e:
            if e.status in (400, 422):
                return False, f"the API server rejected a ResourceSlice with sharedCounters ({e.status} {e.reason})"
            raise
        if (stored.get("spec") or {}).get("sharedCounters"):
            return True, "the API server keeps ResourceSlice sharedCounters (DRAPartitionableDevices is on)"
        return False, ("the API server dropped ResourceSlice sharedCounters: DRAPartitionableDevices is off "
                       "(Kubernetes 1.34/1.35 by default)")

    def reconcile(self) -> tuple[PublishResult, str]:
        """Make the API match the desired slices; returns what changed and a resourceVersion to watch from."""
        with self._lock:
            if self._withdrawn:  # the driver is stopping: its devices stay withdrawn
                return PublishResult(self._generation, 0), ""
            return self._reconcile()

    def withdraw(self, seconds: float) -> int:
        """Take this node's devices of this driver out of scheduling as the driver stops (not a hand-over to
        another instance, docs/upgrades.md): delete our slices, within `seconds` for the whole, and publish nothing
        from then on. kubelet would wipe them only about 30 s after the driver went away, and a pod scheduled onto
        them meanwhile can stay stuck (kubernetes#141912). Returns how many were deleted; raises ApiException or
        ApiClientError when the API server cannot do it in time (the slices then stay for kubelet's wipe)."""
        until = time.monotonic() + seconds
        self._withdrawn = True  # first: a reconcile running now (holding the lock) is the last one
        # A reconcile under way finishes its writes first (each within its request deadline); if it takes longer
        # than ours, delete anyway: it publishes nothing after.
        locked = self._lock.acquire(timeout=max(0.0, until - time.monotonic()) / 2)
        try:
            data = self._api.list(RESOURCE_SLICES, query={"fieldSelector": self._selector},
                                  seconds=_left(until))
            deleted = 0
            for item in data.get("items") or ():
                if not self._ours(item):  # another pool of this node and driver: not ours to withdraw
                    continue
                body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": item["metadata"]["uid"]}}
                try:
                    self._api.call("DELETE", f"{RESOURCE_SLICES}/{item['metadata']['name']}", body=body,
                                   seconds=_left(until))
                except ApiException as e:
                    if e.status not in (404, 409):  # gone already (kubelet's wipe), or replaced meanwhile
                        raise
                deleted += 1
                if self._metrics:
                    self._metrics.slice_writes.labels("delete").inc()
            self._set_gauge(0)
            return deleted
        finally:
            if locked:
                self._lock.release()

    def _reconcile(self) -> tuple[PublishResult, str]:
        desired = self.desired()
        if any(d["spec"]["pool"]["name"] != self.pool_name for d in desired):
            raise RuntimeError(f"desired slices are not in pool {self.pool_name!r}")  # ownership would break
        existing, rv = self.list_slices()
        _keep_taint_times(desired, existing)
        devices = sum(len(d["spec"].get("devices") or ()) for d in desired)
        generations = {int(s["spec"]["pool"].get("generation", 0)) for s in existing}
        owners_ok = all(s["metadata"].get("ownerReferences") == d["metadata"].get("ownerReferences")
                        for s, d in zip(existing, desired, strict=False))
        if (len(existing) == len(desired) and len(generations) == 1 and owners_ok
                and sorted(_content(s["spec"]) for s in existing) == sorted(_content(d["spec"]) for d in desired)):
            self._generation = max(self._generation, *generations)
            self._set_gauge(devices)
            return PublishResult(self._generation, devices), rv
        # Any change, including republishing after a wipe, gets a generation above every one seen, so
        # consumers (which use only a pool's highest generation) never mix old and new slices.
        generation = max([self._generation, *generations]) + 1
        obsolete, reused = existing[len(desired):], existing[:len(desired)]
        for s in obsolete:  # obsolete first, so consumers never see more slices than the pool has
            self._delete(s)
        for s, d in zip(reused, desired, strict=False):
            body = {**d, "metadata": {**d["metadata"], "name": s["metadata"]["name"],
                                      "resourceVersion": s["metadata"]["resourceVersion"]}}
            body["metadata"].pop("generateName", None)
            body["spec"]["pool"]["generation"] = generation
            self._write("update", "PUT", f"{RESOURCE_SLICES}/{body['metadata']['name']}", body)
        for d in desired[len(reused):]:
            d["spec"]["pool"]["generation"] = generation
            self._write("create", "POST", RESOURCE_SLICES, d)
        self._generation = generation
        self._set_gauge(devices)
        result = PublishResult(generation, devices, created=len(desired) - len(reused), updated=len(reused),
                               deleted=len(obsolete))
        log.info("published ResourceSlices", extra={"node": self.node_name, "generation": generation,
                                                    "devices": devices, "slices_created": result.created,
                                                    "updated": result.updated, "deleted": result.deleted})
        return result, ""

    def _delete(self, s: Slice) -> None:
        if not self._ours(s):  # belt and braces: never another node's, driver's or pool's slice
            raise RuntimeError(f"refusing to delete ResourceSlice {s['metadata']['name']}: not ours")
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": s["metadata"]["uid"]}}
        try:
            self._write("delete", "DELETE", f"{RESOURCE_SLICES}/{s['metadata']['name']}", body)
        except ApiException as e:
            if e.status != 404:
                raise

    def _write(self, verb: str, method: str, path: str, body: Mapping[str, Any]) -> None:
        stored = self._api.call(method, path, body=body)
        if self._metrics:
            self._metrics.slice_writes.labels(verb).inc()
        sent = any(d.get("taints") for d in (body.get("spec") or {}).get("devices") or ())
        kept = any(d.get("taints") for d in ((stored or {}).get("spec") or {}).get("devices") or ())
        if sent and not kept and self.taints_supported:
            self.taints_supported = False
            log.warning("the API server dropped the device taints of our ResourceSlice (DRADeviceTaints is off: "
                        "Kubernetes 1.34/1.35 without the gate); unhealthy devices are no longer tainted, only "
                        "reported to kubelet's health stream", extra={"node": self.node_name})

    def refresh(self) -> None:
        """Publish now (the driver's devices or taints changed); errors are logged, the loop retries on its own
        schedule."""
        try:
            self.reconcile()
        except Exception as e:
            log.warning("publishing ResourceSlices after a change failed; the publish loop retries",
                        extra={"node": self.node_name, "error": f"{type(e).__name__}: {str(e)[:300]}"})

    def _set_gauge(self, devices: int) -> None:
        if self._metrics:
            self._metrics.published_devices.set(devices)

    # --- the loop --------------------------------------------------------------------------------------------

    def _wait_for_change(self, rv: str, stop: threading.Event) -> bool:
        """Block until a slice of ours changes (or the resync period ends); whether the watch made progress: it
        saw a change, or lasted at least half the time asked for (a server ending watches at once makes none)."""
        watch_seconds = max(1, int(self._resync))
        query = {"fieldSelector": self._selector, "timeoutSeconds": watch_seconds,
                 "allowWatchBookmarks": "true", "resourceVersion": rv or None}
        started = time.monotonic()
        events = self._api.watch(RESOURCE_SLICES, query, watch_seconds + WATCH_SLACK, self._resync + 10)
        with contextlib.closing(events):
            for event in events:
                if event.get("type") == "ERROR":  # e.g. 410 Gone: list again
                    raise ApiException(status=event.get("object", {}).get("code"), reason="watch error")
                if event.get("type") != "BOOKMARK":
                    return True
                if stop.is_set():
                    break
        return stop.is_set() or time.monotonic() - started >= watch_seconds / 2

    def run(self, stop: threading.Event) -> None:
        delay = 0.0  # reset only by a watch that made progress, never by a successful LIST
        writes_in_a_row = 0
        while not stop.is_set():
            try:
                result, rv = self.reconcile()
                self.published.set()
                if result.changed:
                    writes_in_a_row += 1
                    if writes_in_a_row < 3:
                        continue  # check our own writes took, then watch from a version that includes them
                    # Changed again right after each of three writes: someone else keeps deleting or rewriting
                    # them, or the API server rewrites what we send. Do not spin: wait for the next change.
                    log.warning("slices differed again right after each of 3 writes; waiting for the next change",
                                extra={"node": self.node_name})
                    _, rv = self.list_slices()
                writes_in_a_row = 0
                started = time.monotonic()
                if self._wait_for_change(rv, stop):
                    delay = 0.0
                    continue
                delay = self._backoff.next(delay)
                log.warning("the watch of this node's ResourceSlices ended early without a change; backing off "
                            "before listing again", extra={"node": self.node_name, "retry_in_seconds": delay,
                                                           "watch_seconds": round(time.monotonic() - started, 3)})
            except Exception as e:  # API down, conflicts, 410 Gone: back off and start over
                delay = self._backoff.next(delay)
                if self._metrics:
                    self._metrics.api_errors.labels("publish").inc()
                status = getattr(e, "status", None)
                log.warning("publishing ResourceSlices failed; retrying", extra={
                    "node": self.node_name, "error": f"{type(e).__name__}: {str(e)[:300]}", "status": status,
                    "retry_in_seconds": delay})
            stop.wait(delay)

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="slice-publisher", daemon=True)
        self._thread.start()
        return self._thread


def _left(until: float) -> float:
    """Seconds to `until` as a request deadline (the client allows 0.1 s at least)."""
    return max(0.1, until - time.monotonic())
