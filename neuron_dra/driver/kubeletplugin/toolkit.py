"""The kubelet-plugin layer's second face: what a driver's process uses beside the helper (`kubeletplugin.start`),
and what the UltraServer controller (driver/groups, no kubelet plugin) uses of it too.

- the API client (answers parsed by httptools; client-side rate limit and deadline) and the claim lookup on it;
- gRPC serving for the driver's own services (an event loop thread, a server, limits) and the generated protocols;
- the process: logs, signals, heap arenas and trimming;
- files written atomically; socket paths and the rolling-update instance naming;
- the ResourceSlice publisher's types (`Helper.publish` runs it).

Names are imported on first use (the API client, the publisher and the protocols are not needed to answer
kubelet's registration: tests/driver/daemon/test_image.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_dra.driver.kubeletplugin._atomicfile import remove_temp_files, write_atomic
    from neuron_dra.driver.kubeletplugin._generated import (
        dra_health_v1_pb2,
        dra_health_v1alpha1_pb2,
        dra_health_v1beta1_pb2,
        dra_v1_pb2,
        grpc_health_v1_pb2,
        pluginregistration_pb2,
    )
    from neuron_dra.driver.kubeletplugin._grpcserver import (
        CallContext,
        EventLoopThread,
        Limits,
        Method,
        RpcError,
        Server,
        StatusCode,
        call_on,
        channel,
        service_methods,
    )
    from neuron_dra.driver.kubeletplugin._instances import (
        SOCKET_NAME_MODES,
        InstanceError,
        check_pod_uid,
        decide,
        kubelet_minor,
    )
    from neuron_dra.driver.kubeletplugin._kube import (
        RESOURCE_SLICES,
        ApiClient,
        ApiClientError,
        ApiException,
        ClientOptions,
        KubeApi,
        KubeClaimLookup,
        api_client,
    )
    from neuron_dra.driver.kubeletplugin._kubeconfig import KubeConfigError
    from neuron_dra.driver.kubeletplugin._logs import configure as configure_logs
    from neuron_dra.driver.kubeletplugin._memory import limit_arenas
    from neuron_dra.driver.kubeletplugin._memory import trim as trim_memory
    from neuron_dra.driver.kubeletplugin._ratelimit import DAEMON_BURST, DAEMON_QPS, Rate
    from neuron_dra.driver.kubeletplugin._signals import set_on_signals
    from neuron_dra.driver.kubeletplugin._slicepublisher import Backoff, ResourceSlicePublisher
    from neuron_dra.driver.kubeletplugin._sockets import SocketPaths, is_listening
    from neuron_dra.driver.kubeletplugin._tcpfront import NODE_LIMITS, Front, FrontLimits, Lanes, open_files_limit

# name -> (private module, its name there); a module of _generated: the module itself.
_WHERE: dict[str, tuple[str, str]] = {
    **{n: ("_atomicfile", n) for n in ("remove_temp_files", "write_atomic")},
    **{n: ("_generated", n) for n in ("dra_health_v1_pb2", "dra_health_v1alpha1_pb2", "dra_health_v1beta1_pb2",
                                      "dra_v1_pb2", "grpc_health_v1_pb2", "pluginregistration_pb2")},
    **{n: ("_grpcserver", n) for n in ("CallContext", "EventLoopThread", "Limits", "Method", "RpcError", "Server",
                                       "StatusCode", "call_on", "channel", "service_methods")},
    **{n: ("_instances", n) for n in ("SOCKET_NAME_MODES", "InstanceError", "check_pod_uid", "decide",
                                      "kubelet_minor")},
    **{n: ("_kube", n) for n in ("RESOURCE_SLICES", "ApiClient", "ApiClientError", "ApiException", "ClientOptions",
                                 "KubeApi", "KubeClaimLookup", "api_client")},
    "KubeConfigError": ("_kubeconfig", "KubeConfigError"),
    "configure_logs": ("_logs", "configure"),
    "limit_arenas": ("_memory", "limit_arenas"),
    "trim_memory": ("_memory", "trim"),
    **{n: ("_ratelimit", n) for n in ("DAEMON_BURST", "DAEMON_QPS", "Rate")},
    "set_on_signals": ("_signals", "set_on_signals"),
    **{n: ("_slicepublisher", n) for n in ("Backoff", "ResourceSlicePublisher")},
    **{n: ("_sockets", n) for n in ("SocketPaths", "is_listening")},
    **{n: ("_tcpfront", n) for n in ("NODE_LIMITS", "Front", "FrontLimits", "Lanes", "open_files_limit")},
}
_LAYER = __name__.rsplit(".", 1)[0]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = where
    if module == "_generated":
        value: Any = importlib.import_module(f"{_LAYER}._generated.{attr}")
    else:
        value = getattr(importlib.import_module(f"{_LAYER}.{module}"), attr)
    globals()[name] = value
    return value


__all__ = [
    "DAEMON_BURST",
    "DAEMON_QPS",
    "NODE_LIMITS",
    "RESOURCE_SLICES",
    "SOCKET_NAME_MODES",
    "ApiClient",
    "ApiClientError",
    "ApiException",
    "Backoff",
    "CallContext",
    "ClientOptions",
    "EventLoopThread",
    "Front",
    "FrontLimits",
    "InstanceError",
    "KubeApi",
    "KubeClaimLookup",
    "KubeConfigError",
    "Lanes",
    "Limits",
    "Method",
    "Rate",
    "ResourceSlicePublisher",
    "RpcError",
    "Server",
    "SocketPaths",
    "StatusCode",
    "api_client",
    "call_on",
    "channel",
    "check_pod_uid",
    "configure_logs",
    "decide",
    "dra_health_v1_pb2",
    "dra_health_v1alpha1_pb2",
    "dra_health_v1beta1_pb2",
    "dra_v1_pb2",
    "grpc_health_v1_pb2",
    "is_listening",
    "kubelet_minor",
    "limit_arenas",
    "open_files_limit",
    "pluginregistration_pb2",
    "remove_temp_files",
    "service_methods",
    "set_on_signals",
    "trim_memory",
    "write_atomic",
]
