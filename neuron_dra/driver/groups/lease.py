"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

A candidate takes the Lease when it is free or its holder has not renewed it for `leaseDurationSeconds` as
measured here (the time since this process last saw the record change, on its own monotonic clock: clocks of
other hosts are never compared). The leader renews every `retry` seconds; a renewal that has not succeeded for
`renew_deadline` seconds gives leadership up before anyone else can take it (renew_deadline < lease_duration).
Every write carries the resourceVersion read, so two candidates never both win. On shutdown the leader releases
the Lease (holder cleared) so a successor takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from neuron_dra.driver.kubeletplugin.toolkit import ApiClientError, ApiException, KubeApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseOptions:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.lease_duration <= 3600:
            raise ValueError(f"lease timings {self.retry}/{self.renew_deadline}/{self.lease_duration} s are not "
                             "allowed: 0 < retry < renew deadline < lease duration <= 3600")
        if not self.identity or len(self.identity) > 253:
            raise ValueError(f"lease identity {self.identity!r} is not allowed: 1 to 253 characters")


def _now() -> str:
    # MicroTime: RFC 3339 with microseconds.
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires and renews one Lease; `leading` is set while this process holds it."""

    def __init__(self, api: KubeApi, options: LeaseOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self.options = options
        self._clock = clock
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{options.namespace}/leases/{options.name}"
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.leading = threading.Event()

    def _spec(self, acquire: bool, transitions: int) -> dict[str, Any]:
        now = _now()
        spec: dict[str, Any] = {"holderIdentity": self.options.identity,
                                "leaseDurationSeconds": int(self.options.lease_duration),
                                "renewTime": now, "leaseTransitions": transitions}
        if acquire:
            spec["acquireTime"] = now
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this process holds the Lease afterwards."""
        o = self.options
        try:
            lease = self._api.call("GET", self._path)
        except ApiException as e:
            if e.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": o.name, "namespace": o.namespace}, "spec": self._spec(True, 0)}
            try:
                self._api.call("POST", self._path.rsplit("/", 1)[0], body=body)
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        record = (holder, spec.get("renewTime"), transitions, meta.get("resourceVersion"))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) and 0 < duration <= 3600 else int(o.lease_duration)
        ours = holder == o.identity
        if not ours and holder and now - self._observed_at < duration:
            return False  # held by another, renewed within its duration as far as we can tell
        new_spec = {**spec, **self._spec(False, transitions)} if ours else self._spec(True, transitions + 1)
        body = {**lease, "spec": new_spec}
        try:
            self._api.call("PUT", self._path, body=body)
        except ApiException as e:
            if e.status == 409:  # someone wrote in between: read again next time
                return False
            raise
        return True

    def step(self) -> bool:
        """Try once and update `leading`: lost when the last renewal is older than the renew deadline."""
        now = self._clock()
        try:
            held = self.try_acquire_or_renew()
        except (ApiException, ApiClientError) as e:
            log.warning("lease request failed", extra={"lease": self.options.name, "error": str(e)[:300]})
            held = False
        if held:
            if not self.leading.is_set():
                log.info("became the leader", extra={"lease": self.options.name, "identity": self.options.identity})
            self._renewed_at = now
            self.leading.set()
        elif self.leading.is_set() and (self._renewed_at is None
                                        or now - self._renewed_at >= self.options.renew_deadline):
            log.warning("lost the lease: no renewal within the renew deadline",
                        extra={"lease": self.options.name, "renew_deadline": self.options.renew_deadline})
            self.leading.clear()
        return self.leading.is_set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(self.options.retry)
        self.release()

    def release(self) -> None:
        """Clear the holder if it is us, so a successor need not wait out the lease (best effort)."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = self._api.call("GET", self._path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") == self.options.identity:
                self._api.call("PUT", self._path, body={**lease, "spec": {
                    **spec, "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _now()}})
        except (ApiException, ApiClientError) as e:
            log.warning("releasing the lease failed; a successor waits for it to expire",
                        extra={"lease": self.options.name, "error": str(e)[:300]})
