"""What the plugin layer and a driver on it share: a claim as kubelet names it, kubelet's view of one call, a
claim's failure, and the one API read prepare needs with its retryable failure."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
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
    """One claim cannot be prepared (or unprepared): `message` goes into that claim's `error` for kubelet."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class CallScope:
    """kubelet's view of one call: its deadline (time.monotonic) and whether it was cancelled.

    The gRPC handler makes one per call (deadline from context.time_remaining(), `abandon` from
    context.add_callback, which runs when the call ends for any reason); work for the call checks `abandoned`
    before starting and registers `on_abandon` to cancel what is queued."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._abandoned = False
        self._callbacks: list[Callable[[], object]] = []

    @property
    def abandoned(self) -> bool:
        return self._abandoned or (self.deadline is not None and time.monotonic() >= self.deadline)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def on_abandon(self, fn: Callable[[], object]) -> None:
        with self._lock:
            if not self._abandoned:
                self._callbacks.append(fn)
                return
        fn()
