"""gRPC health service (grpc.health.v1) on the healthcheck port, for kubelet's gRPC liveness probe.

Service "liveness" is SERVING only when the daemon answers its own kubelet-facing sockets: GetInfo on
the registration socket and an empty NodePrepareResources on the DRA socket (as the reference drivers
check), so a wedged server or a deleted socket fails the probe and kubelet restarts the container.
Service "" reports that the health server itself is up.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from neuron_dra.driver.daemon import h2grpc, memory
from neuron_dra.driver.daemon._generated import dra_v1_pb2, grpc_health_v1_pb2, pluginregistration_pb2
from neuron_dra.driver.daemon.sockets import SocketPaths
from neuron_dra.driver.model.k8s_names import LIVENESS_SERVICE

log = logging.getLogger("neuron_dra.driver.daemon.health")

SERVING = grpc_health_v1_pb2.HealthCheckResponse.SERVING
NOT_SERVING = grpc_health_v1_pb2.HealthCheckResponse.NOT_SERVING
HEALTH = grpc_health_v1_pb2.DESCRIPTOR.services_by_name["Health"]
# The probe is one small call every few seconds: two workers, a few calls at once, tiny messages. Anything beyond
# is answered RESOURCE_EXHAUSTED at once (and a probe that gets it is retried by kubelet).
MAX_CONCURRENT = 4
MAX_MESSAGE = 4096


class HealthService:
    def __init__(self, paths: SocketPaths, probe_timeout: float = 2.0) -> None:
        self._paths = paths
        self._timeout = probe_timeout

    def live(self) -> tuple[bool, str]:
        """(ok, why not) from a GetInfo and an empty prepare over the daemon's own sockets (a fresh connection
        each, closed afterwards; the heap trimmed after)."""
        try:
            info = pluginregistration_pb2.PluginInfo.FromString(h2grpc.call_unary(
                str(self._paths.registration), "/pluginregistration.Registration/GetInfo",
                pluginregistration_pb2.InfoRequest().SerializeToString(), self._timeout))
            if info.endpoint != str(self._paths.dra):
                return False, f"registration answers endpoint {info.endpoint!r}, expected {self._paths.dra}"
            h2grpc.call_unary(str(self._paths.dra), f"/{dra_v1_pb2.DESCRIPTOR.package}.DRAPlugin/NodePrepareResources",
                              dra_v1_pb2.NodePrepareResourcesRequest().SerializeToString(), self._timeout)
        except h2grpc.RpcError as e:
            return False, f"{e.code.name}: {e.details}"
        finally:
            memory.trim(collect=False)
        return True, ""

    def Check(self, request: Any, context: h2grpc.CallContext) -> Any:
        if request.service == "":
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING)
        if request.service == LIVENESS_SERVICE:
            ok, why = self.live()
            if not ok:
                log.warning("liveness check failed", extra={"error": why})
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING if ok else NOT_SERVING)
        context.abort(h2grpc.StatusCode.NOT_FOUND,
                      f"unknown health service {request.service!r}; known: '' and {LIVENESS_SERVICE!r}")

    def Watch(self, request: Any, context: h2grpc.CallContext) -> Any:
        context.abort(h2grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented; use Check")



class HealthServer:
    def __init__(self, paths: SocketPaths, address: str, port: int) -> None:
        self.service = HealthService(paths)
        # kubelet's prober opens a connection per probe; idle ones are closed after 10 s (connections are capped).
        self._server = h2grpc.Server("health", 2, MAX_CONCURRENT, MAX_MESSAGE, max_connections=64, idle_timeout=10.0)
        self._server.add_service(HEALTH, self.service)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            sock = h2grpc.listening_socket(family, (address, port))
        except OSError as e:
            host = f"[{address}]" if ":" in address else address
            raise OSError(f"cannot listen for health checks on {host}:{port}: {e}") from None
        self.port = int(sock.getsockname()[1])
        self._server.add_socket(sock)

    def start(self) -> None:
        self._server.start()
        log.info("health service listening", extra={"port": self.port, "service": LIVENESS_SERVICE})

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace)
