"""The UltraServer group controller: keeps one group ResourceSlice per UltraServer (and 2-node half) equal to what
the nodes' own slices say (driver/model/ultraserver.py renders them; docs/ultraserver.md), and, where the API
server serves partitionable devices, the shared counters that keep a 4-node set's whole and halves apart.

One pass lists the driver's slices and the Nodes (paged, bounded), computes the desired group slices and writes
only the pools that differ: a pool whose slices are all unchanged is never rewritten (compared without generation
and taint times); in a changed pool every slice is written at the pool's next generation (counter slices first,
stale ones deleted last), so the scheduler never mixes generations; a new slice is created under its fixed name. A
group that is gone but still allocated to a claim is not deleted: its device is tainted (or withdrawn) and an Event
on each holding claim says so; it is deleted once no claim holds it. Passes run on a change seen by the watches of
slices and Nodes, and every `resync` seconds; errors back off exponentially; nothing here raises out of `run`.

Each pass also keeps the members' Node labels (`<driver>/ultraserver`, `<driver>/ultraserver-pair`: the topology a
job's pod affinity names, docs/ultraserver.md §3a) equal to the membership: a JSON merge patch of those keys only,
sent only to a Node whose labels differ; a refused patch is one warning, never a failed pass.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.driver.kubeletplugin.toolkit import RESOURCE_SLICES, ApiClientError, ApiException, KubeApi
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.k8s_names import TAINT_EFFECTS, ultraserver_label_keys

log = logging.getLogger(__name__)

NODES = "/api/v1/nodes"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
PAGE = 500  # items per list page
MAX_ITEMS = 100_000  # per list: far above any cluster's nodes or slices; a list past it fails the pass
WATCH_SLACK = 30.0
COALESCE = 0.5  # seconds to let a burst of watch events settle before a pass
MAX_EVENTS_REMEMBERED = 10_000
COMPONENT = "neuron-dra-ultraserver"
GONE_VALUE = "group-gone"
SHARED_COUNTERS = ("auto", "off")


@dataclass(frozen=True)
class ControllerOptions:
    driver_name: str
    resync: float = 60.0
    taint_effect: str = "NoSchedule"
    catalog: Catalog = field(default=BUILTIN, repr=False)
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    shared_counters: str = "off"  # auto: where the API server serves them (probed); off: never (ultraserver.md §2a)

    def __post_init__(self) -> None:
        if self.shared_counters not in SHARED_COUNTERS:
            raise ValueError(f"shared counters {self.shared_counters!r} is not allowed: {', '.join(SHARED_COUNTERS)}")
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(f"taint effect {self.taint_effect!r} is not allowed: {', '.join(TAINT_EFFECTS)}")
        if not 1 <= self.resync <= 3600:
            raise ValueError(f"resync {self.resync!r} s is not allowed: 1 to 3600 seconds")


@dataclass
class PassResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    kept_for_claims: int = 0
    events: int = 0
    problems: tuple[us.Problem, ...] = ()
    labelled: int = 0  # Nodes whose UltraServer labels were patched
    label_failures: int = 0  # ... whose patch was refused or failed (the pass goes on)

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


class ListTooLarge(Exception):
    pass


def list_all(api: KubeApi, path: str, query: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Every item of a list, page by page (at most MAX_ITEMS), and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    cont: str | None = None
    rv = ""
    while True:
        doc = api.list(path, query={**(query or {}), "limit": PAGE, "continue": cont})
        items += [i for i in doc.get("items") or () if isinstance(i, dict)]
        if len(items) > MAX_ITEMS:
            raise ListTooLarge(f"GET {path}: more than {MAX_ITEMS} items")
        meta = doc.get("metadata") or {}
        rv = str(meta.get("resourceVersion", rv))
        cont = meta.get("continue") or None
        if not cont:
            return items, rv


def ready_node_names(nodes: list[dict[str, Any]]) -> set[str]:
    out = set()
    for n in nodes:
        conditions = (n.get("status") or {}).get("conditions") or ()
        if any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            name = (n.get("metadata") or {}).get("name")
            if isinstance(name, str):
                out.add(name)
    return out


def hostnames(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Node name -> its kubernetes.io/hostname label, where it has one."""
    out = {}
    for n in nodes:
        meta = n.get("metadata") or {}
        label = (meta.get("labels") or {}).get(us.HOSTNAME_LABEL)
        if isinstance(meta.get("name"), str) and isinstance(label, str) and label:
            out[meta["name"]] = label
    return out


def holders(claims: list[dict[str, Any]], driver: str) -> dict[str, list[dict[str, str]]]:
    """Group pool name -> the claims whose allocation holds a device of it."""
    out: dict[str, list[dict[str, str]]] = {}
    for c in claims:
        allocation = (c.get("status") or {}).get("allocation") or {}
        meta = c.get("metadata") or {}
        ref = {"namespace": str(meta.get("namespace", "")), "name": str(meta.get("name", "")),
               "uid": str(meta.get("uid", ""))}
        for r in (allocation.get("devices") or {}).get("results") or ():
            pool = r.get("pool") if isinstance(r, Mapping) else None
            if r.get("driver") == driver and isinstance(pool, str) and pool.startswith(us.POOL_PREFIX):
                out.setdefault(pool, []).append(ref)
    return out


def _generation(s: Mapping[str, Any]) -> int:
    generation = ((s.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


class GroupController:
    """One pass (`reconcile`) and the loop (`run`) of the group slices of one driver."""

    def __init__(self, api: KubeApi, options: ControllerOptions) -> None:
        self._api = api
        self.options = options
        self.taints_served = True  # dropped once the API server is seen to drop device taints (before 1.36)
        self.counters_served: bool | None = None  # partitionable devices (1.36+): probed on the first pass
        self._events_sent: set[tuple[str, str, str]] = set()
        self.dirty = threading.Event()
        self._lock = threading.Lock()
        self._node_seen: dict[str, tuple[object, ...]] = {}  # what the Node watch saw last (_matters)
        self._label_keys = ultraserver_label_keys(options.driver_name)
        self._label_warned: frozenset[str] = frozenset()  # the Nodes whose failed patch was last warned about

    # --- one pass ----------------------------------------------------------------------------------------------

    def _group_slices(self, all_slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Our slices by name (names are fixed per pool and part: a retried create cannot make two)."""
        driver = self.options.driver_name
        return {s["metadata"]["name"]: s for s in all_slices if us.is_group_slice(s, driver)}

    def probe_counters(self) -> bool:
        """Whether the API server keeps a ResourceSlice's `sharedCounters` (DRAPartitionableDevices: beta and on
        from 1.36; before, the fields are dropped on write): a dry-run create of a counter slice, nothing stored."""
        driver = self.options.driver_name
        probe = us.Group("probe", 4, "probe", "probe", None, tuple(us.Slot(i, f"probe-{i}", True) for i in range(4)))
        body = us.counter_slice(probe, driver)
        body["metadata"]["name"] = us.slice_name(probe.pool_name, driver, "probe")
        try:
            stored = self._api.call("POST", RESOURCE_SLICES, query={"dryRun": "All"}, body=body)
        except ApiException as e:  # refused (not unreachable: that fails the pass, retried): publish without
            log.warning("the counter probe was refused; publishing without shared counters",
                        extra={"status": e.status, "error": str(e)[:300]})
            return False
        served = bool((stored.get("spec") or {}).get("sharedCounters"))
        log.info("shared counters " + ("served: a 4-node set's whole and halves exclude each other" if served else
                                       "not served (before 1.36): a whole and a half may both be allocated"))
        return served

    def membership(self, all_slices: list[dict[str, Any]], nodes: list[dict[str, Any]],
                   existing: Mapping[str, dict[str, Any]]) -> tuple[us.Membership, tuple[us.Problem, ...]]:
        facts, problems = us.member_facts(all_slices, self.options.driver_name)
        membership = us.group_ultraservers(facts, us.previous_groups(existing.values()), ready_node_names(nodes),
                                           self.options.catalog, hostnames(nodes))
        return membership, (*problems, *membership.problems)

    def desired(self, membership: us.Membership) -> list[dict[str, Any]]:
        return us.desired_slices(membership, self.options.driver_name, self.taints_served,
                                 self.options.taint_effect, bool(self.counters_served))

    def label_nodes(self, membership: us.Membership, nodes: list[dict[str, Any]]) -> tuple[int, int]:
        """Patch the UltraServer labels of the Nodes whose labels differ from the membership (merge patch of those
        keys only; a refused or failed patch is left for the next pass, warned about once while it lasts).
        Returns (patched, failed)."""
        patches = us.label_patches(nodes, us.node_labels(membership, self.options.driver_name),
                                   self.options.driver_name)
        failed: dict[str, str] = {}
        for name, labels in sorted(patches.items()):
            try:
                self._api.merge_patch(f"{NODES}/{name}", {"metadata": {"labels": labels}})
            except (ApiException, ApiClientError) as e:
                failed[name] = f"{type(e).__name__}: {str(e)[:300]}"
        if failed and frozenset(failed) != self._label_warned:
            first = min(failed)
            log.warning("could not label UltraServer member Nodes; pods whose affinity names the label wait for "
                        "it (docs/ultraserver.md §3a)",
                        extra={"nodes": len(failed), "first": first, "error": failed[first],
                               "labels": list(self._label_keys)})
        self._label_warned = frozenset(failed)
        if len(patches) > len(failed):
            log.info("UltraServer labels written", extra={"nodes": len(patches) - len(failed)})
        return len(patches) - len(failed), len(failed)

    def reconcile(self) -> PassResult:
        with self._lock:
            return self._reconcile()

    def _reconcile(self) -> PassResult:
        driver = self.options.driver_name
        if self.counters_served is None:
            self.counters_served = self.options.shared_counters == "auto" and self.probe_counters()
        all_slices, _ = list_all(self._api, RESOURCE_SLICES, {"fieldSelector": f"spec.driver={driver}"})
        nodes, _ = list_all(self._api, NODES)
        existing = self._group_slices(all_slices)
        membership, problems = self.membership(all_slices, nodes, existing)
        desired = self.desired(membership)
        labelled, label_failures = self.label_nodes(membership, nodes)
        result = PassResult(problems=problems, labelled=labelled, label_failures=label_failures)
        for p in problems:
            log.warning("UltraServer membership problem", extra={"problem": str(p)[:500]})
        wanted = {d["metadata"]["name"]: d for d in desired}
        claims_by_pool: dict[str, list[dict[str, str]]] | None = None

        def held(pool: str) -> list[dict[str, str]]:
            nonlocal claims_by_pool
            if claims_by_pool is None:
                claims_by_pool = holders(list_all(self._api, CLAIMS)[0], driver)
            return claims_by_pool.get(pool, [])

        stale: list[dict[str, Any]] = []
        for name, stored in sorted(existing.items()):
            if name in wanted:
                continue
            pool = stored["spec"]["pool"]["name"]
            holding = held(pool)
            if not holding:
                stale.append(stored)
                continue
            gone = self._gone(stored)  # kept, tainted or withdrawn, for the claims that hold it
            result.kept_for_claims += 1
            result.events += self._tell(holding, pool, "UltraServerGroupGone",
                                        f"UltraServer group {pool} no longer matches its nodes (a member left or "
                                        "changed); kept, unschedulable, while this claim holds it")
            wanted[name] = gone
        pools: dict[str, list[dict[str, Any]]] = {}
        for d in wanted.values():
            pools.setdefault(d["spec"]["pool"]["name"], []).append(d)
        for slices in pools.values():
            for d in slices:  # every slice of a pool declares the pool's slice count
                d["spec"]["pool"]["resourceSliceCount"] = len(slices)
        stale_pools = {s["spec"]["pool"]["name"] for s in stale}
        for pool, slices in sorted(pools.items()):
            # counter slices first: a device must never be seen without the counters it consumes
            slices.sort(key=lambda d: ("devices" in d["spec"], d["metadata"]["name"]))
            stored_of = [existing.get(d["metadata"]["name"]) for d in slices]
            if pool not in stale_pools and all(
                    old is not None and us.slice_content(old) == us.slice_content(d)
                    for old, d in zip(stored_of, slices, strict=True)):
                result.unchanged += len(slices)
                continue
            generation = 1 + max((_generation(s) for s in existing.values() if s["spec"]["pool"]["name"] == pool),
                                 default=0)
            for old, d in zip(stored_of, slices, strict=True):
                if old is None:
                    self._create(d, generation)
                    result.created += 1
                    continue
                if self._withdraws(old, d):
                    result.events += self._tell(held(pool), pool, "UltraServerGroupWithdrawn",
                                                f"UltraServer group {pool} withdrawn: a member is missing or "
                                                "unhealthy, and this cluster serves no device taints; running pods "
                                                "stay")
                self._update(old, d, generation)
                result.updated += 1
        for s in stale:
            self._delete(s)
            result.deleted += 1
        if result.writes:
            log.info("group slices written", extra={"created": result.created, "updated": result.updated,
                                                    "deleted": result.deleted, "unchanged": result.unchanged})
        return result

    def _gone(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The stored slice with its device made unschedulable (a taint, or withdrawn)."""
        meta = stored.get("metadata") or {}
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {k: copy.deepcopy(meta[k]) for k in ("name", "labels", "annotations") if k in meta},
                "spec": copy.deepcopy(stored["spec"])}
        devices = body["spec"].get("devices") or []
        if not self.taints_served:
            body["spec"]["devices"] = []
            return body
        key = f"{self.options.driver_name}/{us.MISSING_TAINT}"
        for d in devices:
            taints = [t for t in d.get("taints") or () if t.get("key") != key]
            d["taints"] = [*taints, {"key": key, "value": GONE_VALUE, "effect": self.options.taint_effect}]
        return body

    @staticmethod
    def _withdraws(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
        before = {d.get("name") for d in (stored.get("spec") or {}).get("devices") or ()}
        after = {d.get("name") for d in desired["spec"].get("devices") or ()}
        return bool(before - after)

    def _tell(self, claims: list[dict[str, str]], pool: str, reason: str, message: str) -> int:
        """A Warning Event on each claim (once per claim, pool and reason in this process)."""
        sent = 0
        for c in claims:
            key = (c["uid"], pool, reason)
            if key in self._events_sent:
                continue
            if len(self._events_sent) >= MAX_EVENTS_REMEMBERED:
                self._events_sent.clear()
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            event = {"apiVersion": "v1", "kind": "Event",
                     "metadata": {"generateName": f"{c['name'][:200]}.", "namespace": c["namespace"]},
                     "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                        "namespace": c["namespace"], "name": c["name"], "uid": c["uid"]},
                     "reason": reason, "message": message[:1024], "type": "Warning",
                     "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                     "reportingInstance": COMPONENT, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
            try:
                self._api.call("POST", f"/api/v1/namespaces/{c['namespace']}/events", body=event)
            except (ApiException, ApiClientError) as e:
                log.warning("could not record an event on a claim", extra={"claim": f"{c['namespace']}/{c['name']}",
                                                                            "error": str(e)[:300]})
                continue
            self._events_sent.add(key)
            sent += 1
        return sent

    def _create(self, d: dict[str, Any], generation: int = 1) -> None:
        d["spec"]["pool"]["generation"] = generation
        try:
            self._note_taints(d, self._api.call("POST", RESOURCE_SLICES, body=d))
        except ApiException as e:
            if e.status != 409:  # already there (a create whose answer was lost): the next pass compares it
                raise

    def _update(self, stored: Mapping[str, Any], d: dict[str, Any], generation: int) -> None:
        us.keep_taint_times(d, stored)
        d["spec"]["pool"]["generation"] = generation
        d["metadata"] = {**d["metadata"], "name": stored["metadata"]["name"],
                         "resourceVersion": stored["metadata"]["resourceVersion"]}
        self._note_taints(d, self._api.call("PUT", f"{RESOURCE_SLICES}/{d['metadata']['name']}", body=d))

    def _delete(self, s: Mapping[str, Any]) -> None:
        if not us.is_group_slice(s, self.options.driver_name):  # never a node's slice
            raise RuntimeError(f"refusing to delete ResourceSlice {s['metadata']['name']}: not a group slice")
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": s["metadata"]["uid"]}}
        try:
            self._api.call("DELETE", f"{RESOURCE_SLICES}/{s['metadata']['name']}", body=body)
        except ApiException as e:
            if e.status != 404:
                raise

    def _note_taints(self, sent: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        had = any(d.get("taints") for d in sent["spec"].get("devices") or ())
        kept = any(d.get("taints") for d in (stored.get("spec") or {}).get("devices") or ())
        if had and not kept and self.taints_served:
            self.taints_served = False
            self.dirty.set()  # withdraw instead, at once
            log.warning("the API server dropped the group device's taints (DRADeviceTaints off: before 1.36); "
                        "groups with a missing or unhealthy member are withdrawn instead")

    # --- the loop ----------------------------------------------------------------------------------------------

    def _watch(self, path: str, query: Mapping[str, Any], stop: threading.Event) -> None:
        """Set `dirty` on every change of `path` until `stop`; restarts (with backoff) when the watch ends."""
        delay = 0.0
        while not stop.is_set():
            try:
                doc = self._api.list(path, query={**query, "limit": 1})
                rv = str((doc.get("metadata") or {}).get("resourceVersion", ""))
                seconds = max(1, int(self.options.resync))
                started = time.monotonic()
                events = self._api.watch(path, {**query, "resourceVersion": rv, "timeoutSeconds": seconds,
                                                "allowWatchBookmarks": "true"},
                                         seconds + WATCH_SLACK, self.options.resync + 10)
                with contextlib.closing(events):
                    for event in events:
                        if event.get("type") == "ERROR":
                            break
                        if event.get("type") != "BOOKMARK" and self._matters(path, event):
                            self.dirty.set()
                        if stop.is_set():
                            return
                lasted = time.monotonic() - started >= seconds / 2
                delay = 0.0 if lasted else self._next(delay)
            except Exception as e:
                delay = self._next(delay)
                log.warning("watch failed; retrying", extra={"path": path, "error": f"{type(e).__name__}: "
                                                             f"{str(e)[:300]}", "retry_in_seconds": delay})
            stop.wait(delay)

    def _matters(self, path: str, event: Mapping[str, Any]) -> bool:
        """Every slice event; of Nodes only those that change a node's readiness, existence or UltraServer labels
        (status updates of a thousand nodes would otherwise start a pass every few seconds)."""
        if path != NODES:
            return True
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if event.get("type") == "DELETED":
            return self._node_seen.pop(name, None) is not None
        labels = meta.get("labels")
        labels = labels if isinstance(labels, Mapping) else {}
        seen = (bool(ready_node_names([obj])), *(labels.get(k) for k in self._label_keys))
        if len(self._node_seen) >= MAX_ITEMS and name not in self._node_seen:
            return True
        changed = self._node_seen.get(name) != seen
        self._node_seen[name] = seen
        return changed

    def _next(self, delay: float) -> float:
        return min(self.options.backoff_max, max(self.options.backoff_initial, delay * 2))

    def start_watches(self, stop: threading.Event) -> list[threading.Thread]:
        query = {"fieldSelector": f"spec.driver={self.options.driver_name}"}
        threads = [threading.Thread(target=self._watch, args=(RESOURCE_SLICES, query, stop), daemon=True,
                                    name="watch-slices"),
                   threading.Thread(target=self._watch, args=(NODES, {}, stop), daemon=True, name="watch-nodes")]
        for t in threads:
            t.start()
        return threads

    def passes(self, stop: threading.Event, leading: threading.Event) -> Iterator[PassResult | Exception]:
        """Run passes while `leading`, one per change or resync; yields each outcome (the loop and tests)."""
        delay = 0.0
        self.dirty.set()
        while not stop.is_set():
            if not leading.is_set():
                self.dirty.set()  # a new leader starts with a full pass
                leading.wait(1.0)
                continue
            self.dirty.wait(self.options.resync if delay == 0 else delay)
            if stop.is_set():
                return
            stop.wait(COALESCE)
            self.dirty.clear()
            if not leading.is_set():
                continue
            try:
                outcome: PassResult | Exception = self.reconcile()
                delay = 0.0
            except Exception as e:
                delay = self._next(delay)
                self.dirty.set()
                log.warning("group pass failed; retrying", extra={"error": f"{type(e).__name__}: {str(e)[:300]}",
                                                                  "retry_in_seconds": delay})
                outcome = e
                stop.wait(delay)
            yield outcome

    def run(self, stop: threading.Event, leading: threading.Event) -> None:
        for _ in self.passes(stop, leading):
            pass
