"""Client-side rate limiting of API requests: a token bucket as client-go's (`rest.Config` QPS and Burst, defaults
5 and 10; `flowcontrol.NewTokenBucketRateLimiter` on golang.org/x/time/rate). A request takes a token, or
reserves the next one and waits for it; one whose wait would pass its deadline fails at once instead, as
`rate.Limiter.Wait` does when the context's deadline comes first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_QPS = 5.0
DEFAULT_BURST = 10
# The daemon's defaults: kubelet's own (KubeletConfiguration kubeAPIQPS 50, kubeAPIBurst 100 since 1.27), so that a
# node starting 64 claim pods at once gets its 64 claim GETs in one burst; the API server's priority and fairness
# bounds what many nodes do at once (docs/hardening.md §4).
DAEMON_QPS = 50.0
DAEMON_BURST = 100


class RateLimited(Exception):
    """Waiting for the client-side rate limit would take the request past its deadline."""


@dataclass(frozen=True)
class Rate:
    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST

    def __post_init__(self) -> None:
        if not 0 < self.qps <= 100_000:
            raise ValueError(f"API client QPS {self.qps!r} is not allowed: a number above 0, at most 100000")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or not 1 <= self.burst <= 100_000:
            raise ValueError(f"API client burst {self.burst!r} is not allowed: a whole number from 1 to 100000")


class TokenBucket:
    """`burst` tokens, refilled at `qps` per second; thread-safe."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(rate.burst)
        self._at = clock()

    def acquire(self, deadline: float) -> float:
        """Take a token, waiting for it if needed; the seconds waited. RateLimited if the wait would end after
        `deadline` (a time.monotonic value); nothing is taken then."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.rate.burst), self._tokens + (now - self._at) * self.rate.qps)
            self._at = now
            wait = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate.qps
            if now + wait > deadline:
                raise RateLimited(f"the client-side rate limit ({self.rate.qps:g} requests per second, burst "
                                  f"{self.rate.burst}) would delay the request {wait:.2f} s, past its deadline")
            self._tokens -= 1  # may go below 0: later callers wait behind this reservation
        if wait:
            self._sleep(wait)
        return wait
