"""Issue 19: HTTP/2 attacks on the running daemon's health port (TCP, reachable from pods) and DRA socket, from a
separate process (tests/support/h2attack.py: hyperframe and hpack, not grpc). Meanwhile kubelet's liveness
probe (a fresh connection per probe, 5 s timeout) keeps answering SERVING, and prepare/unprepare cycles keep
succeeding. Each test prints the attacker's counts and the probe times. Bounded: seconds of attack, on loopback.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from neuron_dra.driver.deploy import Resources
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from tests.support import pluginclient
from tests.support.driver import DaemonDirs, DaemonProcess, claim, devices, free_port, uid, wait_until
from tests.support.pluginclient import ClaimRef

pytestmark = [pytest.mark.slow, pytest.mark.attacks, pytest.mark.process]
REPO = Path(__file__).resolve().parents[3]
PROBE_TIMEOUT = 5.0  # the DaemonSet's livenessProbe timeoutSeconds
T = TypeVar("T")
PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


@dataclass
class Running:
    daemon: DaemonProcess
    dirs: DaemonDirs
    port: int

    @property
    def health(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def running(dirs: DaemonDirs, host_root: Path) -> Iterator[Running]:
    port = free_port()
    d = DaemonProcess(dirs, host_root, extra_args=["--healthcheck-port", str(port), "--bind-address",
                                                   "127.0.0.1"]).wait_ready(timeout=60)
    try:
        wait_until(lambda: probe(f"127.0.0.1:{port}")[0], 10, "the health port to answer")
        yield Running(d, dirs, port)
        assert d.proc.poll() is None, d.log()
    finally:
        d.terminate()


def probe(target: str) -> tuple[bool, float]:
    """kubelet's gRPC liveness probe: a new connection, Check("liveness"), SERVING within the timeout."""
    start = time.monotonic()
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
    try:
        with grpc.insecure_channel(target, options=options) as channel:
            status = grpc_health_v1_pb2_grpc.HealthStub(channel).Check(
                grpc_health_v1_pb2.HealthCheckRequest(service="liveness"), timeout=PROBE_TIMEOUT).status
        ok = status == grpc_health_v1_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        ok = False
    return ok, time.monotonic() - start


def attack(kind: str, target: str, seconds: float, path: str | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.support.h2attack", kind, target, str(seconds)] + ([path] if path else [])
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True, env=dict(os.environ))


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=60)
    counts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return counts


def while_attacked(proc: subprocess.Popen[str], check: Callable[[], T], warmup: float = 1.5,
                   gap: float = 0.5) -> list[T]:
    """`check` again and again while the attack runs (after it has had `warmup` seconds to set in)."""
    time.sleep(warmup)
    results: list[T] = []
    while proc.poll() is None and len(results) < 100:
        results.append(check())
        time.sleep(gap)
    return results


def assert_probes_answer(results: list[tuple[bool, float]], counts: dict[str, Any]) -> None:
    times = [t for _, t in results]
    print(f"\n{counts}; {len(results)} probes, {sum(ok for ok, _ in results)} SERVING, "
          f"max {max(times):.3f} s, median {statistics.median(times):.3f} s")
    assert len(results) >= 4, results
    assert all(ok for ok, _ in results), results
    assert max(times) < PROBE_TIMEOUT, times


def test_four_calls_without_bodies_do_not_block_the_probe(running: Running) -> None:
    proc = attack("no-bodies", running.health, 8)
    results = while_attacked(proc, lambda: probe(running.health))
    assert_probes_answer(results, finish(proc))


def test_window_zero_then_four_calls_do_not_block_the_probe(running: Running) -> None:
    proc = attack("window-zero", running.health, 8)
    results = while_attacked(proc, lambda: probe(running.health))
    assert_probes_answer(results, finish(proc))


def test_64_dripping_connections_do_not_block_the_probe(running: Running) -> None:
    proc = attack("drip", running.health, 14)
    results = while_attacked(proc, lambda: probe(running.health), warmup=2.0, gap=1.0)
    counts = finish(proc)
    assert_probes_answer(results, counts)
    assert counts["connections"] >= 64


def test_rapid_reset_on_the_health_port_leaves_the_probe_answering(running: Running) -> None:
    proc = attack("rapid-reset", running.health, 10)
    results = while_attacked(proc, lambda: probe(running.health))
    counts = finish(proc)
    assert_probes_answer(results, counts)
    assert counts["streams"] >= 1000  # the attack really ran


def cycles(dirs: DaemonDirs, n_claims: int = 4) -> Callable[[], tuple[bool, float]]:
    """One prepare+unprepare of a 1-device claim per call, on one connection (as kubelet keeps one)."""
    refs = [ClaimRef("default", f"c{i}", uid(i)) for i in range(n_claims)]
    for i, ref in enumerate(refs):
        dirs.put_claim(claim(ref.name, ref.uid, devices(i)))
    turn = iter(range(10**6))
    client = pluginclient.DraClient(dirs.dra_socket)

    def one() -> tuple[bool, float]:
        ref = refs[next(turn) % len(refs)]
        start = time.monotonic()
        try:
            ok = not client.prepare([ref], timeout=10)[ref.uid].error
            ok = ok and not client.unprepare([ref], timeout=10)[ref.uid]
        except pluginclient.PluginCallError:
            ok = False
        return ok, time.monotonic() - start

    return one


def test_rapid_reset_on_the_dra_socket_leaves_prepares_and_probes_working(running: Running) -> None:
    one = cycles(running.dirs)
    proc = attack("rapid-reset", str(running.dirs.dra_socket), 10, PREPARE)
    results = while_attacked(proc, lambda: (one(), probe(running.health)), gap=0.2)
    counts = finish(proc)
    prepares = [r[0] for r in results]
    probes = [r[1] for r in results]
    times = [t for _, t in prepares]
    print(f"\n{counts}; {len(prepares)} prepare+unprepare cycles, {sum(ok for ok, _ in prepares)} ok, "
          f"median {statistics.median(times) * 1000:.1f} ms, max {max(times):.3f} s")
    assert counts["streams"] >= 1000
    assert len(prepares) >= 4 and all(ok for ok, _ in prepares), prepares
    assert_probes_answer(probes, counts)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def wait_for_rss(pid: int, below: float, timeout: float, health: str) -> float:
    """The daemon's RSS once it is below `below`, or after `timeout` seconds. Between samples, kubelet's liveness
    probe (every 10 s in the DaemonSet), after which the daemon trims its heap: grpc core frees a connection's
    buffers when the peer is gone, and what they leave in the middle of the heap goes back only on a trim."""
    deadline = time.monotonic() + timeout
    while True:
        probe(health)
        rss = rss_mib(pid)
        if rss < below or time.monotonic() >= deadline:
            return rss
        time.sleep(0.25)


# The daemon's CPU per MiB of hostile frames (after the test's own calls are taken out). Parsing is linear in the
# bytes received, so this is a property of the code, not of how fast the attacker writes: a server that re-parsed
# the growing header block, or kept it, would spend far more; what was measured is printed by the test.
FLOOD_CPU_PER_MIB = 0.2


def memory_limit_mib() -> int:
    limit = Resources().memory_limit
    if limit is None or not limit.endswith("Mi"):
        raise AssertionError(f"the DaemonSet's default memory limit {limit!r} is not in Mi: update this test")
    return int(limit.removesuffix("Mi"))


# What an attack may do to the daemon's RSS. grpc core's buffers for a header block in flight come and go with
# it: spikes that are gone at the next sample, larger the more the daemon is starved of CPU (the attacker gets
# ahead). They must not accumulate (what remains once the flood stops and the next liveness probe has trimmed the
# heap: without the trim, up to the peak stayed for seconds), and the peak must stay under 80 % of the
# DaemonSet's memory limit (neuron_dra/driver/deploy/__init__.py; issue 32), far from the kernel's kill.
MEMORY_LIMIT_MIB = memory_limit_mib()
RSS_LIMIT_MIB = MEMORY_LIMIT_MIB * 8 // 10
FLOOD_RSS_LEFT_MIB = 16


@pytest.mark.parametrize("kind", ["continuation", "continuation-empty"])
@pytest.mark.parametrize("where", ["dra", "health"])
def test_a_continuation_flood_is_cut_off_and_keeps_cpu_bounded(running: Running, where: str, kind: str) -> None:
    """Endless CONTINUATION frames (one header block that never ends). Empty frames: grpc core ends the
    connection within a few MB. 4 KB header literals: grpc core decodes and drops what exceeds the header list
    limit and does not end the connection: on the DRA socket (root only) it runs; on the health port the front
    ends each connection after 16 KiB (the connection age cut let one reach 206 MiB RSS: issue 32, finding 10).
    The daemon's CPU per byte of flood and its memory stay bounded (RSS under 80 % of the DaemonSet's limit),
    every prepare and probe succeeds meanwhile. (Total CPU under a flood follows the attacker's speed on the
    machine, so it is not what is asserted.)"""
    one = cycles(running.dirs)
    pid = running.daemon.proc.pid
    for _ in range(5):
        one()  # warm
    cpu_b = cpu_seconds(pid)
    before = [one()[1] for _ in range(20)]
    per_cycle = (cpu_seconds(pid) - cpu_b) / len(before)
    rss0 = rss_mib(pid)
    target, path = ((str(running.dirs.dra_socket), PREPARE) if where == "dra"
                    else (running.health, "/grpc.health.v1.Health/Check"))
    seconds = 10 if where == "health" else 8
    cpu0 = cpu_seconds(pid)
    proc = attack(kind, target, seconds, path)
    results = while_attacked(proc, lambda: (one(), probe(running.health), rss_mib(pid)), warmup=1.0, gap=0.3)
    counts = finish(proc)
    flood_cpu = max(0.0, cpu_seconds(pid) - cpu0 - per_cycle * len(results))
    mib = counts["bytes"] / 2**20
    during = [r[0][1] for r in results]
    peak = max(r[2] for r in results)
    print(f"\n{counts}; daemon CPU {flood_cpu:.2f} s for {mib:.0f} MiB of flood ({flood_cpu / mib * 1000:.1f} ms per "
          f"MiB); RSS {rss0:.0f} -> peak {peak:.0f} MiB; prepare+unprepare p50 "
          f"{statistics.median(before) * 1000:.1f} ms before, {statistics.median(during) * 1000:.1f} ms during "
          f"({len(during)} cycles, max {max(during):.3f} s)")
    assert counts["frames"] >= 10000, counts  # the flood really ran
    if kind == "continuation-empty":
        assert counts["max_bytes_on_one"] < 16 * 1024 * 1024, counts
    if where == "health":  # the front ended each connection after 16 KiB (one frame more, as the attacker saw it)
        assert counts["connections"] >= 100 and counts["closed_by_server"] >= 100, counts
    assert all(r[0][0] for r in results), results
    assert max(during) < PROBE_TIMEOUT, during
    assert_probes_answer([r[1] for r in results], counts)
    assert flood_cpu / mib < FLOOD_CPU_PER_MIB, f"{flood_cpu:.2f} s of daemon CPU for {mib:.0f} MiB of flood"
    assert peak < RSS_LIMIT_MIB, f"RSS {rss0:.0f} -> {peak:.0f} MiB under the flood (limit {MEMORY_LIMIT_MIB} MiB)"
    left = wait_for_rss(pid, rss0 + FLOOD_RSS_LEFT_MIB, timeout=10, health=running.health)
    assert left < rss0 + FLOOD_RSS_LEFT_MIB, f"RSS {rss0:.0f} -> {left:.0f} MiB once the flood stopped"



def test_50000_claims_in_one_call_are_refused_and_memory_returns(running: Running) -> None:
    """Issue 32, finding 7: 50,000 claims in one prepare took RSS to 247 MiB, and it stayed at 236 MiB. Now a call
    over the claims-per-call limit is refused as a whole, naming the limit; a call at the limit is answered (each
    claim its own error: none exists), and RSS stays under 80 % of the DaemonSet's limit and comes back."""
    from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2
    from neuron_dra.driver.kubeletplugin._plugin import MAX_CLAIMS_PER_CALL

    pid = running.daemon.proc.pid
    one = cycles(running.dirs)
    assert one()[0]
    rss0 = rss_mib(pid)

    def request(n: int) -> bytes:
        data: bytes = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace="default", name=f"flood{i}", uid=f"{i:08d}-0000-4000-8000-000000000000")
            for i in range(n)]).SerializeToString()
        return data

    big = request(50_000)
    at_limit = request(MAX_CLAIMS_PER_CALL)
    peaks: list[float] = []
    with grpc.insecure_channel(f"unix:{running.dirs.dra_socket}") as channel:
        prepare = channel.unary_unary(PREPARE)
        unprepare = channel.unary_unary(PREPARE.replace("NodePrepareResources", "NodeUnprepareResources"))
        start = time.monotonic()
        for call in (prepare, unprepare) * 5:
            with pytest.raises(grpc.RpcError) as info:
                call(big, timeout=20)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (f"with 50000 claims: at most {MAX_CLAIMS_PER_CALL} claims per call are allowed "
                    "(MAX_CLAIMS_PER_CALL)") in (info.value.details() or "")
            peaks.append(rss_mib(pid))
        refused_in = time.monotonic() - start
        answer = dra_v1_pb2.NodePrepareResourcesResponse.FromString(prepare(at_limit, timeout=40))
        assert len(answer.claims) == MAX_CLAIMS_PER_CALL
        assert all(entry.error for entry in answer.claims.values()), list(answer.claims.items())[:3]
        peaks.append(rss_mib(pid))
    assert probe(running.health)[0]
    assert one()[0]
    left = wait_for_rss(pid, rss0 + 16, timeout=10, health=running.health)
    print(f"\nRSS {rss0:.0f} MiB -> peaks {[round(p) for p in peaks]} -> {left:.0f} MiB; 10 refused calls in "
          f"{refused_in:.2f} s")
    assert max(peaks) < RSS_LIMIT_MIB, peaks
    assert left < rss0 + 16, f"RSS {rss0:.0f} -> {left:.0f} MiB after the calls"


def test_idle_connections_on_the_kubelet_sockets_do_not_turn_liveness_off(running: Running) -> None:
    """Issue 32, finding 3: 128 idle connections on the DRA socket (its connection limit) made the self-check's
    fresh connection fail: liveness NOT_SERVING. 200 on each kubelet-facing socket (limits 128 and 16) now leave
    every probe SERVING: the check keeps its connections."""
    dra = attack("idle", str(running.dirs.dra_socket), 8)
    reg = attack("idle", str(running.dirs.registration_socket), 8)
    results = while_attacked(dra, lambda: probe(running.health), warmup=2.0)
    counts = finish(dra)
    reg_counts = finish(reg)
    # Both limits were reached (128 and 16): connections beyond them refused.
    assert counts["connections"] > 128 and counts["closed_by_server"] > 0, counts
    assert reg_counts["connections"] > 16 and reg_counts["closed_by_server"] > 0, reg_counts
    assert_probes_answer(results, {"dra": counts, "registration": reg_counts})


@pytest.mark.parametrize("kind", ["hold-2000", "idle-2000", "drip-200"])
def test_a_connection_flood_on_the_health_port_leaves_every_probe_serving(running: Running, kind: str) -> None:
    """Issue 32, finding 2: 2,000 connections to the health port held all of grpc's 128 slots and every probe
    was refused while they lasted (200 dripping connections: 55 % answered). The front accepts every connection
    and closes the oldest for a new one, so kubelet's probe (a fresh connection that sends its call at once)
    always gets through; RSS stays under 80 % of the DaemonSet's limit."""
    pid = running.daemon.proc.pid
    rss0 = rss_mib(pid)
    proc = attack(kind, running.health, 10)
    results = while_attacked(proc, lambda: (probe(running.health), rss_mib(pid)), warmup=2.0, gap=0.4)
    counts = finish(proc)
    peak = max(r[1] for r in results)
    print(f"\nRSS {rss0:.0f} -> peak {peak:.0f} MiB")
    assert_probes_answer([r[0] for r in results], counts)
    assert counts["connections"] >= 200, counts
    assert peak < RSS_LIMIT_MIB, f"RSS {rss0:.0f} -> {peak:.0f} MiB (80 % of the limit: {RSS_LIMIT_MIB} MiB)"
