"""gRPC health service (grpc.health.v1) on the healthcheck port, for kubelet's gRPC liveness probe.

Service "liveness" is SERVING only when the daemon answers its own kubelet-facing sockets: GetInfo on
the registration socket and an empty NodePrepareResources on the DRA socket (as the reference drivers
check), so a wedged server or a deleted socket fails the probe and kubelet restarts the container.
Service "" reports that the health server itself is up.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from neuron_dra.driver import grpc_raw, memory
from neuron_dra.driver._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    grpc_health_v1_pb2,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from neuron_dra.driver.k8s_names import LIVENESS_SERVICE
from neuron_dra.driver.plugin import SocketPaths

log = logging.getLogger("neuron_dra.driver.health")

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
        """(ok, why not) from a GetInfo and an empty prepare over the daemon's own sockets.

        Fresh channels per probe (unix sockets: cheap), closed afterwards and the heap trimmed: kept open,
        gRPC's client side would hold about 2 MiB for the daemon's lifetime, for one call every 10 s. (Trimmed
        before too: part of the last probe's memory is freed only after its channels have wound down.)"""
        memory.trim(collect=False)
        try:
            with grpc.insecure_channel(f"unix://{self._paths.registration}") as reg_channel, \
                    grpc.insecure_channel(f"unix://{self._paths.dra}") as dra_channel:
                reg = pluginregistration_pb2_grpc.RegistrationStub(reg_channel)
                info = reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=self._timeout)
                if info.endpoint != str(self._paths.dra):
                    return False, f"registration answers endpoint {info.endpoint!r}, expected {self._paths.dra}"
                dra = dra_v1_pb2_grpc.DRAPluginStub(dra_channel)
                dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as e:
            return False, f"{e.code().name}: {e.details()}"
        finally:
            memory.trim(collect=False)
        return True, ""

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.service == "":
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING)
        if request.service == LIVENESS_SERVICE:
            ok, why = self.live()
            if not ok:
                log.warning("liveness check failed", extra={"error": why})
            return grpc_health_v1_pb2.HealthCheckResponse(status=SERVING if ok else NOT_SERVING)
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f"unknown health service {request.service!r}; known: '' and {LIVENESS_SERVICE!r}")

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented; use Check")



class HealthServer:
    def __init__(self, paths: SocketPaths, address: str, port: int) -> None:
        self.service = HealthService(paths)
        self._server = grpc_raw.new_server("health", 2, MAX_CONCURRENT, MAX_MESSAGE)
        grpc_raw.add_servicer(self._server, HEALTH, self.service)
        host = f"[{address}]" if ":" in address else address
        try:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:
            raise OSError(f"cannot listen for health checks on {host}:{port}: {e}") from None

    def start(self) -> None:
        self._server.start()
        log.info("health service listening", extra={"port": self.port, "service": LIVENESS_SERVICE})

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1)
