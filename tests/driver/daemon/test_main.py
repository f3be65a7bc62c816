"""The daemon as its own process (`python -m tests.support.claims_dir_daemon`: the real daemon with claims read
from files instead of the API server), driven over its sockets: clean shutdown, restarts, kill -9 at each
step of prepare and unprepare, an unavailable API server, flags, metrics and health ports."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.failpoints import STEPS
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from tests.support import pluginclient
from tests.support.driver import (
    DRIVER,
    DaemonDirs,
    DaemonProcess,
    claim,
    devices,
    free_port,
    uid,
    wait_until,
)
from tests.support.pluginclient import ClaimRef, PrepareResult

pytestmark = pytest.mark.process

C1 = ClaimRef("default", "c1", uid(1))


def prepare(dirs: DaemonDirs, *refs: ClaimRef) -> dict[str, PrepareResult]:
    client = pluginclient.DraClient(dirs.dra_socket)
    try:
        return client.prepare(refs, timeout=20)
    finally:
        client.close()


def unprepare(dirs: DaemonDirs, *refs: ClaimRef) -> dict[str, str]:
    client = pluginclient.DraClient(dirs.dra_socket)
    try:
        return client.unprepare(refs, timeout=20)
    finally:
        client.close()


def checkpoint_states(dirs: DaemonDirs) -> dict[str, str]:
    # Snapshot plus journal, read without changing them (the daemon may be running).
    return {u: c.state.value for u, c in Checkpoint(dirs.checkpoint).read().items()}


def cdi_files(dirs: DaemonDirs) -> list[str]:
    return sorted(p.name for p in dirs.cdi.iterdir()) if dirs.cdi.exists() else []


def leftovers(dirs: DaemonDirs) -> list[str]:
    """Temp files of interrupted atomic writes."""
    return sorted(p.name for d in (dirs.cdi, dirs.checkpoint.parent) if d.exists() for p in d.iterdir()
                  if ".tmp-" in p.name)


def test_sigterm_deregisters_and_exits_cleanly(dirs: DaemonDirs, host_root: Path) -> None:
    d = DaemonProcess(dirs, host_root).wait_ready()
    assert pluginclient.register(dirs.registration_socket).endpoint == str(dirs.dra_socket)
    assert d.terminate() == 0
    assert not dirs.registration_socket.exists()
    assert not dirs.dra_socket.exists()
    records = d.log_records()
    assert records and all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    assert any(r["msg"] == "registered with kubelet" for r in records)
    assert records[-1]["msg"] == "stopped"


def test_prepared_claims_survive_kill_9_and_unprepare_needs_only_the_checkpoint(dirs: DaemonDirs,
                                                                                host_root: Path) -> None:
    dirs.put_claim(claim("c1", uid(1), devices(0, 1, 2, 3)))
    d = DaemonProcess(dirs, host_root).wait_ready()
    answer = prepare(dirs, C1)[uid(1)]
    assert answer.error == "" and len(answer.devices) == 4
    d.kill()
    assert dirs.dra_socket.exists()  # stale after kill -9
    (dirs.cdi / f"{DRIVER}_{uid(1)}.json").unlink()  # and a reboot wiped tmpfs
    d = DaemonProcess(dirs, host_root).wait_ready()
    assert (dirs.cdi / f"{DRIVER}_{uid(1)}.json").exists()  # rewritten at start
    assert pluginclient.register(dirs.registration_socket).driver_name == DRIVER
    dirs.delete_claim("c1")  # kubelet unprepares after the claim is gone
    assert prepare(dirs, C1)[uid(1)] == answer  # a repeated prepare still answers from the checkpoint
    assert unprepare(dirs, C1) == {uid(1): ""}
    assert checkpoint_states(dirs) == {} and cdi_files(dirs) == []
    assert d.terminate() == 0


# Each case starts the daemon two or three times (~1-2 s each, most of it importing the kubernetes client), so
# the matrix is `slow`; the fast path keeps one step of each: a crash between the CDI spec and the checkpoint.
FAST_STEPS = ("prepare-after-cdi", "unprepare-after-cdi")


def steps(prefix: str) -> list[Any]:
    return [pytest.param(s, marks=() if s in FAST_STEPS else pytest.mark.slow)
            for s in STEPS if s.startswith(prefix)]


@pytest.mark.parametrize("step", steps("prepare"))
@pytest.mark.parametrize("claim_deleted", [False, True], ids=["claim-kept", "claim-deleted"])
def test_kill_9_during_prepare(dirs: DaemonDirs, host_root: Path, step: str, claim_deleted: bool) -> None:
    dirs.put_claim(claim("c1", uid(1), devices(4, 5)))
    reference = DaemonProcess(dirs, host_root).wait_ready()
    expected = prepare(dirs, C1)[uid(1)]  # what an uninterrupted prepare answers
    assert unprepare(dirs, C1) == {uid(1): ""}
    reference.terminate()

    d = DaemonProcess(dirs, host_root, crash_at=step).wait_ready()
    with pytest.raises(pluginclient.PluginCallError) as info:
        prepare(dirs, C1)
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    assert d.wait_exit() == -signal.SIGKILL
    completed = step == "prepare-after-completed"
    if claim_deleted:
        dirs.delete_claim("c1")

    d = DaemonProcess(dirs, host_root).wait_ready()
    if completed:
        # never lose a prepared claim: kubelet's retry gets the same answer, even with the claim gone
        assert checkpoint_states(dirs) == {uid(1): "PrepareCompleted"}
        assert prepare(dirs, C1)[uid(1)] == expected
    elif claim_deleted:
        # the prepare never completed and its claim is gone: cleaned up once the API answers
        wait_until(lambda: checkpoint_states(dirs) == {}, what="the unfinished entry to be dropped")
        assert cdi_files(dirs) == []
        assert prepare(dirs, C1)[uid(1)].error.endswith("does not exist")
    else:
        assert prepare(dirs, C1)[uid(1)] == expected  # kubelet's retry completes it
        assert checkpoint_states(dirs) == {uid(1): "PrepareCompleted"}
    assert leftovers(dirs) == []
    assert unprepare(dirs, C1) == {uid(1): ""}
    assert checkpoint_states(dirs) == {} and cdi_files(dirs) == []
    assert d.terminate() == 0


@pytest.mark.parametrize("step", steps("unprepare"))
def test_kill_9_during_unprepare(dirs: DaemonDirs, host_root: Path, step: str) -> None:
    dirs.put_claim(claim("c1", uid(1), devices(7)))
    d = DaemonProcess(dirs, host_root, crash_at=step).wait_ready()
    assert prepare(dirs, C1)[uid(1)].error == ""
    with pytest.raises(pluginclient.PluginCallError):
        unprepare(dirs, C1)
    assert d.wait_exit() == -signal.SIGKILL
    dirs.delete_claim("c1")
    d = DaemonProcess(dirs, host_root).wait_ready()
    assert unprepare(dirs, C1) == {uid(1): ""}  # kubelet retries until it succeeds
    assert checkpoint_states(dirs) == {} and cdi_files(dirs) == [] and leftovers(dirs) == []
    assert d.terminate() == 0


def test_unreachable_api_server_fails_claims_not_the_daemon(dirs: DaemonDirs, host_root: Path) -> None:
    dirs.put_claim(claim("c1", uid(1), devices(3)))
    d = DaemonProcess(dirs, host_root).wait_ready()
    (dirs.claims / "unavailable").touch()
    assert "reading it from the API server failed" in prepare(dirs, C1)[uid(1)].error
    assert d.proc.poll() is None
    (dirs.claims / "unavailable").unlink()
    assert prepare(dirs, C1)[uid(1)].error == ""
    assert d.terminate() == 0


def test_bad_flags_name_the_flag(dirs: DaemonDirs, host_root: Path) -> None:
    d = DaemonProcess(dirs, host_root, extra_args=["--cdi-root", "relative/cdi"])
    assert d.wait_exit() == 2
    assert "--cdi-root" in d.log() and "must be an absolute path" in d.log()
    d = DaemonProcess(dirs, host_root, extra_args=["--metrics-port", "70000"])
    assert d.wait_exit() == 2
    assert "--metrics-port" in d.log() and "not a port number" in d.log()
    d = DaemonProcess(dirs, host_root, extra_args=["--driver-name", "../evil"])  # names files and sockets
    assert d.wait_exit() == 2
    assert "--driver-name" in d.log() and "allowed: a DRA driver name" in d.log()
    assert not dirs.plugins.exists()


def test_corrupt_checkpoint_stops_start_up_with_the_reason(dirs: DaemonDirs, host_root: Path) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text('{"version": 1, "checksum": "sha256:00", "preparedClaims": {}}')
    d = DaemonProcess(dirs, host_root)
    assert d.wait_exit() == 1
    error = next(r for r in d.log_records() if r["msg"] == "start-up failed")["error"]
    assert str(dirs.checkpoint) in error and "checksum mismatch" in error
    assert not dirs.registration_socket.exists()


def test_bad_host_root_stops_start_up_with_the_reason(dirs: DaemonDirs) -> None:
    d = DaemonProcess(dirs, dirs.base)  # no sysfs there
    assert d.wait_exit() == 1
    assert "host discovery failed" in d.log() and "product_name" in d.log()


def test_metrics_and_health_ports(dirs: DaemonDirs, host_root: Path) -> None:
    metrics_port, health_port = free_port(), free_port()
    dirs.put_claim(claim("c1", uid(1), devices(0)))
    d = DaemonProcess(dirs, host_root, extra_args=["--metrics-port", str(metrics_port), "--healthcheck-port",
                                                   str(health_port), "--bind-address", "127.0.0.1"]).wait_ready()
    # "serving" is the kubelet sockets; the ports open right after it.
    wait_until(lambda: any(r.get("msg") == "metrics listening" for r in d.log_records()), what="the metrics port")
    prepare(dirs, C1, ClaimRef("default", "nope", uid(2)))

    def scrape() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    # The prepare's duration is observed once its answer is sent (CallScope.after_answer): at once, not before.
    wait_until(lambda: scrape().get("neuron_dra_prepare_seconds_count") == 1, what="the prepare observed")
    values = scrape()
    assert values["neuron_dra_prepare_seconds_count"] == 1
    assert values['neuron_dra_errors_total{operation="prepare",reason="not_found"}'] == 1
    assert values["neuron_dra_prepared_claims"] == 1
    channel = grpc.insecure_channel(f"127.0.0.1:{health_port}")
    try:
        stub = grpc_health_v1_pb2_grpc.HealthStub(channel)
        status = stub.Check(grpc_health_v1_pb2.HealthCheckRequest(service="liveness"), timeout=5).status
        assert status == grpc_health_v1_pb2.HealthCheckResponse.SERVING

        def readiness() -> int:
            return int(stub.Check(grpc_health_v1_pb2.HealthCheckRequest(service="readiness"), timeout=5).status)

        # Ready only once kubelet has registered this instance (a surge rollout then stops the old pod).
        assert readiness() == grpc_health_v1_pb2.HealthCheckResponse.NOT_SERVING
        pluginclient.register(dirs.registration_socket)  # GetInfo and NotifyRegistrationStatus, as kubelet does
        assert readiness() == grpc_health_v1_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()
    assert d.terminate() == 0
