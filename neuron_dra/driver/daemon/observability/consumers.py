"""The pods of prepared claims, re-read now and then: kubelet prepares a claim once, for its first pod, so a pod
that joins a shared claim later reaches the driver only through the claim's `status.reservedFor`.

At most MAX_PER_ROUND GETs a round (round robin) through the rate-limited client, so the attribution metrics never
cost prepare more than a few requests a minute. Kept in memory: the checkpoint has the pods seen at prepare, and
a restart re-reads the rest on its first round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from neuron_dra.driver.daemon.claims.allocation import consumer_pods
from neuron_dra.driver.daemon.claims.checkpoint import MAX_CONSUMERS, ClaimState, PreparedClaim
from neuron_dra.driver.kubeletplugin import ClaimLookup, ClaimLookupError

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 60.0  # seconds between rounds
MAX_PER_ROUND = 32

Consumers = tuple[tuple[str, ...], int]  # pod names, how many more


class ConsumerRefresher:
    def __init__(self, claims: Callable[[], Mapping[str, PreparedClaim]], lookup: ClaimLookup,
                 max_per_round: int = MAX_PER_ROUND) -> None:
        self._claims = claims
        self._lookup = lookup
        self._max = max_per_round
        self._known: dict[str, Consumers] = {}
        self._cursor = ""  # the last uid asked about: the next round starts after it

    def current(self) -> Mapping[str, Consumers]:
        """uid -> the pods last read from the API server (claims not re-read yet are absent)."""
        return dict(self._known)

    def refresh_once(self) -> None:
        claims = {u: c for u, c in self._claims().items() if c.state is ClaimState.PREPARE_COMPLETED}
        known = {u: v for u, v in self._known.items() if u in claims}  # unprepared claims are forgotten
        order = sorted(claims)
        start = next((i for i, u in enumerate(order) if u > self._cursor), 0)
        for uid in (order[start:] + order[:start])[:self._max]:
            c = claims[uid]
            self._cursor = uid
            try:
                answer = self._lookup.get(c.namespace, c.name)
            except ClaimLookupError as e:
                log.debug("re-reading a claim's pods failed", extra={"claim": uid, "error": str(e)[:200]})
                continue
            metadata = answer.get("metadata") if answer is not None else None
            if not isinstance(metadata, Mapping) or metadata.get("uid") != uid:
                known.pop(uid, None)  # gone or replaced: the checkpoint's pods stand until unprepare
                continue
            known[uid] = consumer_pods(answer, MAX_CONSUMERS) if answer is not None else ((), 0)
        self._known = known

    def run(self, stop: threading.Event, interval: float = REFRESH_INTERVAL) -> None:
        while not stop.wait(interval):
            try:
                self.refresh_once()
            except Exception:
                log.exception("re-reading the pods of prepared claims failed")

    def start(self, stop: threading.Event, interval: float = REFRESH_INTERVAL) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop, interval), name="claim-consumers", daemon=True)
        thread.start()
        return thread
