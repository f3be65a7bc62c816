"""The kubelet-plugin helper a DRA driver runs on: `start(driver, options) -> Helper` (_helper.py), as the Go
helper's `kubeletplugin.Start`. Nothing here names Neuron hardware; an import contract keeps the layer free of
the daemon and has the daemon import this module only (pyproject.toml), not the private modules behind it:
gRPC serving on unix sockets, plugin registration, rolling-update instances and their lock, the API client with
its deadline and rate limit, the ResourceSlice publisher, atomic files, logs, signals and the generated
protocol code.

What kubelet's registration needs (the helper, the gRPC servers, socket names) is imported with this module;
the rest (the API client on urllib3, the publisher, the liveness front, the health protocols) on first use, so a
driver answers registration before it has imported them (tests/driver/daemon/test_image.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuron_dra.driver.kubeletplugin._atomicfile import remove_temp_files, write_atomic
from neuron_dra.driver.kubeletplugin._claimref import CallScope, ClaimFailed, ClaimLookup, ClaimLookupError, ClaimRef
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
from neuron_dra.driver.kubeletplugin._helper import UNSHARED_POLL, UNSHARED_WAIT, Helper, Options, start
from neuron_dra.driver.kubeletplugin._instance_lock import InstanceLock, LockTimeout
from neuron_dra.driver.kubeletplugin._instances import (
    SOCKET_NAME_MODES,
    InstanceError,
    check_pod_uid,
    decide,
    kubelet_minor,
)
from neuron_dra.driver.kubeletplugin._logs import configure as configure_logs
from neuron_dra.driver.kubeletplugin._memory import limit_arenas
from neuron_dra.driver.kubeletplugin._memory import trim as trim_memory
from neuron_dra.driver.kubeletplugin._plugin import MAX_CLAIMS_PER_CALL, Driver, PreparedDevice
from neuron_dra.driver.kubeletplugin._ratelimit import DAEMON_BURST, DAEMON_QPS, Rate
from neuron_dra.driver.kubeletplugin._signals import set_on_signals
from neuron_dra.driver.kubeletplugin._sockets import SocketError, SocketPaths, is_listening

if TYPE_CHECKING:
    from neuron_dra.driver.kubeletplugin._generated import (
        dra_health_v1_pb2,
        dra_health_v1alpha1_pb2,
        dra_health_v1beta1_pb2,
        dra_v1_pb2,
        grpc_health_v1_pb2,
        pluginregistration_pb2,
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
    from neuron_dra.driver.kubeletplugin._slicepublisher import (
        Backoff,
        PublishFeedback,
        ResourceSlicePublisher,
        Slice,
    )
    from neuron_dra.driver.kubeletplugin._tcpfront import NODE_LIMITS, Front, FrontLimits, Lanes, open_files_limit

# Imported on first use: name -> the private module that has it (a module of _generated: the module itself).
_LATER = {
    **dict.fromkeys(("ApiClient", "ApiClientError", "ApiException", "ClientOptions", "KubeApi", "KubeClaimLookup",
                     "RESOURCE_SLICES", "api_client"), "_kube"),
    "KubeConfigError": "_kubeconfig",
    **dict.fromkeys(("Backoff", "PublishFeedback", "ResourceSlicePublisher", "Slice"), "_slicepublisher"),
    **dict.fromkeys(("NODE_LIMITS", "Front", "FrontLimits", "Lanes", "open_files_limit"), "_tcpfront"),
    **dict.fromkeys(("dra_health_v1_pb2", "dra_health_v1alpha1_pb2", "dra_health_v1beta1_pb2", "dra_v1_pb2",
                     "grpc_health_v1_pb2", "pluginregistration_pb2"), "_generated"),
}


def __getattr__(name: str) -> Any:
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == "_generated":
        value: Any = importlib.import_module(f"{__name__}._generated.{name}")
    else:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DAEMON_BURST", "DAEMON_QPS", "MAX_CLAIMS_PER_CALL", "NODE_LIMITS", "RESOURCE_SLICES", "SOCKET_NAME_MODES",
    "UNSHARED_POLL", "UNSHARED_WAIT",
    "ApiClient", "ApiClientError", "ApiException", "Backoff", "CallContext", "CallScope", "ClaimFailed",
    "ClaimLookup", "ClaimLookupError", "ClaimRef", "ClientOptions", "Driver", "EventLoopThread", "Front",
    "FrontLimits", "Helper", "InstanceError", "InstanceLock", "KubeApi", "KubeClaimLookup", "KubeConfigError",
    "Lanes", "Limits", "LockTimeout", "Method", "Options", "PreparedDevice", "PublishFeedback", "Rate",
    "ResourceSlicePublisher", "RpcError", "Server", "Slice", "SocketError", "SocketPaths", "StatusCode", "api_client",
    "call_on", "channel", "check_pod_uid", "configure_logs", "decide", "dra_health_v1_pb2", "dra_health_v1alpha1_pb2",
    "dra_health_v1beta1_pb2", "dra_v1_pb2", "grpc_health_v1_pb2", "is_listening", "kubelet_minor",
    "limit_arenas",
    "open_files_limit", "pluginregistration_pb2", "remove_temp_files", "service_methods", "set_on_signals",
    "start", "trim_memory", "write_atomic",
]
