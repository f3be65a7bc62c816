"""Issue 14 item 8: the metrics server has a fixed number of threads, however many connections arrive."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from neuron_dra.driver.daemon import metrics as metrics_module
from neuron_dra.driver.daemon.metrics import CONNECTION_TIMEOUT, MAX_CONNECTIONS, Metrics
from tests.support.driver import wait_until

pytestmark = pytest.mark.attacks


def scrape(port: int) -> str:
    body: bytes = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return body.decode()


def test_idle_connections_do_not_add_threads_and_metrics_recover() -> None:
    metrics = Metrics()
    metrics.prepared_claims.set(3)
    server = metrics.serve("127.0.0.1", 0)
    try:
        assert "neuron_dra_prepared_claims 3.0" in scrape(server.port)
        threads_before = threading.active_count()
        idle = []
        for _ in range(300):  # connect and send nothing (prometheus_client's server: a thread each)
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            idle.append(s)
        # All accepted: MAX_CONNECTIONS held, the rest closed at once.
        wait_until(lambda: server.server.refused >= 300 - MAX_CONNECTIONS, 10, "the excess connections refused")
        grown = threading.active_count() - threads_before
        print(f"300 idle connections: +{grown} threads, {server.server.refused} refused at once")
        assert grown <= MAX_CONNECTIONS, grown
        for s in idle:
            s.close()
        # The slots free up (at the latest after the per-connection timeout) and scraping works again.
        wait_until(lambda: _scrapes(server.port), CONNECTION_TIMEOUT + 5, "a scrape after the idle connections")
    finally:
        server.stop()


def test_a_slow_client_is_dropped_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handlers' socket timeout is CONNECTION_TIMEOUT; the test shortens it to 1 s (waiting 5 s proves no more).
    assert metrics_module._QuietHandler.timeout == CONNECTION_TIMEOUT
    timeout = 1.0
    monkeypatch.setattr(metrics_module._QuietHandler, "timeout", timeout)
    server = Metrics().serve("127.0.0.1", 0)
    try:
        slow = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(MAX_CONNECTIONS)]
        start = time.monotonic()
        # The server gives up on them after the timeout: each sees EOF.
        for s in slow:
            assert s.recv(10) == b""
        assert time.monotonic() - start < timeout + 3
        assert _scrapes(server.port)
        for s in slow:
            s.close()
    finally:
        server.stop()


def _scrapes(port: int) -> bool:
    try:
        return "neuron_dra_prepared_claims" in scrape(port)
    except OSError:
        return False
