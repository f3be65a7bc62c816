"""What the plugin layer and a driver on it share: a claim as kubelet names it (`ClaimRef`), a claim as the helper
hands it to the driver's prepare (`Claim`: looked up and checked), kubelet's view of one call (`CallScope`), a
claim's failure (`ClaimFailed`), and the one API read prepare needs (`ClaimLookup`) with its retryable failure."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from neuron_dra.driver.errortext import shown

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What kubelet sends per claim: namespace, name and UID only."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        # Capped: kubelet's fields are checked after they are first logged, and may be of any size.
        return f"{self.namespace[:63]}/{self.name[:253]} ({self.uid[:128]})"


class ClaimLookupError(RuntimeError):
    """The API server did not answer (unreachable, timeout, 5xx, forbidden): retryable."""


class ClaimLookup(Protocol):
    """The one API call prepare needs. Returns the ResourceClaim as JSON, or None when it does not exist."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class ClaimFailed(Exception):
    """One claim cannot be prepared (or unprepared): `message` goes into that claim's `error` for kubelet.
    `reason`: a short label for logs and metrics (the helper's own: REASONS)."""

    def __init__(self, message: str, reason: str = "") -> None:
        self.message = message
        self.reason = reason
        super().__init__(message)


# Why the helper failed a claim before the driver saw it (a driver's own reasons may add to these).
INVALID_REQUEST = "invalid_request"  # kubelet's ref is refused by the driver's `check` (Driver protocol)
NOT_FOUND = "not_found"
MALFORMED_CLAIM = "malformed_claim"
UID_MISMATCH = "uid_mismatch"
NOT_ALLOCATED = "not_allocated"
API_ERROR = "api_error"
ABANDONED = "abandoned"
LOCK_TIMEOUT = "lock_timeout"  # another instance of the driver (rolling update) held the instances' lock
REASONS = (INVALID_REQUEST, NOT_FOUND, MALFORMED_CLAIM, UID_MISMATCH, NOT_ALLOCATED, API_ERROR, ABANDONED,
           LOCK_TIMEOUT)


def _malformed(ref: ClaimRef, where: str, value: object, expected: str) -> ClaimFailed:
    return ClaimFailed(f"claim {ref}: {where} is {shown(value)} ({type(value).__name__}); expected {expected}",
                       MALFORMED_CLAIM)


def _field(ref: ClaimRef, parent: Mapping[str, Any], where: str, key: str, kind: type) -> Any:
    """parent[key] when it is of `kind` (an object: a Mapping), None when missing or null; MALFORMED_CLAIM else."""
    value = parent.get(key)
    if value is None or (isinstance(value, kind) and (kind is Mapping or type(value) is kind)):
        return value
    raise _malformed(ref, f"{where}.{key}", value, "an object" if kind is Mapping else "a string")


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim as the helper hands it to `Driver.prepare`, as the Go helper hands `*ResourceClaim`: the
    API server's JSON (`data`, read-only; read defensively past the fields checked here) with kubelet's `ref`,
    checked to have the UID kubelet asked for and an allocation (`allocation`: status.allocation, an object)."""

    ref: ClaimRef
    data: Mapping[str, Any]
    allocation: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return self.ref.uid

    @staticmethod
    def checked(ref: ClaimRef, obj: object) -> Claim:
        """`obj` (a GET's answer) as a Claim of `ref`; ClaimFailed (UID_MISMATCH: deleted and replaced;
        NOT_ALLOCATED; MALFORMED_CLAIM naming the field) otherwise."""
        if not isinstance(obj, Mapping):
            raise _malformed(ref, "the claim", obj, "an object")
        metadata = _field(ref, obj, "claim", "metadata", Mapping) or {}
        uid = _field(ref, metadata, "metadata", "uid", str)
        if uid != ref.uid:
            raise ClaimFailed(f"claim {ref.namespace}/{ref.name} has uid {shown(uid)}, kubelet asked for "
                              f"{ref.uid!r}: the claim was deleted and replaced", UID_MISMATCH)
        status = _field(ref, obj, "claim", "status", Mapping) or {}
        allocation = _field(ref, status, "status", "allocation", Mapping)
        if allocation is None:
            raise ClaimFailed(f"claim {ref} is not allocated (status.allocation is not set)", NOT_ALLOCATED)
        return Claim(ref, obj, allocation)


_ticket_lock = threading.Lock()
_last_ticket = 0


def _next_ticket() -> int:
    """A call's arrival: time.monotonic_ns (comparable with another instance's: one clock per node), strictly
    increasing within this process."""
    global _last_ticket
    with _ticket_lock:
        _last_ticket = max(_last_ticket + 1, time.monotonic_ns())
        return _last_ticket


class CallScope:
    """kubelet's view of one call: its arrival (`ticket`, `began`), its deadline (time.monotonic) and whether it
    was cancelled.

    The gRPC handler makes one per call as it arrives (deadline from context.time_remaining(), `abandon` from
    context.add_callback, which runs when the call ends for any reason); work for the call checks `abandoned`
    before starting and registers `on_abandon` to cancel what is queued; work nobody waits for (a log line, a
    metric) goes to `after_answer`, so that kubelet has its answer first. `ticket` orders calls across the
    driver's instances: a driver that records unprepares with their tickets can refuse a prepare that arrived
    before an unprepare of the same claim was answered (docs/architecture.md, the prepare walk)."""

    __slots__ = ("_abandoned", "_callbacks", "_ends", "_lock", "began", "deadline", "ticket")

    def __init__(self, deadline: float | None = None, *, ends: bool = False) -> None:
        """`ends`: `abandon` will be called when the call is over (the gRPC handler's scope); without it,
        `after_answer` work runs at once (a direct caller's scope)."""
        self.deadline = deadline
        self.ticket = _next_ticket()
        self.began = time.perf_counter()
        self._lock = threading.Lock()
        self._abandoned = False
        self._callbacks: list[Callable[[], object]] = []
        self._ends = ends

    @property
    def abandoned(self) -> bool:
        return self._abandoned or (self.deadline is not None and time.monotonic() >= self.deadline)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # one failed callback never skips the others
                log.exception("a callback at the end of a call failed")

    def after_answer(self, fn: Callable[[], object]) -> None:
        """Run `fn` once the call is over (kubelet has its answer, or gave up on it), in the thread that ends it;
        at once when the call is over already or its end is not hooked."""
        if self._ends:
            self.on_abandon(fn)
        else:
            fn()

    def on_abandon(self, fn: Callable[[], object]) -> None:
        with self._lock:
            if not self._abandoned:
                self._callbacks.append(fn)
                return
        fn()
