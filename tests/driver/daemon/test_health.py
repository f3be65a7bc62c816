"""Device health: the hardware error counters of an (emulated) host, faults injected and cleared, the
DRAResourceHealth stream of the real daemon in every version a kubelet dials, and the unhealthy taints."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from neuron_dra.cli import main as cli_main
from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.kubeletplugin._generated import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
)
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import FaultError, clear_faults, emulate, inject_fault
from neuron_dra.driver.model.health_source import (
    ERROR_COUNTERS,
    Health,
    hardware_dir,
    read_device_health,
)
from neuron_dra.driver.model.k8s_names import HEALTH_SERVICES
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices, with_taints
from neuron_dra.driver.model.taints import published_health, unhealthy_taint_key, unhealthy_taints
from tests.support import pluginclient
from tests.support.driver import DRIVER, NODE, DaemonDirs, DaemonProcess, short_dir

VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
    "v1beta1": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return emulate("trn2.48xlarge", tmp_path / "host")


# --- the health source --------------------------------------------------------------------------------------------

def test_emulated_host_has_the_kernel_drivers_counter_files_all_zero(host: Path) -> None:
    for i in (0, 15):
        base = hardware_dir(host, i)
        assert sorted(p.name for p in base.iterdir()) == sorted(ERROR_COUNTERS)
        assert all((base / c).read_text() == "0\n" for c in ERROR_COUNTERS)
        assert read_device_health(host, i).health is Health.HEALTHY


def test_fault_makes_one_device_unhealthy_with_the_counter_in_the_message_and_clear_recovers(host: Path) -> None:
    assert inject_fault(host, 3) == 1
    assert inject_fault(host, 3, "sram_ecc_uncorrected", 2) == 2
    h = read_device_health(host, 3)
    assert h.health is Health.UNHEALTHY
    assert h.counters == {"mem_ecc_uncorrected": 1, "sram_ecc_uncorrected": 2, "mem_ecc_repairable_uncorrected": 0}
    assert "1 uncorrectable HBM ECC errors (mem_ecc_uncorrected)" in h.message
    assert "2 uncorrectable SRAM ECC errors (sram_ecc_uncorrected)" in h.message
    assert read_device_health(host, 2).health is Health.HEALTHY
    clear_faults(host, 3)
    assert read_device_health(host, 3).health is Health.HEALTHY


def test_counter_directories_with_total_are_read_too(host: Path) -> None:
    """Older documentation shows each counter as a directory with `total` and `present`."""
    base = hardware_dir(host, 1)
    for c in ERROR_COUNTERS:
        (base / c).unlink()
        (base / c).mkdir()
        (base / c / "total").write_text("0\n")
        (base / c / "present").write_text("0\n")
    assert read_device_health(host, 1).health is Health.HEALTHY
    inject_fault(host, 1, "mem_ecc_repairable_uncorrected")
    assert (base / "mem_ecc_repairable_uncorrected" / "total").read_text() == "1\n"
    assert read_device_health(host, 1).health is Health.UNHEALTHY
    clear_faults(host, 1)
    assert read_device_health(host, 1).health is Health.HEALTHY


def test_unreadable_counters_are_unknown_not_unhealthy(host: Path) -> None:
    base = hardware_dir(host, 4)
    for c in ERROR_COUNTERS:
        (base / c).write_text(f"{0xDEADBEEF}\n")  # the firmware's "register unreadable" sentinel
    h = read_device_health(host, 4)
    assert h.health is Health.UNKNOWN and str(base) in h.message
    assert unhealthy_taints(published_health(discover(host), {4: h}), DRIVER) == {}


def test_fault_on_a_missing_device_or_counter_names_what_exists(host: Path) -> None:
    with pytest.raises(FaultError, match=r"--device 16: no such Neuron device .*neuron15"):
        inject_fault(host, 16)
    with pytest.raises(FaultError, match=r"--counter 'hbm': not a hardware error counter; allowed: mem_ecc_unc"):
        inject_fault(host, 0, "hbm")


def test_emulate_fault_command(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["emulate-fault", str(host), "--device", "5"]) == 0
    assert capsys.readouterr().out.startswith("neuron5: Unhealthy (1 uncorrectable HBM ECC errors")
    assert cli_main(["emulate-fault", str(host), "--device", "5", "--clear"]) == 0
    assert capsys.readouterr().out == "neuron5: Healthy\n"
    assert cli_main(["emulate-fault", str(host), "--device", "99"]) == 2


def test_cluster_fault_command_writes_the_nodes_host_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    node_host = emulate("inf2.48xlarge", tmp_path / "cluster" / "nodes" / "inf2-48xlarge-1" / "host")
    args = ["cluster", "fault", "--dir", str(tmp_path / "cluster"), "--node", "inf2-48xlarge-1", "--device", "11"]
    assert cli_main(args) == 0
    assert read_device_health(node_host, 11).health is Health.UNHEALTHY
    assert cli_main([*args, "--clear"]) == 0
    assert read_device_health(node_host, 11).health is Health.HEALTHY
    assert cli_main(["cluster", "fault", "--dir", str(tmp_path / "cluster"), "--node", "x", "--device", "0"]) == 2
    assert "nodes: inf2-48xlarge-1" in capsys.readouterr().err


def test_monitor_reports_each_change_once(host: Path) -> None:
    monitor = HealthMonitor(host, range(16), interval=0.05)
    seen: list[dict[int, Health]] = []
    monitor.add_listener(lambda changed: seen.append({i: h.health for i, h in changed.items()}))
    assert {h.health for h in monitor.current().values()} == {Health.HEALTHY}
    assert monitor.poll() == {}
    inject_fault(host, 7)
    v = monitor.version
    assert set(monitor.poll()) == {7}
    assert monitor.wait_for_change(v, 0) == v + 1
    inject_fault(host, 7)  # a second event changes the message: reported again
    monitor.poll()
    clear_faults(host, 7)
    monitor.poll()
    monitor.poll()
    assert seen == [{7: Health.UNHEALTHY}, {7: Health.UNHEALTHY}, {7: Health.HEALTHY}]


# --- taints ---------------------------------------------------------------------------------------------------------

def test_unhealthy_devices_get_one_taint_and_tainted_slices_hold_at_most_64_devices(host: Path) -> None:
    inject_fault(host, 2)
    monitor = HealthMonitor(host, range(16))
    health = published_health(discover(host), monitor.current())
    taints = unhealthy_taints(health, DRIVER, "NoExecute")
    assert list(taints) == ["neuron-device-2"]
    (taint,) = taints["neuron-device-2"]
    assert taint["key"] == unhealthy_taint_key(DRIVER) == "neuron.aws.com/unhealthy"
    assert taint["value"] == "mem_ecc_uncorrected" and taint["effect"] == "NoExecute"
    assert time.strptime(taint["timeAdded"], "%Y-%m-%dT%H:%M:%SZ")
    pool = with_taints(build_pool(discover(host), NodeFacts(NODE)), taints)
    (s,) = resource_slices(pool)
    by_name = {d["name"]: d for d in s["spec"]["devices"]}
    assert by_name["neuron-device-2"]["taints"] == [dict(taint)]
    assert "taints" not in by_name["neuron-device-3"]
    with pytest.raises(ValueError, match="taint effect 'PreferNoSchedule': allowed are NoSchedule, NoExecute, None"):
        unhealthy_taints(health, DRIVER, "PreferNoSchedule")


def test_the_ultraserver_pseudo_device_is_as_healthy_as_its_worst_device(tmp_path: Path) -> None:
    host = emulate("trn2u.48xlarge", tmp_path / "host")
    inject_fault(host, 9)
    health = published_health(discover(host), HealthMonitor(host, range(16)).current())
    assert health["neuron-node"].health is Health.UNHEALTHY
    assert "devices 9 of this node" in health["neuron-node"].message
    assert set(unhealthy_taints(health, DRIVER)) == {"neuron-device-9", "neuron-node"}


# --- the daemon's health stream ------------------------------------------------------------------------------------

class Stream:
    """kubelet's side: one NodeWatchResources stream, read on a thread."""

    def __init__(self, socket: Path, version: str) -> None:
        pb, pb_grpc = VERSIONS[version]
        self.pb = pb
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.call = pb_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
        self.responses: list[tuple[float, dict[str, tuple[int, str, int, int]]]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for resp in self.call:
                self.responses.append((time.monotonic(), {
                    d.device.device_name: (d.health, d.message, d.last_updated_time, d.health_check_timeout_seconds)
                    for d in resp.devices if d.device.pool_name == NODE}))
        except grpc.RpcError:
            pass

    def wait_for(self, device: str, health: int, timeout: float = 10.0, after: float = 0.0) -> float:
        """When the first response after `after` (monotonic) reported `health` for `device`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, devices in list(self.responses):
                if when > after and devices.get(device, (None,))[0] == health:
                    return when
            time.sleep(0.02)
        raise AssertionError(f"{device} never reported {health}: {self.responses[-1:]}")

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


@pytest.mark.slow
@pytest.mark.process
def test_daemon_streams_health_in_every_version_and_advertises_it(dirs: DaemonDirs) -> None:
    host = emulate("trn2.48xlarge", dirs.base / "host")
    d = DaemonProcess(dirs, host, extra_args=["--health-poll-interval", "0.1"]).wait_ready()
    try:
        info = pluginclient.get_info(pluginclient.dial(dirs.registration_socket))
        assert info.supported_versions[:2] == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
        assert set(HEALTH_SERVICES) == {"v1.DRAResourceHealth", "v1beta1.DRAResourceHealth",
                                        "v1alpha1.DRAResourceHealth"} <= set(info.supported_versions)
        streams = {v: Stream(dirs.dra_socket, v) for v in VERSIONS}
        for v, s in streams.items():
            s.wait_for("neuron-device-6", s.pb.HEALTHY)
            first = s.responses[0][1]
            assert len(first) == 16 * 5, v  # trn2 at LNC 2: each device and its 4 core devices
            assert all(h == s.pb.HEALTHY and timeout == 30 and abs(ts - time.time()) < 5
                       for h, _, ts, timeout in first.values())
        injected = time.monotonic()
        inject_fault(host, 6)
        for s in streams.values():
            latency = s.wait_for("neuron-device-6", s.pb.UNHEALTHY, after=injected) - injected
            assert latency < 2.0, f"unhealthy reported after {latency:.2f} s"
            _, devices = s.responses[-1]
            assert "uncorrectable HBM ECC" in devices["neuron-device-6"][1]
            assert devices["neuron-device-6-core-3"][0] == s.pb.UNHEALTHY
            assert devices["neuron-device-5"][0] == s.pb.HEALTHY
        cleared = time.monotonic()
        clear_faults(host, 6)
        for s in streams.values():
            s.wait_for("neuron-device-6", s.pb.HEALTHY, timeout=5, after=cleared)
            assert s.responses[-1][1]["neuron-device-6"][1] == ""
        for s in streams.values():
            s.close()
    finally:
        assert d.terminate() == 0


def test_stream_beats_between_changes_and_refuses_undecodable_requests(tmp_path: Path) -> None:
    """In-process: the full list again every heartbeat without any change (kubelet's timeout needs fresh
    timestamps), and the shared raw-bytes handler answers INVALID_ARGUMENT to garbage."""
    from neuron_dra.driver.daemon.health.stream import HealthStreamService
    from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver

    host = emulate("inf2.48xlarge", tmp_path / "host")
    monitor = HealthMonitor(host, range(12))
    stop = threading.Event()
    service = HealthStreamService(monitor, discover(host), NODE, stop, heartbeat_s=0.2)
    server = grpcserver.Server("test-health", grpcserver.Limits(max_concurrent=4))
    server.add_methods(service.methods())
    with short_dir() as d:
        sock = d / "h.sock"
        server.add_unix(sock)
        server.start()
        try:
            stream = Stream(sock, "v1alpha1")
            time.sleep(1.1)
            assert len(stream.responses) >= 4  # the first list plus a beat every 0.2 s
            assert all(len(devices) == 12 for _, devices in stream.responses)
            assert service.active_streams == 1
            channel = grpc.insecure_channel(f"unix://{sock}")
            garbage = channel.unary_stream("/v1.DRAResourceHealth/NodeWatchResources",
                                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as refused:
                list(garbage(b"\xff", timeout=5))
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            channel.close()
            stream.close()
            stop.set()
        finally:
            server.stop(1)


def test_the_cores_of_a_faulted_device_are_tainted_and_reported_with_it(host: Path) -> None:
    from neuron_dra.driver.model.partitions import CoreLayout
    from neuron_dra.driver.model.slices import PublishOptions

    neuron_host = discover(host)
    layout = CoreLayout.for_spec(neuron_host.spec)  # trn2 at LNC 2: 4 core devices per device
    inject_fault(host, 2)
    current = HealthMonitor(host, range(16)).current()
    taints = unhealthy_taints(published_health(neuron_host, current), DRIVER)
    pool = with_taints(build_pool(neuron_host, NodeFacts(NODE), PublishOptions(cores=layout)), taints)
    tainted = sorted(d.name for d in pool.devices if d.taints)
    assert tainted == ["neuron-device-2", *(f"neuron-device-2-core-{c}" for c in range(4))]
    streamed = published_health(neuron_host, current, cores_per_device=layout.logical_per_device)
    assert len(streamed) == 16 * 5
    assert {n for n, h in streamed.items() if h.health is Health.UNHEALTHY} == set(tainted)
