"""Issue 42, findings 1 and 4 (round 4): liveness denied by call floods on the health port, and by idle connections
to the health server's own socket. The real daemon, attackers in their own processes (tests/support/h2flood.py,
and a raw unix socket client), kubelet's probe meanwhile (a fresh connection, Check("liveness"), SERVING within its
5 s timeout: the event each probe waits for). The flood comes from another loopback address than the probe's:
kubelet probes from the node's own address (the daemon is told it: --node-address, env HOST_IP), the flood from
pods. Bounded: seconds of attack each, on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.driver.kubeletplugin.test_grpc_attacks import (
    MEMORY_LIMIT_MIB,
    REPO,
    RSS_LIMIT_MIB,
    Running,
    cycles,
    probe,
    rss_mib,
)
from tests.support.driver import DaemonDirs, DaemonProcess, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.attacks, pytest.mark.process]
NODE = "127.0.0.1"  # the probe's address, as the node's is kubelet's
ATTACKER = "127.0.0.2"  # another peer than the probe's (all of 127/8 is loopback on Linux)
MIN_SERVING = 0.9


@pytest.fixture
def running(dirs: DaemonDirs, host_root: Path) -> Iterator[Running]:
    """The daemon with its health port on 127.0.0.1, told the node's address (the probe's)."""
    port = free_port()
    d = DaemonProcess(dirs, host_root, extra_args=["--healthcheck-port", str(port), "--bind-address", NODE,
                                                   "--node-address", NODE]).wait_ready(timeout=60)
    try:
        wait_until(lambda: probe(f"{NODE}:{port}")[0], 10, "the health port to answer")
        assert any(r.get("lanes") == ["other", "node"] for r in d.log_records()), d.log()
        yield Running(d, dirs, port)
        assert d.proc.poll() is None, d.log()
    finally:
        d.terminate()


def flood(kind: str, running: Running, seconds: float, connections: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.support.h2flood", kind, running.health, str(seconds),
                             str(connections), ATTACKER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def counts_of(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=60)
    counts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return counts


def probes_during(proc: subprocess.Popen[str], running: Running, warmup_probes: int = 1,
                  also: Callable[[], object] | None = None) -> list[tuple[bool, float]]:
    """Probes one after another (each waits for its answer or its 5 s deadline) while the attacker runs, `also`
    called before each; the first `warmup_probes` let the flood set in and are not counted."""
    results: list[tuple[bool, float]] = []
    while proc.poll() is None and len(results) < 200:
        if also is not None:
            also()
        results.append(probe(running.health))
        time.sleep(0.2)
    return results[warmup_probes:]


def report(results: list[tuple[bool, float]], counts: dict[str, Any], extra: str = "") -> float:
    ok = sum(r for r, _ in results)
    share = ok / len(results) if results else 0.0
    print(f"\n{counts}; {len(results)} probes, {ok} SERVING ({share:.0%}), max {max(t for _, t in results):.2f} s"
          f"{extra}")
    return share


def test_2000_connections_sending_calls_never_read_leave_the_probe_answering(running: Running) -> None:
    """2,000 connections each sending Check("") back to back and never reading the answers: the probe got 0 of 37
    (the front closed the least recently active forwarded connection, the probe awaiting its answer); with per-peer
    quotas alone 1 of 3 on a 2-core machine (the probe's SYN dropped from the flood's full listen queue, its bytes
    waiting behind the flood's in one event loop). The node's lane has its own queue and loop. Kubelet's DRA calls
    meanwhile (a prepare and unprepare before each probe) all succeed: no front runs in the DRA server's loop."""
    one = cycles(running.dirs)
    prepares: list[tuple[bool, float]] = []
    proc = flood("calls-unread", running, 10, 2000)
    results = probes_during(proc, running, also=lambda: prepares.append(one()))
    counts = counts_of(proc)
    share = report(results, counts, f"; {sum(ok for ok, _ in prepares)} of {len(prepares)} prepare+unprepare "
                                    f"cycles ok, max {max(t for _, t in prepares):.2f} s")
    assert counts["connections"] >= 2000 and counts["calls"] >= 16000, counts  # the flood really ran
    assert len(results) >= 5 and share >= MIN_SERVING, results
    assert all(ok for ok, _ in prepares), prepares


def test_1000_connections_of_8_liveness_checks_leave_the_probe_answering(running: Running) -> None:
    """1,000 connections x 8 Check("liveness") calls, read: 50 % of probes (every check made its own self-check on
    one shared channel; the registration socket's 8-stream limit refused some, and the refusal closed the channel
    under every other check). Checks now share one self-check."""
    proc = flood("liveness-read", running, 10, 1000)
    results = probes_during(proc, running)
    counts = counts_of(proc)
    share = report(results, counts)
    assert counts["answered"] >= 100, counts  # the flood ran (and was answered at its peer's quota)
    assert len(results) >= 5 and share >= MIN_SERVING, results


def test_three_floods_keep_probes_answering_and_memory_under_80_percent_of_the_limit(running: Running) -> None:
    """Three floods one after another: probes answer through each, and RSS stays below 80 % of the DaemonSet's
    memory limit at every sample and after the last (round 4 saw ~190 MiB of 256 after three)."""
    pid = running.daemon.proc.pid
    rss0 = rss_mib(pid)
    peaks: list[float] = []
    all_results: list[tuple[bool, float]] = []
    for kind, connections in (("calls-unread", 2000), ("liveness-read", 1000), ("calls-unread", 2000)):
        proc = flood(kind, running, 4, connections)
        results: list[tuple[bool, float]] = []
        while proc.poll() is None and len(results) < 100:
            results.append(probe(running.health))
            peaks.append(rss_mib(pid))
        counts_of(proc)
        all_results += results[1:]
    after = rss_mib(pid)
    share = report(all_results, {}, f"; RSS {rss0:.0f} -> peak {max(peaks):.0f} -> {after:.0f} MiB "
                                    f"(limit {MEMORY_LIMIT_MIB} MiB)")
    assert len(all_results) >= 6 and share >= MIN_SERVING, all_results
    assert max(peaks) < RSS_LIMIT_MIB and after < RSS_LIMIT_MIB, (peaks, after)


# The other process: opens `n` connections to the health server's socket (preface, SETTINGS, then idle), reopens
# those the server ends, for `seconds`; prints its counts. Plain sockets only: it runs as another user.
IDLE_CLIENT = r"""
import json, select, socket, sys, time
target, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
address = "\0" + target[1:] if target.startswith("@") else target
hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
counts, errors, socks = {"connected": 0, "failed": 0, "closed_by_server": 0}, {}, {}
poller = select.poll()
end = time.monotonic() + seconds
while time.monotonic() < end:
    while len(socks) < n and time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(address)
            s.sendall(hello)
        except OSError as e:
            s.close()
            counts["failed"] += 1
            errors[e.strerror] = errors.get(e.strerror, 0) + 1
            break
        socks[s.fileno()] = s
        poller.register(s, select.POLLIN)
        counts["connected"] += 1
    for fd, _ in poller.poll(100):
        s = socks[fd]
        try:
            gone = s.recv(65536, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            poller.unregister(fd)
            s.close()
            del socks[fd]
            counts["closed_by_server"] += 1
    if counts["failed"] and not socks:
        time.sleep(0.1)
counts["held_at_end"] = len(socks)
print(json.dumps({**counts, "errors": errors}), flush=True)
"""


def health_socket_of(pid: int) -> str:
    """The health server's listening unix socket in the daemon's process, as /proc/net/unix names it to every
    process of the network namespace (an abstract name starts with @)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "neuron-dra-health" in fields[7]:
            return fields[7]
    raise AssertionError(f"no health socket of {pid} in /proc/net/unix")


def test_idle_connections_to_the_health_servers_own_socket_do_not_fail_the_probe(running: Running) -> None:
    """The health grpc server listened on an abstract socket, open to every process of the network namespace (its
    name is in /proc/net/unix): 2,100 idle connections held grpc's 2,048 slots and every probe failed. Another
    user's process (root in another container cannot see the container's /tmp at all) now cannot connect."""
    name = health_socket_of(running.daemon.proc.pid)
    # Another user may not reach this test's interpreter (under /root): the system's, when there is one.
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    args = [python, "-c", IDLE_CLIENT, name, "2100", "10"]
    if os.geteuid() == 0:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, user=65534, group=65534, extra_groups=[],
                                cwd="/")
    else:  # another container's view: its own user and mount namespaces, its own temporary directory
        tmp = tempfile.gettempdir()
        proc = subprocess.Popen(["unshare", "-Urm", "sh", "-c", f'mount -t tmpfs none {tmp} && exec "$0" "$@"',
                                 *args], stdout=subprocess.PIPE, text=True, cwd="/")
    results: list[tuple[bool, float]] = []
    while proc.poll() is None and len(results) < 100:
        results.append(probe(running.health))
        time.sleep(0.2)
    counts = counts_of(proc)
    report(results, {"socket": name, **counts})
    assert counts["connected"] + counts["failed"] >= 1, counts  # it tried
    assert len(results) >= 5 and all(ok for ok, _ in results), results
