"""A kubelet stand-in for emulated nodes: the DRA half of kubelet, against a real API server.

It does what kubelet does for DRA drivers, with kubelet's semantics (docs/kubelet-dra-protocol.md §1-2):
registers plugins found in the registry directory (GetInfo with a 1 s timeout, version choice,
NotifyRegistrationStatus), deletes its node's ResourceSlices when it starts, watches the pods
bound to its node, prepares all of a pod's claims of one driver in one NodePrepareResources call
(45 s timeout, retried), checks that every returned CDI id resolves to a spec file, marks the pod
Running, and on deletion unprepares claims no other pod on the node still uses before it removes
the pod. Containers are not run: the resolved CDI edits are written to the node's state directory
(what the runtime would apply), which the demo and the tests read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from neuron_dra.localcluster.cdi_resolve import CDIResolveError, merged_env, resolve

log = logging.getLogger("neuron_dra.kubelet_standin")

PREPARE_TIMEOUT_S = 45.0  # kubelet's per-call timeout for NodePrepareResources/NodeUnprepareResources
DEREGISTER_WIPE_S = 30.0  # kubelet wipes a driver's slices when no instance has been connected this long


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Registration:
    driver_name: str
    endpoint: str
    version: str  # the DRA service version kubelet chose, e.g. "v1.DRAPlugin"


class PluginConnector(Protocol):
    """The gRPC side: registration and the DRA service of one plugin (see pluginclient.py)."""

    def register(self, registration_socket: Path) -> Registration: ...

    def prepare(self, reg: Registration, claims: Sequence[ClaimRef], timeout: float) -> Mapping[str, PrepareResult]: ...

    def unprepare(self, reg: Registration, claims: Sequence[ClaimRef], timeout: float) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class StandinConfig:
    node_name: str
    registry_dir: Path
    cdi_root: Path
    state_dir: Path
    resync_s: float = 1.0
    retry_s: float = 1.0


@dataclass
class _PodState:
    prepared: dict[str, set[str]] = field(default_factory=dict)  # driver -> claim uids prepared for the pod
    running: bool = False
    failures: int = 0
    last_error: str = ""
    pod: tuple[str, str, str] | None = None  # namespace, name, uid: where failure events go


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


class KubeletStandin:
    def __init__(self, config: StandinConfig, api_client: client.ApiClient, connector: PluginConnector) -> None:
        self.config = config
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.connector = connector
        self.plugins: dict[str, Registration] = {}
        self._plugin_sockets: dict[Path, str] = {}
        self._lost_since: dict[str, float] = {}
        self._pods: dict[str, _PodState] = {}
        self._claim_users: dict[str, set[str]] = {}  # claim uid -> pod uids on this node using it
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        config.state_dir.mkdir(parents=True, exist_ok=True)

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.wipe_slices()
        for target, name in ((self._registration_loop, "registration"), (self._watch_loop, "pod-watch"),
                             (self._sync_loop, "sync")):
            t = threading.Thread(target=target, name=f"kubelet-{self.config.node_name}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=5)

    def wipe_slices(self, driver: str | None = None) -> None:
        """kubelet deletes its node's slices at start (and a driver's after it has been gone for 30 s)."""
        selector = f"spec.nodeName={self.config.node_name}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        try:
            self.resource.delete_collection_resource_slice(field_selector=selector)
        except ApiException as e:
            log.warning("wiping slices of %s failed: %s", self.config.node_name, e.reason)

    # --- plugin registration ------------------------------------------------------------------------------------

    def _registration_loop(self) -> None:
        while not self._stop.is_set():
            self.scan_registry()
            self._stop.wait(0.5)

    def scan_registry(self) -> None:
        present = {p for p in self.config.registry_dir.glob("*.sock") if not p.name.startswith(".")}
        for sock in sorted(present - set(self._plugin_sockets)):
            try:
                reg = self.connector.register(sock)
            except Exception as e:  # kubelet retries registration from scratch
                log.info("registration via %s failed (will retry): %s", sock, e)
                continue
            with self._lock:
                self.plugins[reg.driver_name] = reg
                self._plugin_sockets[sock] = reg.driver_name
                self._lost_since.pop(reg.driver_name, None)
            log.info("registered DRA plugin %s at %s (%s)", reg.driver_name, reg.endpoint, reg.version)
            self._wake.set()
        for sock in sorted(set(self._plugin_sockets) - present):
            with self._lock:
                driver = self._plugin_sockets.pop(sock)
                self.plugins.pop(driver, None)
                self._lost_since[driver] = time.monotonic()
            log.info("DRA plugin %s deregistered (socket removed)", driver)
        for driver, since in list(self._lost_since.items()):
            if time.monotonic() - since > DEREGISTER_WIPE_S:
                self.wipe_slices(driver)
                self._lost_since.pop(driver, None)

    # --- pods ---------------------------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={self.config.node_name}"
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                # short server-side timeouts so that stop() returns promptly (the watch cannot be interrupted)
                for _event in w.stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                       timeout_seconds=3):
                    self._wake.set()
                    if self._stop.is_set():
                        w.stop()
                        break
            except Exception as e:
                log.debug("pod watch restarted: %s", e)
                self._stop.wait(1)

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.resync_s)
            self._wake.clear()
            try:
                self.sync_once()
            except Exception:
                log.exception("pod sync failed")

    def list_pods(self) -> list[dict[str, Any]]:
        resp = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.config.node_name}",
                                                     _preload_content=False)
        items: list[dict[str, Any]] = _raw(resp).get("items", [])
        return items

    def sync_once(self) -> None:
        pods = self.list_pods()
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            state = self._pods.setdefault(uid, _PodState())
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod, state)
            elif not state.running and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                self._start(pod, state)
        for uid in set(self._pods) - seen:
            # Gone without a graceful termination (force delete): kubelet still unprepares the claims of the
            # pod it ran, once no other pod on the node uses them; a failure is retried on the next sync.
            state = self._pods[uid]
            if state.prepared and state.pod is not None:
                if self._unprepare_unused(uid, state, state.pod[0]):
                    self._remove_record(state.pod[0], state.pod[1])
            else:
                self._release(uid)

    def _claim_refs(self, pod: dict[str, Any]) -> list[tuple[str, str]] | None:
        """(pod claim name, ResourceClaim name) of every claim; None while a generated claim has no name yet."""
        statuses = {s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses")
                    or ()}
        out = []
        for entry in pod["spec"].get("resourceClaims") or ():
            if entry.get("resourceClaimName"):
                out.append((entry["name"], entry["resourceClaimName"]))
            elif entry["name"] in statuses:
                if statuses[entry["name"]] is None:
                    continue  # claim not needed (kubelet skips these)
                out.append((entry["name"], str(statuses[entry["name"]])))
            else:
                return None
        return out

    def _start(self, pod: dict[str, Any], state: _PodState) -> None:
        ns, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        state.pod = (ns, name, uid)
        refs = self._claim_refs(pod)
        if refs is None:
            return
        claims: dict[str, dict[str, Any]] = {}
        for pod_claim, claim_name in refs:
            try:
                claim = _raw(self.resource.read_namespaced_resource_claim(claim_name, ns, _preload_content=False))
            except ApiException as e:
                self._fail(state, f"claim {ns}/{claim_name}: {e.reason}")
                return
            status = claim.get("status") or {}
            reserved = {r.get("uid") for r in status.get("reservedFor") or ()}
            if not status.get("allocation") or uid not in reserved:
                return  # the scheduler has not allocated/reserved it for this pod yet
            claims[pod_claim] = claim
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in claims.values():
            drivers = {r["driver"] for r in claim["status"]["allocation"]["devices"].get("results") or ()}
            ref = ClaimRef(ns, claim["metadata"]["name"], claim["metadata"]["uid"])
            for driver in drivers:
                by_driver.setdefault(driver, []).append(ref)
        devices_by_claim: dict[str, list[PreparedDevice]] = {}
        for driver, refs_of_driver in sorted(by_driver.items()):
            reg = self.plugins.get(driver)
            if reg is None:
                self._fail(state, f"DRA driver {driver} is not registered on {self.config.node_name}")
                return
            try:
                results = self.connector.prepare(reg, refs_of_driver, PREPARE_TIMEOUT_S)
            except Exception as e:
                self._fail(state, f"NodePrepareResources({driver}) failed: {e}")
                return
            for ref in refs_of_driver:
                result = results.get(ref.uid)
                if result is None:
                    self._fail(state, f"{driver} returned no result for claim {ref.name} ({ref.uid})")
                    return
                if result.error:
                    self._fail(state, f"{driver} failed to prepare claim {ref.name}: {result.error}")
                    return
                devices_by_claim.setdefault(ref.uid, []).extend(result.devices)
                state.prepared.setdefault(driver, set()).add(ref.uid)
                with self._lock:
                    self._claim_users.setdefault(ref.uid, set()).add(uid)
        try:
            containers = self._container_edits(pod, claims, devices_by_claim)
        except CDIResolveError as e:
            self._fail(state, f"CDI: {e}")
            return
        self._write_state(pod, claims, devices_by_claim, containers)
        self._mark_running(pod)
        state.running = True
        log.info("pod %s/%s running on %s", ns, name, self.config.node_name)

    def _container_edits(self, pod: dict[str, Any], claims: Mapping[str, dict[str, Any]],
                         devices: Mapping[str, list[PreparedDevice]]) -> dict[str, dict[str, Any]]:
        """Per container: the CDI ids it gets (devices of its claims whose request names match) and their edits."""
        out: dict[str, dict[str, Any]] = {}
        for container in pod["spec"]["containers"]:
            ids: list[str] = []
            for use in (container.get("resources") or {}).get("claims") or ():
                claim = claims.get(use["name"])
                if claim is None:
                    continue
                wanted = use.get("request")
                for dev in devices.get(claim["metadata"]["uid"], ()):
                    if not dev.request_names or wanted is None or wanted in dev.request_names:
                        ids.extend(i for i in dev.cdi_device_ids if i not in ids)
            resolved = resolve(self.config.cdi_root, ids)
            out[container["name"]] = {
                "cdiDevices": ids,
                "env": merged_env(resolved),
                "deviceNodes": [dict(n) for r in resolved for n in r.device_nodes],
            }
        return out

    def _write_state(self, pod: dict[str, Any], claims: Mapping[str, dict[str, Any]],
                     devices: Mapping[str, list[PreparedDevice]], containers: Mapping[str, Any]) -> None:
        record = {
            "namespace": pod["metadata"]["namespace"],
            "pod": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
            "node": self.config.node_name,
            "claims": {
                pod_claim: {
                    "name": c["metadata"]["name"],
                    "uid": c["metadata"]["uid"],
                    "devices": [
                        {"requestNames": list(d.request_names), "pool": d.pool_name, "device": d.device_name,
                         "cdiDeviceIds": list(d.cdi_device_ids)}
                        for d in devices.get(c["metadata"]["uid"], ())
                    ],
                }
                for pod_claim, c in claims.items()
            },
            "containers": containers,
        }
        path = self.config.state_dir / f"{record['namespace']}_{record['pod']}.json"
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        tmp.replace(path)

    def _mark_running(self, pod: dict[str, Any]) -> None:
        now = _now()
        statuses = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
             "started": True, "state": {"running": {"startedAt": now}}}
            for c in pod["spec"]["containers"]
        ]
        conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                      for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        body = {"status": {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
                           "conditions": conditions, "containerStatuses": statuses}}
        self.core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], body)

    def _fail(self, state: _PodState, message: str) -> None:
        state.failures += 1
        if message != state.last_error:
            log.warning("%s: %s", self.config.node_name, message)
            if state.pod is not None:
                self._event(state.pod, "FailedPrepareDynamicResources", message)
        state.last_error = message

    def _event(self, pod: tuple[str, str, str], reason: str, message: str) -> None:
        """A Warning event on the pod, as kubelet reports a failed prepare (what `kubectl describe` shows)."""
        ns, name, uid = pod
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event: Any = {
            "metadata": {"generateName": f"{name}.", "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
            "reason": reason, "message": message[:1000], "type": "Warning",
            "source": {"component": "kubelet", "host": self.config.node_name},
            "firstTimestamp": now[:19] + "Z", "lastTimestamp": now[:19] + "Z", "count": 1,
        }
        try:
            self.core.create_namespaced_event(ns, event)
        except ApiException as e:
            log.debug("event for %s/%s not recorded: %s", ns, name, e.reason)

    def _terminate(self, pod: dict[str, Any], state: _PodState) -> None:
        uid = pod["metadata"]["uid"]
        if not self._unprepare_unused(uid, state, pod["metadata"]["namespace"]):
            return  # kubelet keeps the pod Terminating until unprepare succeeds
        try:
            self.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                            grace_period_seconds=0,
                                            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)))
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        self._remove_record(pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._pods.pop(uid, None)

    def _remove_record(self, namespace: str, name: str) -> None:
        (self.config.state_dir / f"{namespace}_{name}.json").unlink(missing_ok=True)

    def _unprepare_unused(self, pod_uid: str, state: _PodState, namespace: str) -> bool:
        for driver, claim_uids in sorted(state.prepared.items()):
            with self._lock:
                last_users = [c for c in claim_uids if self._claim_users.get(c, set()) <= {pod_uid}]
            if not last_users:
                continue
            reg = self.plugins.get(driver)
            if reg is None:
                self._fail(state, f"cannot unprepare: DRA driver {driver} is not registered")
                return False
            # The claim object may be gone; the driver needs only namespace and UID (name for logs).
            refs = [ClaimRef(namespace, "", c) for c in sorted(last_users)]
            try:
                errors = self.connector.unprepare(reg, refs, PREPARE_TIMEOUT_S)
            except Exception as e:
                self._fail(state, f"NodeUnprepareResources({driver}) failed: {e}")
                return False
            failed = {u: errors.get(u, "no result") for u in last_users if errors.get(u, "no result")}
            if failed:
                self._fail(state, f"unprepare failed: {failed}")
                return False
        self._release(pod_uid)
        return True

    def _release(self, pod_uid: str) -> None:
        with self._lock:
            for users in self._claim_users.values():
                users.discard(pod_uid)
            for claim_uid in [c for c, users in self._claim_users.items() if not users]:
                del self._claim_users[claim_uid]
        self._pods.pop(pod_uid, None)

