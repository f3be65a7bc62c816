"""The kubelet-facing gRPC servers over real unix sockets, driven by tests/support/pluginclient.py (the gRPC
half of the kubelet stand-in: kubelet's timeouts and version choice). Claims come from an in-memory lookup
here; test_driver_apiserver.py runs the same path against the real API server."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from neuron_dra.driver.daemon.claims.cdi import CDI_KIND, CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.daemon.liveness import HealthServer
from neuron_dra.driver.kubeletplugin import _plugin as plugin
from neuron_dra.driver.kubeletplugin import _sockets as sockets
from neuron_dra.driver.kubeletplugin._calls import Calls
from neuron_dra.driver.kubeletplugin._claimref import ClaimRef
from neuron_dra.driver.kubeletplugin._generated import grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from neuron_dra.driver.kubeletplugin._plugin import PluginServers
from neuron_dra.driver.kubeletplugin._sockets import SocketError, SocketPaths
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from tests.support import pluginclient
from tests.support.driver import DRIVER, NODE, FakeLookup, claim, devices, short_dir, uid
from tests.support.pluginclient import ClaimRef as ClientClaimRef


@dataclass
class Served:
    servers: PluginServers
    state: DriverState
    lookup: FakeLookup
    paths: SocketPaths
    cdi: Path


def make_state(base: Path, instance_type: str = "trn2.48xlarge") -> tuple[DriverState, FakeLookup]:
    root = emulate(instance_type, base / "host")
    lookup = FakeLookup()
    (base / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
    state = DriverState(host=discover(root), host_root=root, driver_name=DRIVER, pool_name=NODE,
                        cdi=CdiStore(base / "cdi", DRIVER), checkpoint=Checkpoint(base / "plugins" / DRIVER / "cp"),
                        lookup=lookup)
    state.reconcile_local()
    return state, lookup


def serve(base: Path, instance_type: str = "trn2.48xlarge") -> Served:
    state, lookup = make_state(base, instance_type)
    paths = SocketPaths.for_driver(base / "plugins", base / "registry", DRIVER)
    servers = PluginServers(paths, DRIVER)
    servers.serve(Calls(state, lookup, state.lock))
    return Served(servers, state, lookup, paths, base / "cdi")


@pytest.fixture
def served() -> Iterator[Served]:
    with short_dir() as base:
        s = serve(base)
        try:
            yield s
        finally:
            s.servers.stop()
            s.state.close()


def test_registration_as_kubelet_does_it(served: Served) -> None:
    channel = pluginclient.dial(served.paths.registration)
    try:
        info = pluginclient.get_info(channel)  # kubelet's 1 s timeout; the latency is bench/bench_prepare.py's
    finally:
        channel.close()
    assert info == pluginclient.PluginInfo("DRAPlugin", DRIVER, str(served.paths.dra),
                                           ("v1.DRAPlugin", "v1beta1.DRAPlugin"))
    reg = pluginclient.register(served.paths.registration)
    assert (reg.driver_name, reg.endpoint, reg.version) == (DRIVER, str(served.paths.dra), "v1.DRAPlugin")
    assert served.servers.registration.registered.is_set()


def test_an_older_kubelet_chooses_v1beta1(served: Served) -> None:
    reg = pluginclient.register(served.paths.registration, kubelet_services=("v1beta1.DRAPlugin",))
    assert reg.version == "v1beta1.DRAPlugin"


def test_a_kubelet_without_a_common_version_reports_the_failure(served: Served) -> None:
    with pytest.raises(pluginclient.RegistrationError, match="this kubelet speaks"):
        pluginclient.register(served.paths.registration, kubelet_services=("v2.DRAPlugin",))
    assert not served.servers.registration.registered.is_set()
    assert "v2.DRAPlugin" in served.servers.registration.last_error


def test_prepare_and_unprepare_at_the_registered_endpoint(served: Served) -> None:
    served.lookup.put(claim("c", uid(1), devices(0)))
    reg = pluginclient.register(served.paths.registration)
    client = pluginclient.DraClient(reg.endpoint, reg.version)
    try:
        refs = [ClientClaimRef("default", "c", uid(1))]
        assert client.prepare(refs, 45.0)[uid(1)].devices[0].device_name == "neuron-device-0"
        assert client.unprepare(refs, 45.0) == {uid(1): ""}
    finally:
        client.close()


@pytest.mark.parametrize("service", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
@pytest.mark.parametrize("indexes", [(5,), (8, 9, 10, 11), tuple(range(16))])
def test_prepare_and_unprepare_over_the_socket(served: Served, service: str, indexes: tuple[int, ...]) -> None:
    served.lookup.put(claim("c", uid(2), devices(*indexes)))
    client = pluginclient.DraClient(served.paths.dra, service)
    try:
        refs = [ClaimRef("default", "c", uid(2)), ClaimRef("default", "missing", uid(3))]
        results = client.prepare(refs)
        assert set(results) == {uid(2), uid(3)}  # every claim gets an entry
        assert results[uid(3)].error and not results[uid(3)].devices
        prepared = results[uid(2)]
        assert prepared.error == ""
        assert [(d.request_names, d.pool_name, d.device_name) for d in prepared.devices] == [
            (("neurons",), NODE, f"neuron-device-{i}") for i in indexes]
        for d in prepared.devices:
            for cdi_id in d.cdi_device_ids:
                assert cdi_id.startswith(f"{CDI_KIND}={uid(2)}-")
        assert (served.cdi / f"{DRIVER}_{uid(2)}.json").exists()
        assert client.prepare(refs[:1]) == {uid(2): prepared}  # idempotent
        assert client.unprepare(refs) == {uid(2): "", uid(3): ""}
        assert not (served.cdi / f"{DRIVER}_{uid(2)}.json").exists()
    finally:
        client.close()


def test_empty_and_duplicate_requests(served: Served) -> None:
    served.lookup.put(claim("c", uid(4), devices(1)))
    client = pluginclient.DraClient(served.paths.dra)
    try:
        assert client.prepare([]) == {}
        ref = ClaimRef("default", "c", uid(4))
        assert list(client.prepare([ref, ref])) == [uid(4)]
    finally:
        client.close()


def test_sockets_are_private_and_recreated_over_stale_files() -> None:
    with short_dir() as base:
        paths = SocketPaths.for_driver(base / "plugins", base / "registry", DRIVER)
        for p in (paths.dra, paths.registration):  # left behind by a crashed instance
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("stale")
        s = serve(base)
        try:
            for p in (paths.dra, paths.registration):
                mode = p.stat().st_mode
                assert stat.S_ISSOCK(mode)
                assert stat.S_IMODE(mode) == 0o600
            assert pluginclient.register(paths.registration).driver_name == DRIVER
        finally:
            s.servers.stop()
            s.state.close()
        assert not paths.dra.exists() and not paths.registration.exists()


def test_dra_socket_listens_before_the_registration_socket_appears(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each socket file is mode 0600 the moment grpc has bound it (before any chmod), even with umask 0."""
    order: list[tuple[str, bool, int]] = []
    real_listen = plugin._listen

    def recording_listen(server: Any, path: Path) -> None:
        real_add = server._server.add_insecure_port

        def add(address: str) -> int:
            port = int(real_add(address))
            bound = Path(address.removeprefix("unix:"))  # a hidden name, renamed to `path` once bound
            order.append((path.name, bound.exists(), stat.S_IMODE(bound.stat().st_mode)))
            return port

        monkeypatch.setattr(server._server, "add_insecure_port", add)
        real_listen(server, path)

    monkeypatch.setattr(plugin, "_listen", recording_listen)
    old = os.umask(0)
    try:
        with short_dir() as base:
            s = serve(base)
            s.servers.stop()
            s.state.close()
    finally:
        os.umask(old)
    assert order == [("dra.sock", True, 0o600), (f"{DRIVER}-reg.sock", True, 0o600)]


def test_socket_paths_too_long_for_unix_sockets_are_refused() -> None:
    with pytest.raises(SocketError, match="at most 107"):
        sockets.check_socket_path(Path("/" + "x" * 120) / "dra.sock")
    with pytest.raises(SocketError, match="absolute"):
        sockets.check_socket_path(Path("relative/dra.sock"))


def test_health_liveness_calls_the_daemons_own_sockets(served: Served) -> None:
    health = HealthServer(served.paths, "127.0.0.1", 0)
    health.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{health.port}")
    stub = grpc_health_v1_pb2_grpc.HealthStub(channel)
    serving = grpc_health_v1_pb2.HealthCheckResponse.SERVING
    try:
        def check(service: str) -> int:
            return int(stub.Check(grpc_health_v1_pb2.HealthCheckRequest(service=service), timeout=5).status)

        assert check("liveness") == serving
        assert check("") == serving
        with pytest.raises(grpc.RpcError) as info:
            check("startup")
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Watch(grpc_health_v1_pb2.HealthCheckRequest(service="liveness"), timeout=5))
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED and "use Check" in (info.value.details() or "")
        served.servers.stop()  # the kubelet-facing sockets are gone: kubelet must restart the container
        assert check("liveness") == grpc_health_v1_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        channel.close()
        health.stop()


def test_dra_calls_before_the_state_is_loaded_wait_and_are_answered_after() -> None:
    """`listen` answers registration at once; a prepare sent before `serve` waits (grpc has bound the DRA socket)
    and is answered once the DRA service runs."""
    with short_dir() as base:
        paths = SocketPaths.for_driver(base / "plugins", base / "registry", DRIVER)
        servers = PluginServers(paths, DRIVER)
        servers.listen()
        try:
            assert pluginclient.register(paths.registration).driver_name == DRIVER
            channel = grpc.insecure_channel(f"unix:{paths.dra}")
            early = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources").future(
                b"", timeout=20)
            time.sleep(0.5)
            assert not early.done()
            state, lookup = make_state(base)
            servers.serve(Calls(state, lookup, state.lock))
            assert early.result(timeout=10) == b""  # an empty prepare: an empty answer
            channel.close()
            state.close()
        finally:
            servers.stop()
