"""kubelet's side of plugin registration and of the DRA service as a small gRPC client, over a plugin's real
unix sockets, with kubelet's timeouts and version choice (docs/kubelet-dra-protocol.md). The driver's tests and
benchmarks drive the daemon with it; the local cluster itself runs the real kubelet (localcluster/nodes/kubelet.py).

- `register(socket)`: dial (10 s), GetInfo (1 s timeout, as kubelet), validate (type DRAPlugin, a name, an
  absolute endpoint, a DRA service this kubelet speaks: the first of kubelet's own preference list
  v1.DRAPlugin, v1beta1.DRAPlugin that the plugin offers), then NotifyRegistrationStatus (5 s): true, or
  false with the reason before raising RegistrationError.
- `DraClient(endpoint, service)`: NodePrepareResources / NodeUnprepareResources in v1 or v1beta1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from neuron_dra.driver.daemon.claims.checkpoint import (
    PreparedDevice as PreparedDevice,  # the daemon's types, re-exported
)
from neuron_dra.driver.kubeletplugin._claimref import ClaimRef as ClaimRef
from neuron_dra.driver.kubeletplugin._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

DIAL_TIMEOUT = 10.0  # kubelet's plugin watcher
GET_INFO_TIMEOUT = 1.0  # kubelet gives GetInfo one second
NOTIFY_TIMEOUT = 5.0
CALL_TIMEOUT = 45.0  # kubelet's per-call timeout for prepare and unprepare
DRA_PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
# What a 1.34 kubelet speaks, most preferred first. A 1.32/1.33 kubelet is ("v1beta1.DRAPlugin",).
KUBELET_DRA_SERVICES = (V1, V1BETA1)

_MESSAGES: dict[str, tuple[ModuleType, ModuleType]] = {
    V1: (dra_v1_pb2, dra_v1_pb2_grpc),
    V1BETA1: (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Registration:
    driver_name: str
    endpoint: str
    version: str  # the DRA service version kubelet chose, e.g. "v1.DRAPlugin"


class RegistrationError(RuntimeError):
    pass


class PluginCallError(RuntimeError):
    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code.name}: {details}")


class ClaimLike(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


def dial(socket_path: Path | str, timeout: float = DIAL_TIMEOUT) -> grpc.Channel:
    """A channel to a unix socket, connected (grpc.FutureTimeoutError after `timeout`)."""
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as e:
        channel.close()
        raise RegistrationError(f"cannot connect to {socket_path} within {timeout} s") from e
    return channel


def get_info(channel: grpc.Channel, timeout: float = GET_INFO_TIMEOUT) -> PluginInfo:
    stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
    info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=timeout)
    return PluginInfo(info.type, info.name, info.endpoint, tuple(info.supported_versions))


def notify_registration_status(channel: grpc.Channel, registered: bool, error: str = "",
                               timeout: float = NOTIFY_TIMEOUT) -> None:
    stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
    stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=registered,
                                                                            error=error), timeout=timeout)


def choose_service(supported: Sequence[str], kubelet_services: Sequence[str] = KUBELET_DRA_SERVICES) -> str:
    """kubelet's choice: the first of its own services (most recent first) that the plugin offers."""
    for service in kubelet_services:
        if service in supported:
            return service
    raise RegistrationError(f"plugin offers {list(supported)}; this kubelet speaks {list(kubelet_services)}")


def validate(info: PluginInfo, socket_path: Path, kubelet_services: Sequence[str] = KUBELET_DRA_SERVICES
             ) -> Registration:
    if info.type != DRA_PLUGIN_TYPE:
        raise RegistrationError(f"plugin at {socket_path} has type {info.type!r}; expected {DRA_PLUGIN_TYPE!r}")
    if not info.name:
        raise RegistrationError(f"plugin at {socket_path} has an empty name")
    endpoint = info.endpoint or str(socket_path)
    if not Path(endpoint).is_absolute():
        raise RegistrationError(f"plugin {info.name} has a relative endpoint {endpoint!r}")
    return Registration(info.name, endpoint, choose_service(info.supported_versions, kubelet_services))


def register(socket_path: Path, kubelet_services: Sequence[str] = KUBELET_DRA_SERVICES,
             get_info_timeout: float = GET_INFO_TIMEOUT) -> Registration:
    """Kubelet's registration flow; any failure raises (kubelet then retries from scratch)."""
    if socket_path.name.startswith("."):
        raise RegistrationError(f"{socket_path}: kubelet ignores socket names starting with '.'")
    channel = dial(socket_path)
    try:
        info = get_info(channel, get_info_timeout)
        try:
            reg = validate(info, socket_path, kubelet_services)
        except RegistrationError as e:
            notify_registration_status(channel, False, str(e))
            raise
        notify_registration_status(channel, True)
        return reg
    finally:
        channel.close()


def _device(d: Any) -> PreparedDevice:
    return PreparedDevice(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))


class DraClient:
    """NodePrepareResources / NodeUnprepareResources on a plugin's DRA socket, in one service version."""

    def __init__(self, endpoint: Path | str, service: str = V1) -> None:
        if service not in _MESSAGES:
            raise ValueError(f"unknown DRA service {service!r}; known: {', '.join(_MESSAGES)}")
        self.endpoint = str(endpoint)
        self.service = service
        self._pb, grpc_module = _MESSAGES[service]
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        self._stub = grpc_module.DRAPluginStub(self._channel)

    def _claims(self, claims: Sequence[ClaimLike]) -> list[Any]:
        return [self._pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    def _call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise PluginCallError(method, e.code(), e.details() or "") from e

    def prepare(self, claims: Sequence[ClaimLike], timeout: float = CALL_TIMEOUT) -> dict[str, PrepareResult]:
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = self._call("NodePrepareResources", request, timeout)
        return {uid: PrepareResult(tuple(_device(d) for d in r.devices), r.error) for uid, r in response.claims.items()}

    def unprepare(self, claims: Sequence[ClaimLike], timeout: float = CALL_TIMEOUT) -> dict[str, str]:
        """Claim UID -> error ("" on success)."""
        request = self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = self._call("NodeUnprepareResources", request, timeout)
        return {uid: r.error for uid, r in response.claims.items()}

    def close(self) -> None:
        self._channel.close()
