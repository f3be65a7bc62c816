"""Prepare and unprepare: the claims this node holds, kept in the checkpoint and the CDI directory. `DriverState`
is the driver the kubelet-plugin helper calls (its Driver protocol, docs/architecture.md "The prepare walk").

Concurrency: the helper GETs and checks the claims outside any lock, so a slow API call delays only its own call,
then calls `prepare` (or `unprepare`) under its CallLock: the thread lock and, with two instances, the flock they
share; the driver's own work on the records outside calls (load, hand-over, background checks, close, reads for
metrics) holds the same lock (`_shared`). Every call has a ticket from its arrival (CallScope.ticket,
time.monotonic_ns, one clock for every process of the node); an unprepare notes its ticket in the checkpoint's
records, and a prepare that arrived before a completed unprepare of the claim fails rather than re-prepare a
claim kubelet released (the late prepare retry), whichever instance answered the unprepare.

Two instances side by side (a surge rollout, docs/upgrades.md): kubelet may call either, so every call starts
from the checkpoint on disk (`Checkpoint.refresh`, read only when the other instance changed it), unprepares
noted by the other instance included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from neuron_dra.driver.daemon.claims.allocation import (
    AllocatedDevice,
    ClaimError,
    Reason,
    allocated_devices,
    consumer_pods,
    prepare_groups,
    results_of,
)
from neuron_dra.driver.daemon.claims.cdi import (
    CdiDevice,
    CdiError,
    CdiStore,
    DeviceNode,
    build_spec,
    check_claim_uid,
    qualified_id,
    spec_text,
)
from neuron_dra.driver.daemon.claims.checkpoint import (
    MAX_CONSUMERS,
    Checkpoint,
    CheckpointError,
    ClaimState,
    PreparedClaim,
    PreparedDevice,
)
from neuron_dra.driver.daemon.failpoints import CrashPoints
from neuron_dra.driver.errortext import capped, shown
from neuron_dra.driver.kubeletplugin import (
    CallLock,
    CallScope,
    Claim,
    ClaimFailed,
    ClaimLookup,
    ClaimLookupError,
    ClaimRef,
)
from neuron_dra.driver.model.devices import NeuronHost, UltraServer
from neuron_dra.driver.model.discovery import DiscoveryError, read_ultraserver
from neuron_dra.driver.model.errors import NotAllowed
from neuron_dra.driver.model.k8s_names import check_dns_label, check_dns_subdomain
from neuron_dra.driver.model.neuron_env import EnvError, core_ranges, request_env
from neuron_dra.driver.model.partitions import CoreLayout, parse_core_device
from neuron_dra.driver.model.slices import NODE_DEVICE_NAME, NodeFacts, PublishOptions, build_pool

log = logging.getLogger(__name__)


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Labelled(Protocol):
    def labels(self, *values: str) -> _Counter: ...


class _Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class ClaimMetrics(Protocol):
    """What prepare and unprepare count (observability/metrics.py's Metrics; a protocol, so that the claims
    import nothing of observability/, which reads the claims)."""

    @property
    def errors(self) -> _Labelled: ...
    @property
    def api_errors(self) -> _Labelled: ...
    @property
    def prepare_seconds(self) -> _Histogram: ...
    @property
    def unprepare_seconds(self) -> _Histogram: ...
    @property
    def prepared_claims(self) -> _Gauge: ...

PrepareResult = tuple[PreparedDevice, ...] | ClaimError


@dataclass(frozen=True)
class Plan:
    """What preparing one claim writes: the answer, the devices it holds, the CDI spec."""

    devices: tuple[PreparedDevice, ...]
    exclusive: tuple[int, ...]  # Neuron devices held, wholly or in part
    cdi_spec: str
    cores: tuple[int, ...] = ()  # physical NeuronCores held (global ids, see PreparedClaim.neuron_cores)


@dataclass(frozen=True)
class ReconcileReport:
    rewritten: tuple[str, ...] = ()  # completed claims whose CDI spec was (re)written
    dropped: tuple[str, ...] = ()  # unfinished prepares whose claims are gone: cleaned up
    kept: tuple[str, ...] = ()  # unfinished prepares whose claims still exist: left for kubelet's retry
    unresolved: tuple[str, ...] = ()  # unfinished prepares the API server could not tell about
    orphans_removed: tuple[str, ...] = ()  # CDI specs of this driver with no checkpoint entry
    restored: tuple[str, ...] = ()  # unfinished prepares the API server confirmed: prepared again (`_confirmed`)


class DriverState:
    def __init__(self, *, host: NeuronHost, host_root: Path, driver_name: str, pool_name: str, cdi: CdiStore,
                 checkpoint: Checkpoint, lookup: ClaimLookup, crash: CrashPoints | None = None,
                 metrics: ClaimMetrics | None = None, clock: Callable[[], float] = time.time,
                 cores: CoreLayout | None = None, lock: CallLock | None = None) -> None:
        """`lookup`: GETs for the driver's own checks (devices held by a claim that may be gone, unfinished
        prepares); prepare's claims come from the helper. `lock`: the helper's CallLock (Helper.lock_instances),
        held around every call; None: a lock of its own (this process is the only instance: tests, benchmarks)."""
        self.host = host
        self.host_root = host_root
        self.driver_name = driver_name
        self.pool_name = pool_name
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._lookup = lookup
        self._crash = crash or CrashPoints()
        self._metrics = metrics
        self._clock = clock
        # The node's cores (LNC); the pool with its core devices, whether or not the API server gets them.
        self.cores = cores or CoreLayout.for_spec(host.spec)
        pool = build_pool(host, NodeFacts(pool_name), PublishOptions(driver_name=driver_name, cores=self.cores))
        all_indexes = tuple(d.index for d in host.devices)
        # device name -> the Neuron devices it stands for (the UltraServer pseudo-device: all of them)
        self._device_indexes: dict[str, tuple[int, ...]] = {
            d.name: (d.index,) if d.index is not None else all_indexes for d in pool.devices
        }
        # device name -> the physical cores it holds (global ids): a whole device all of its own, a core its LNC
        physical = self.cores.physical_per_device
        self._device_cores: dict[str, tuple[int, ...]] = {}
        self._device_logical: dict[str, tuple[int, ...]] = {}  # core devices: their NEURON_RT_VISIBLE_CORES id
        # The name of the CDI device with a device's /dev/neuronN nodes, after the claim UID: the cores of one Neuron
        # device share their device's, so a container never gets the same /dev/neuronN twice.
        self._node_suffix: dict[str, str] = {}
        for name, indexes in self._device_indexes.items():
            core = parse_core_device(name)
            if core is None:
                self._device_cores[name] = tuple(i * physical + p for i in indexes for p in range(physical))
                self._node_suffix[name] = name
            else:
                index, logical = core
                self._node_suffix[name] = f"neuron-device-{index}"
                self._device_cores[name] = tuple(index * physical + p for p in self.cores.physical_cores(logical))
                self._device_logical[name] = (self.cores.global_core_id(index, logical),)
        # device name -> its /dev/neuronN nodes (built once: the host's devices do not change while it runs)
        self._device_nodes: dict[str, tuple[DeviceNode, ...]] = {
            name: tuple(DeviceNode(d.dev_path, d.dev_path, d.major, d.minor)
                        for d in (host.device(i) for i in indexes))
            for name, indexes in self._device_indexes.items()}
        self.lock = lock or CallLock()
        self._claims: dict[str, PreparedClaim] = {}

    # --- lifecycle -------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the checkpoint (CheckpointError when it is corrupt or of an unknown version)."""
        with self.lock.hold():
            self._claims = self._checkpoint.load()
        self._update_gauge()

    def close(self) -> None:
        with self.lock.hold():
            with contextlib.suppress(CheckpointError, OSError):
                self._refresh_locked()  # the fold below writes what is on disk, the other instance's records too
            self._checkpoint.close()  # folds the journal into checkpoint.json

    def hand_over(self) -> None:
        """The previous release is starting beside this instance (a rollback): from now on the checkpoint is
        written as snapshots that release can read and verify (Checkpoint.hand_over)."""
        with self.lock.hold():
            self._refresh_locked()
            self._checkpoint.hand_over()

    def prepared(self) -> Mapping[str, PreparedClaim]:
        with self._shared():
            return dict(self._claims)

    def _refresh_locked(self) -> None:
        claims = self._checkpoint.refresh()
        if claims is not None:
            self._claims = claims

    def _refresh_checked(self) -> None:
        """The claims as recorded on disk now (the other instance's changes too); ClaimError when unreadable."""
        try:
            self._refresh_locked()
        except CheckpointError as e:
            raise ClaimError(Reason.INTERNAL, f"reading what the other instance of the driver recorded: "
                                              f"{e}") from e
        except OSError as e:
            raise ClaimError(Reason.INTERNAL, f"reading the checkpoint {self._checkpoint.path} failed: "
                                              f"{e}") from e

    @contextlib.contextmanager
    def _shared(self) -> Iterator[None]:
        """Outside the helper's calls: the lock they run under, and the claims as recorded on disk now."""
        with self.lock.hold():
            self._refresh_checked()
            yield

    # --- what the helper calls besides prepare and unprepare ---------------------------------------------------

    def check(self, ref: ClaimRef, *, named: bool) -> None:
        """Refuse a ref whose UID cannot name a CDI file, or (prepare) whose namespace or name the API server could
        never have: before they reach a URL, a file name or a log line."""
        try:
            check_claim_uid(ref.uid)
        except CdiError as e:
            raise ClaimError(Reason.INVALID_REQUEST, str(e)) from e
        if not named:
            return
        if not ref.namespace or not ref.name:
            raise ClaimError(Reason.INVALID_REQUEST,
                             f"claim {ref.uid}: namespace and name are required (got {shown(ref.namespace)}, "
                             f"{shown(ref.name)})")
        try:
            check_dns_label("namespace", ref.namespace)
            check_dns_subdomain("name", ref.name)
        except NotAllowed as e:
            raise ClaimError(Reason.INVALID_REQUEST, f"claim {ref.uid}: {e}") from e

    def failed(self, method: str, ref: ClaimRef, failure: ClaimFailed) -> None:
        """A claim the helper failed (the checks above, its GET, its lock): logged and counted as ours are."""
        reason = failure.reason or Reason.INTERNAL.value
        log.warning(f"{method} failed", extra={"claim": str(ref), "reason": reason, "error": failure.message})
        if self._metrics:
            self._metrics.errors.labels(method, reason).inc()
            if reason == Reason.API_ERROR:
                self._metrics.api_errors.labels("get_resourceclaim").inc()

    # --- prepare ---------------------------------------------------------------------------------------------

    def has_prepared(self, uid: str) -> bool:
        """Recorded as prepared (a look without the lock: the records are replaced, never changed in place)?"""
        entry = self._claims.get(uid)
        return entry is not None and entry.state is ClaimState.PREPARE_COMPLETED

    def prepare(self, claims: Sequence[Claim | ClaimRef], call: CallScope) -> dict[str, PrepareResult | None]:
        """Prepare each claim (looked up and checked by the helper, which holds the CallLock); every claim gets a
        result, its devices or its error. A ref (`has_prepared` said so, no GET): the recorded answer, its CDI spec
        rewritten (tmpfs: a reboot wipes it), or None when it is no longer recorded as prepared (the helper then
        GETs the claim)."""
        try:
            self._refresh_checked()
        except ClaimError as e:
            return {c.uid: self._prepare_failed(c if isinstance(c, ClaimRef) else c.ref, e) for c in claims}
        return {c.uid: self._repeat(c, call) if isinstance(c, ClaimRef) else self._prepare_measured(c, call)
                for c in claims}

    def _repeat(self, ref: ClaimRef, call: CallScope) -> PrepareResult | None:
        entry = self._claims.get(ref.uid)
        if entry is None or entry.state is not ClaimState.PREPARE_COMPLETED:
            return None
        try:
            self._write_cdi(entry.uid, entry.cdi_spec)
        except ClaimError as e:
            return self._prepare_failed(ref, e)
        self._prepared(ref, entry.devices, call)
        return entry.devices

    def _prepared(self, ref: ClaimRef, devices: tuple[PreparedDevice, ...], call: CallScope) -> None:
        elapsed = time.perf_counter() - call.began  # since the call arrived: its GET included
        call.after_answer(lambda: self._note_prepared(ref, devices, elapsed))

    def _note_prepared(self, ref: ClaimRef, devices: tuple[PreparedDevice, ...], elapsed: float) -> None:
        if self._metrics:
            self._metrics.prepare_seconds.observe(elapsed)
        if log.isEnabledFor(logging.INFO):
            log.info("prepared claim", extra={"claim": str(ref), "devices": [d.device_name for d in devices],
                                              "seconds": round(elapsed, 6)})

    def _prepare_failed(self, ref: ClaimRef, e: ClaimError) -> ClaimError:
        log.warning("prepare failed", extra={"claim": str(ref), "reason": e.reason.value, "error": e.message})
        if self._metrics:
            self._metrics.errors.labels("prepare", e.reason.value).inc()
        return e

    def _prepare_measured(self, claim: Claim, call: CallScope) -> PrepareResult:
        try:
            devices = self._prepare_one(claim, call.ticket)
        except ClaimError as e:
            return self._prepare_failed(claim.ref, e)
        except Exception as e:  # never let one claim take down the call
            log.exception("prepare failed unexpectedly", extra={"claim": str(claim.ref)})
            if self._metrics:
                self._metrics.errors.labels("prepare", Reason.INTERNAL.value).inc()
            return ClaimError(Reason.INTERNAL, f"claim {claim.ref}: internal error: {e!r}")
        self._prepared(claim.ref, devices, call)
        return devices

    def _prepare_one(self, claim: Claim, ticket: int) -> tuple[PreparedDevice, ...]:
        ref = claim.ref
        entry = self._claims.get(ref.uid)
        # Prepared meanwhile (by the other instance, or a concurrent call): the recorded answer, spec rewritten.
        if entry is not None and entry.state is ClaimState.PREPARE_COMPLETED:
            self._write_cdi(entry.uid, entry.cdi_spec)
            return entry.devices
        plan = self.plan(ref, allocated_devices(claim, self.driver_name, self.pool_name, self.host.spec))
        if self._checkpoint.unprepared_since(ref.uid, ticket):
            raise ClaimError(Reason.UNPREPARED_MEANWHILE,
                             f"claim {ref} was unprepared while this prepare was in flight; not preparing it")
        conflicts = self._conflicts_locked(ref.uid, plan.cores)
        if conflicts:
            # Is each holder still a live claim that owns these devices? (a GET each, under the lock: rare)
            live = [c for c in conflicts if self._is_live(c)]
            if live:
                raise self._busy(ref, plan, live)
            self._release_stale_locked(conflicts)
        self._commit_locked(ref, plan, consumer_pods(claim.data, MAX_CONSUMERS))
        return plan.devices

    def _busy(self, ref: ClaimRef, plan: Plan, live: Sequence[PreparedClaim]) -> ClaimError:
        """DEVICE_BUSY naming the devices and physical cores `live` claims hold of `plan`, and those claims."""
        physical = self.cores.physical_per_device
        busy = sorted(set(plan.cores) & {i for c in live for i in self._held_cores(c)})
        per_device: dict[int, list[int]] = {}
        for i in busy:
            per_device.setdefault(i // physical, []).append(i % physical)
        where = "; ".join(f"{d}: {core_ranges(c)}" for d, c in per_device.items())
        holders = ", ".join(f"{c.namespace}/{c.name} ({c.uid})" for c in live)
        devices = ", ".join(map(str, per_device))
        return ClaimError(Reason.DEVICE_BUSY, f"claim {ref}: Neuron device(s) {devices} (physical cores {where}) are "
                                              f"prepared for another live claim: {holders}")

    def _ask(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The lookup's answer. Any failure of it is a ClaimLookupError (retryable, per claim), also one the
        lookup did not expect, such as RecursionError from an answer nested too deeply to decode."""
        try:
            return self._lookup.get(namespace, name)
        except ClaimLookupError:
            raise
        except Exception as e:
            raise ClaimLookupError(f"reading claim {namespace}/{name} failed: {capped(repr(e))}") from None

    def plan(self, ref: ClaimRef, allocated: Sequence[AllocatedDevice]) -> Plan:
        """Answer, held devices and CDI spec for `allocated` (pure, apart from reading the UltraServer files)."""
        ultraserver = self._ultraserver(ref, allocated)
        by_request: dict[str, list[AllocatedDevice]] = {}
        exclusive: set[int] = set()
        held_cores: set[int] = set()
        node_devices: dict[str, CdiDevice] = {}
        node_of: dict[str, str] = {}  # device -> its device-node CDI device's name
        groups = prepare_groups(ref, allocated, ultraserver, self.host.instance_type)  # UltraServer group devices
        for a in allocated:
            if a.group is not None:
                continue
            indexes = self._device_indexes.get(a.device)
            if indexes is None:
                known = ", ".join(sorted(self._device_indexes, key=_device_sort_key))
                raise ClaimError(Reason.UNKNOWN_DEVICE,
                                 f"claim {ref}: device {a.device!r} is not in pool {self.pool_name} (devices: {known})")
            if not a.admin_access:
                exclusive.update(indexes)
                held_cores.update(self._device_cores[a.device])
            by_request.setdefault(a.base_request, []).append(a)
            name = node_of[a.device] = f"{ref.uid}-{self._node_suffix[a.device]}"
            if name not in node_devices:
                node_devices[name] = CdiDevice(name, device_nodes=self._device_nodes[a.device])
        env_devices: list[CdiDevice] = []
        answer: list[PreparedDevice] = []
        for request, devs in by_request.items():
            whole = sorted({i for a in devs if a.device not in self._device_logical
                            for i in self._device_indexes[a.device]})
            logical = sorted({c for a in devs for c in self._device_logical.get(a.device, ())})
            config = devs[0].config  # one base request allocates from one subrequest: one config
            with_us = any(a.device == NODE_DEVICE_NAME for a in devs) or config.ultraserver_mode is not None
            try:
                env = request_env(self.host, whole, config, ultraserver, with_us, node_lnc=self.cores.lnc,
                                  core_ids=logical)
            except EnvError as e:
                raise ClaimError(Reason.BAD_CONFIG, f"claim {ref}, request {request!r}: {e}") from e
            env_name = f"{ref.uid}-request-{request}"
            env_devices.append(CdiDevice(env_name, env=env))
            named: set[str] = set()
            for a in devs:
                # The cores of one Neuron device share its device-node CDI device: name it once per request, so
                # the runtime is never handed the same CDI id (and /dev/neuronN) twice.
                node = node_of[a.device]
                ids = (qualified_id(env_name),) if node in named else (qualified_id(node), qualified_id(env_name))
                named.add(node)
                answer.append(PreparedDevice((request,), self.pool_name, a.device, ids))
        env_devices += [device for device, _ in groups]
        answer += [prepared for _, prepared in groups]
        try:
            spec = build_spec([*node_devices.values(), *env_devices])
        except CdiError as e:
            raise ClaimError(Reason.INVALID_REQUEST, f"claim {ref}: {e}") from e
        return Plan(tuple(answer), tuple(sorted(exclusive)), spec_text(spec), tuple(sorted(held_cores)))

    def _ultraserver(self, ref: ClaimRef, allocated: Sequence[AllocatedDevice]) -> UltraServer | None:
        """The UltraServer class files, read only when a device of `allocated` needs them."""
        if not any(a.device == NODE_DEVICE_NAME or a.config.ultraserver_mode is not None or a.group is not None
                   for a in allocated):
            return None
        try:
            return read_ultraserver(self.host_root)
        except DiscoveryError as e:
            raise ClaimError(Reason.INTERNAL, f"claim {ref}: reading the UltraServer class files: {e}") from e

    def _held_cores(self, entry: PreparedClaim) -> tuple[int, ...]:
        if entry.neuron_cores is not None:
            return entry.neuron_cores
        physical = self.cores.physical_per_device
        return tuple(i * physical + p for i in entry.neuron_indexes for p in range(physical))

    def _conflicts_locked(self, uid: str, cores: Iterable[int]) -> list[PreparedClaim]:
        wanted = set(cores)
        return [c for u, c in self._claims.items() if u != uid and wanted & set(self._held_cores(c))]

    def _is_live(self, entry: PreparedClaim) -> bool:
        """Does the claim holding these devices still exist with this UID and still own them?"""
        try:
            return self._owns(self._ask(entry.namespace, entry.name), entry)
        except (ClaimLookupError, ClaimError):
            return True  # cannot tell (no answer, or a malformed one): keep the devices where they are

    def _owns(self, obj: Mapping[str, Any] | None, entry: PreparedClaim) -> bool:
        """Does `obj` (None: gone) still have `entry`'s UID and devices? ClaimError when it is malformed."""
        claim = self._checked(obj, entry)
        held = {(d.pool_name, d.device_name) for d in entry.devices}  # this node's pool, or an UltraServer group's
        return claim is not None and any(
            r.driver == self.driver_name and (r.pool, r.device) in held for r in results_of(claim.allocation,
                                                                                          claim.ref))

    @staticmethod
    def _checked(obj: Mapping[str, Any] | None, entry: PreparedClaim) -> Claim | None:
        """`obj` as the allocated claim of `entry` (Claim.checked); None when gone, replaced or not allocated;
        ClaimError when malformed."""
        if obj is None:
            return None
        try:
            return Claim.checked(ClaimRef(entry.namespace, entry.name, entry.uid), obj)
        except ClaimFailed as e:
            if e.reason in (Reason.UID_MISMATCH, Reason.NOT_ALLOCATED):
                return None
            raise ClaimError(Reason.MALFORMED_CLAIM, e.message) from e

    def _release_stale_locked(self, stale: Sequence[PreparedClaim]) -> None:
        current = dict(self._claims)
        for entry in stale:
            if current.get(entry.uid) == entry:  # equal: a refresh reads new objects
                log.warning("releasing devices of a claim that is gone and was never unprepared",
                            extra={"claim": f"{entry.namespace}/{entry.name} ({entry.uid})",
                                   "devices": list(entry.neuron_indexes)})
                self._cdi.remove(entry.uid)
                del current[entry.uid]
        self._save_locked(current)

    def _commit_locked(self, ref: ClaimRef, plan: Plan, consumers: tuple[tuple[str, ...], int] = ((), 0)) -> None:
        """The CDI spec, then one synced write of the claim as PrepareCompleted (its record twice: one damaged
        byte leaves a copy). A crash in between leaves a spec no entry knows, removed at the next start
        (`reconcile_local`): the started state is derived from the CDI directory rather than recorded
        (docs/durability.md)."""
        completed = PreparedClaim(ref.uid, ref.namespace, ref.name, ClaimState.PREPARE_COMPLETED, plan.devices,
                                  plan.exclusive, plan.cdi_spec, self._clock(), plan.cores, *consumers)
        self._write_cdi(ref.uid, plan.cdi_spec)
        self._crash.hit("prepare-after-cdi")
        try:
            self._save_locked({**self._claims, ref.uid: completed}, twice=True)
        except ClaimError:
            with contextlib.suppress(OSError):
                self._cdi.remove(ref.uid)
            raise
        self._crash.hit("prepare-after-completed")
        self._update_gauge()

    def _save_locked(self, claims: dict[str, PreparedClaim], *, unprepared: tuple[str, int] | None = None,
                     twice: bool = False) -> None:
        try:
            self._checkpoint.save(claims, unprepared=unprepared, twice=twice)
        except OSError as e:
            raise ClaimError(Reason.INTERNAL, f"writing the checkpoint {self._checkpoint.path} failed: {e}") from e
        self._claims = claims

    def _write_cdi(self, uid: str, text: str) -> None:
        try:
            self._cdi.write(uid, text)
        except OSError as e:
            raise ClaimError(Reason.INTERNAL, f"writing the CDI spec {self._cdi.path_for(uid)} failed: {e}") from e

    # --- unprepare -------------------------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef], call: CallScope) -> dict[str, ClaimError | None]:
        """Unprepare each claim from local state alone (the helper holds the CallLock); unknown claims succeed."""
        try:
            self._refresh_checked()
        except ClaimError as e:
            return {r.uid: self._unprepare_failed(r, e) for r in refs}
        return {r.uid: self._unprepare_measured(r, call) for r in refs}

    def _unprepare_failed(self, ref: ClaimRef, e: ClaimError) -> ClaimError:
        log.warning("unprepare failed", extra={"claim": str(ref), "reason": e.reason.value, "error": e.message})
        if self._metrics:
            self._metrics.errors.labels("unprepare", e.reason.value).inc()
        return e

    def _unprepare_measured(self, ref: ClaimRef, call: CallScope) -> ClaimError | None:
        start = time.perf_counter()
        try:
            self._unprepare_locked(ref, call.ticket)
        except ClaimError as e:
            return self._unprepare_failed(ref, e)
        elapsed = time.perf_counter() - start
        call.after_answer(lambda: self._note_unprepared(ref, elapsed))
        return None

    def _note_unprepared(self, ref: ClaimRef, elapsed: float) -> None:
        if self._metrics:
            self._metrics.unprepare_seconds.observe(elapsed)
        if log.isEnabledFor(logging.INFO):
            log.info("unprepared claim", extra={"claim": str(ref), "seconds": round(elapsed, 6)})

    def _unprepare_locked(self, ref: ClaimRef, ticket: int) -> None:
        entry = self._claims.get(ref.uid)
        try:
            self._cdi.remove(ref.uid)  # also removes an orphaned spec of an unknown claim
        except OSError as e:
            raise ClaimError(Reason.INTERNAL, f"removing the CDI spec of claim {ref} failed: {e}") from e
        self._crash.hit("unprepare-after-cdi")
        # Noted in the shared records, so that a prepare of the claim in flight on either instance does not commit.
        if entry is not None:
            self._save_locked({u: c for u, c in self._claims.items() if u != ref.uid}, unprepared=(ref.uid, ticket))
        else:
            try:
                self._checkpoint.note_unprepared(ref.uid, ticket)
            except OSError as e:
                raise ClaimError(Reason.INTERNAL, f"writing the checkpoint {self._checkpoint.path} failed: "
                                                  f"{e}") from e
        self._crash.hit("unprepare-after-checkpoint")
        self._update_gauge()

    # --- reconcile -------------------------------------------------------------------------------------------

    def reconcile_local(self) -> ReconcileReport:
        """Before serving, from local state alone: rewrite the CDI specs of prepared claims (the CDI dir is
        tmpfs and may have been wiped by a reboot), remove temp files of interrupted writes and CDI specs of
        this driver that no checkpoint entry knows (a crash between writing the spec and recording it)."""
        self._cdi.ensure_root()
        self._cdi.remove_temp_files()
        rewritten = []
        with self._shared():
            for c in self._claims.values():
                if c.state is not ClaimState.PREPARE_COMPLETED:
                    continue
                try:
                    current = self._cdi.read(c.uid)
                except CdiError as e:
                    # Whatever is there cannot be what we wrote: moved aside, rewritten from the checkpoint.
                    moved = self._cdi.quarantine(c.uid)
                    log.warning("unreadable CDI spec of a prepared claim quarantined; rewriting it from the "
                                "checkpoint", extra={"claim": c.uid, "error": str(e), "moved_to": str(moved)})
                    current = None
                if current != c.cdi_spec:
                    self._write_cdi(c.uid, c.cdi_spec)
                    rewritten.append(c.uid)
            orphans = sorted(self._cdi.claim_uids() - set(self._claims))
            for uid in orphans:
                self._cdi.remove(uid)
        self._update_gauge()
        report = ReconcileReport(rewritten=tuple(rewritten), orphans_removed=tuple(orphans))
        log.info("reconciled checkpoint and CDI directory", extra={"rewritten": rewritten, "orphans_removed": orphans})
        return report

    def resolve_unfinished(self) -> ReconcileReport:
        """Prepares that never completed (the daemon died in between, or damaged checkpoint bytes left them in
        doubt): drop those whose claims are gone (deleted, replaced, or no longer allocated these devices); restore
        as prepared those the API server confirms (`_confirmed`), so the prepared-claims gauge and the per-pod
        attribution count them; keep the others for kubelet's retry or unprepare. Asks the API server, so it runs
        after serving has started; entries it cannot check yet are reported as unresolved."""
        with self._shared():
            unfinished = [c for c in self._claims.values() if c.state is ClaimState.PREPARE_STARTED]
        dropped: list[str] = []
        kept: list[str] = []
        unresolved: list[str] = []
        restored: list[str] = []
        for c in unfinished:
            # Whatever the answer, one entry's check never stops the others or the daemon (a raise here at
            # start-up would exit, and kubelet's restart would raise again): what cannot be checked stays.
            try:
                obj = self._ask(c.namespace, c.name)
                owned = self._owns(obj, c)
            except ClaimLookupError as e:
                log.warning("cannot check an unfinished prepare yet", extra={"claim": c.uid, "error": str(e)})
                unresolved.append(c.uid)
                continue
            except ClaimError as e:
                log.warning("cannot check an unfinished prepare: its claim is malformed; keeping its devices",
                            extra={"claim": c.uid, "reason": e.reason.value, "error": e.message})
                unresolved.append(c.uid)
                continue
            if owned:
                (restored if obj is not None and self._restore(c, obj) else kept).append(c.uid)
                continue
            with self._shared():
                if self._claims.get(c.uid) == c:  # not completed or replaced meanwhile
                    self._cdi.remove(c.uid)
                    self._save_locked({u: x for u, x in self._claims.items() if u != c.uid})
                    dropped.append(c.uid)
        if unfinished:
            self._update_gauge()
            log.info("checked unfinished prepares", extra={"dropped": dropped, "kept": kept, "unresolved": unresolved,
                                                           "restored": restored})
        return ReconcileReport(dropped=tuple(dropped), kept=tuple(kept), unresolved=tuple(unresolved),
                               restored=tuple(restored))

    def _confirmed(self, obj: Mapping[str, Any], entry: PreparedClaim) -> PreparedClaim | None:
        """`entry` as prepared, when the API server confirms it: the claim is allocated exactly these devices of this
        node (the answer and CDI spec a prepare of it would give are the recorded ones) and is reserved for a pod;
        else None (any problem with the claim: not confirmed)."""
        try:
            claim = self._checked(obj, entry)
            if claim is None:
                return None
            plan = self.plan(claim.ref, allocated_devices(claim, self.driver_name, self.pool_name, self.host.spec))
        except ClaimError:
            return None
        pods, omitted = consumer_pods(obj, MAX_CONSUMERS)
        if not pods or plan.devices != entry.devices or plan.cdi_spec != entry.cdi_spec:
            return None
        return dataclasses.replace(entry, state=ClaimState.PREPARE_COMPLETED, consumers=pods,
                                   consumers_omitted=omitted)

    def _restore(self, entry: PreparedClaim, obj: Mapping[str, Any]) -> bool:
        """Record a confirmed unfinished prepare as prepared (its CDI spec written first, as a prepare does)."""
        confirmed = self._confirmed(obj, entry)
        if confirmed is None:
            return False
        try:
            with self._shared():
                if self._claims.get(entry.uid) != entry:  # completed, unprepared or replaced meanwhile
                    return False
                self._write_cdi(entry.uid, confirmed.cdi_spec)
                self._save_locked({**self._claims, entry.uid: confirmed})
        except ClaimError as e:
            log.warning("cannot restore a confirmed unfinished prepare; keeping it unfinished",
                        extra={"claim": entry.uid, "reason": e.reason.value, "error": e.message})
            return False
        return True

    def reconcile(self) -> ReconcileReport:
        """Both steps (local first); never drops a completed claim."""
        local = self.reconcile_local()
        remote = self.resolve_unfinished()
        return ReconcileReport(local.rewritten, remote.dropped, remote.kept, remote.unresolved, local.orphans_removed,
                               remote.restored)

    def _update_gauge(self) -> None:
        # No lock: self._claims is replaced, never mutated in place, so this reads one consistent dict
        # (and callers may hold the lock already).
        if self._metrics:
            claims = self._claims
            self._metrics.prepared_claims.set(sum(1 for c in claims.values()
                                                  if c.state is ClaimState.PREPARE_COMPLETED))


def _device_sort_key(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)
