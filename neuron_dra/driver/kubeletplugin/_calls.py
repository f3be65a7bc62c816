"""One NodePrepareResources or NodeUnprepareResources call from kubelet's refs to the driver's answers, as the Go
helper's draplugin.go does it: the claim GET with its checks, then the driver under the lock the instances share.

Prepare: the driver's `check` of each ref (before any URL or file name is built from it); a claim the driver has
prepared already (`Driver.has_prepared`, kubelet repeats prepares after its restart) is handed over as its ref, without
a GET, so the repeat is answered from the driver's records even while the API server is unreachable (the Go helper
GETs every claim); the claim GETs of the others (outside
the lock, so a slow API call delays only its own call; one claim inline, several in parallel in a small pool
that an abandoned call stops feeding), `Claim.checked` (the UID kubelet asked for, status.allocation set), then
`Driver.prepare` with the claims, under the CallLock until the call's deadline. Unprepare: `check`, then
`Driver.unprepare` with the refs under the CallLock. Every claim gets an answer; a claim failed here is reported
to the driver (`Driver.failed`) for its logs and metrics. The call's CallScope carries its arrival ticket, taken
before any wait, so a driver can order a prepare against an unprepare that overtook it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future
from typing import Protocol

from neuron_dra.driver.errortext import capped
from neuron_dra.driver.kubeletplugin._claimref import (
    ABANDONED,
    API_ERROR,
    LOCK_TIMEOUT,
    NOT_FOUND,
    CallScope,
    Claim,
    ClaimFailed,
    ClaimLookup,
    ClaimLookupError,
    ClaimRef,
)
from neuron_dra.driver.kubeletplugin._grpcserver import DaemonThreadPool
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, LockTimeout

LOOKUP_WORKERS = 8  # claims of one call looked up at once


class PreparedDevice(Protocol):
    """One device of a prepared claim, as kubelet is told it."""

    @property
    def request_names(self) -> Sequence[str]: ...
    @property
    def pool_name(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def cdi_device_ids(self) -> Sequence[str]: ...


PrepareAnswer = Sequence[PreparedDevice] | ClaimFailed


class Driver(Protocol):
    """What the helper calls. `prepare` and `unprepare` run under the CallLock (one at a time across the
    driver's instances); every claim handed over gets a result, its devices or its failure."""

    def check(self, ref: ClaimRef, *, named: bool) -> None:
        """Raise ClaimFailed for a ref the driver refuses, before it is looked up or used (`named`: prepare,
        which GETs the claim by namespace and name; unprepare needs the UID only)."""

    def has_prepared(self, uid: str) -> bool:
        """Has the driver prepared this claim already (a look without the lock: a hint)? Its ref is then handed to
        `prepare` without a GET."""

    def prepare(self, claims: Sequence[Claim | ClaimRef], call: CallScope) -> Mapping[str, PrepareAnswer | None]:
        """A ClaimRef (a claim `has_prepared` named): the recorded answer, or None when the driver needs the claim
        after all (the helper then GETs it and calls again)."""

    def unprepare(self, refs: Sequence[ClaimRef], call: CallScope) -> Mapping[str, ClaimFailed | None]: ...

    def failed(self, method: str, ref: ClaimRef, failure: ClaimFailed) -> None:
        """A claim the helper failed before the driver saw it (`method`: "prepare" or "unprepare")."""


class Calls:
    """The call path between the DRA service and the driver (and what tests drive a driver through)."""

    def __init__(self, driver: Driver, lookup: ClaimLookup, lock: CallLock, workers: int = LOOKUP_WORKERS) -> None:
        self._driver = driver
        self._lookup = lookup
        self._lock = lock
        self._workers = workers
        # Made by the first call with several claims; daemon threads: a lookup in flight never holds the exit.
        self._executor: DaemonThreadPool | None = None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _fail(self, method: str, ref: ClaimRef, failure: ClaimFailed) -> ClaimFailed:
        self._driver.failed(method, ref, failure)
        return failure

    def _checked(self, method: str, refs: Sequence[ClaimRef], out: dict[str, object]) -> list[ClaimRef]:
        """The refs the driver accepts, each claim once (kubelet's last ref of a UID); failures into `out`."""
        unique = {r.uid: r for r in refs}
        accepted = []
        named = method == "prepare"
        for uid, r in unique.items():
            try:
                self._driver.check(r, named=named)
            except ClaimFailed as e:
                out[uid] = self._fail(method, r, e)
                continue
            accepted.append(r)
        return accepted

    def prepare(self, refs: Sequence[ClaimRef], call: CallScope | None = None) -> dict[str, PrepareAnswer]:
        call = call or CallScope()
        out: dict[str, object] = dict.fromkeys(r.uid for r in refs)  # kubelet's order
        todo = self._checked("prepare", refs, out)
        known = [r for r in todo if self._driver.has_prepared(r.uid)]
        if known:
            todo = [r for r in todo if r not in known]
        if len(todo) == 1:
            claims = [c for c in (self._claim(todo[0], call, out),) if c is not None]
        else:
            claims = self._claims(todo, call, out)
        self._prepare([*known, *claims], call, out)
        again = [r for r in known if out[r.uid] is None]  # no longer prepared once under the lock: GET it
        if again:
            self._prepare(self._claims(again, call, out), call, out)
        return out  # type: ignore[return-value]  # every entry set above

    def _prepare(self, items: Sequence[Claim | ClaimRef], call: CallScope, out: dict[str, object]) -> None:
        """The driver's prepare under the lock, unless kubelet gave up on the call by then (before the lock or
        while waiting for it): nobody waits for that work, and it would hold the lock (with the driver's own API
        calls, such as a conflicting holder's liveness GET) against the calls that are waited for. Kubelet
        retries the claims."""
        if not items:
            return
        timeout: LockTimeout | None = None
        try:
            if not call.abandoned:
                with self._lock.hold(call.deadline):
                    if not call.abandoned:  # it may have waited for the lock
                        out.update(self._driver.prepare(items, call))
                        return
        except LockTimeout as e:
            timeout = e
        for c in items:
            ref = c.ref if isinstance(c, Claim) else c
            out[ref.uid] = self._abandoned(ref) if timeout is None else self._fail(
                "prepare", ref, ClaimFailed(f"{timeout}; kubelet retries", LOCK_TIMEOUT))

    def unprepare(self, refs: Sequence[ClaimRef], call: CallScope | None = None) -> dict[str, ClaimFailed | None]:
        """From the driver's records alone (no API call). The lock is waited for without a deadline: an unprepare
        that timed out would leave the claim's devices held until kubelet's retry."""
        call = call or CallScope()
        out: dict[str, object] = dict.fromkeys(r.uid for r in refs)
        todo = self._checked("unprepare", refs, out)
        if todo:
            with self._lock.hold(None):
                out.update(self._driver.unprepare(todo, call))
        return out  # type: ignore[return-value]

    def _claim(self, ref: ClaimRef, call: CallScope, out: dict[str, object]) -> Claim | None:
        """The claim of `ref`, looked up and checked; None with its failure in `out`."""
        if call.abandoned:
            out[ref.uid] = self._abandoned(ref)
            return None
        try:
            try:
                obj = self._lookup.get(ref.namespace, ref.name)
            except ClaimLookupError as e:
                raise ClaimFailed(f"claim {ref}: reading it from the API server failed: {e}", API_ERROR) from e
            except Exception as e:  # one the lookup did not expect, e.g. RecursionError from an answer too deep
                raise ClaimFailed(f"claim {ref}: reading it from the API server failed: reading claim "
                                  f"{ref.namespace}/{ref.name} failed: {capped(repr(e))}", API_ERROR) from None
            if obj is None:
                raise ClaimFailed(f"claim {ref} does not exist", NOT_FOUND)
            return Claim.checked(ref, obj)
        except ClaimFailed as e:
            out[ref.uid] = self._fail("prepare", ref, e)
            return None

    def _claims(self, refs: Sequence[ClaimRef], call: CallScope, out: dict[str, object]) -> list[Claim]:
        """Several claims looked up in parallel; once kubelet gives up on the call, those not started yet are
        not looked up at all (their queued work is cancelled), so an abandoned call cannot keep the pool busy."""
        if not refs:
            return []
        if self._executor is None:
            self._executor = DaemonThreadPool(self._workers, "claim-lookup")
        executor = self._executor
        futures: list[Future[Claim | None]] = [executor.submit(self._claim, r, call, out) for r in refs]
        call.on_abandon(lambda: [f.cancel() for f in futures])
        claims = []
        for r, f in zip(refs, futures, strict=True):
            try:
                c = f.result()
            except CancelledError:
                out[r.uid] = self._abandoned(r)
                continue
            if c is not None:
                claims.append(c)
        return claims

    def _abandoned(self, ref: ClaimRef) -> ClaimFailed:
        return self._fail("prepare", ref, ClaimFailed(
            f"claim {ref}: kubelet gave up on this call (deadline passed or cancelled) before it was prepared; "
            "kubelet retries", ABANDONED))
