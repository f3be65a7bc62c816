"""An emulated EFA DRA driver for the local cluster (DRANET, AWS's EFA DRA driver, needs real EFA hardware).

It publishes one device per EFA interface of an emulated host with the attributes of driver/model/efa.py (DRANET's
PCI identity, which the chart's DeviceClass selects on, and the same `resource.aws.com/devicegroup*_id` values the
Neuron driver publishes for the devices wired to it), and installs the chart's DeviceClass, so aligned
Neuron + EFA claims can be scheduled by the real scheduler, and it serves registration and the DRA v1 service so
the kubelet can prepare such claims (no CDI edits: an EFA is handed over by the network plugin).
"""

from __future__ import annotations

import contextlib
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver.kubeletplugin._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.efa import EFA_DRIVER, efa_device_class, efa_driver_devices
from neuron_dra.driver.model.slices import NodeFacts, build_pool

__all__ = ["EFA_DRIVER", "EmulatedEfaDriver", "efa_device_class", "efa_devices", "efa_slice"]


def efa_devices(host: NeuronHost) -> list[dict[str, Any]]:
    return efa_driver_devices(build_pool(host, NodeFacts("x")))


def efa_slice(node_name: str, host: NeuronHost, node_uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"generateName": f"{node_name}-{EFA_DRIVER}-"}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": EFA_DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
                     "devices": efa_devices(host)}}


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name=EFA_DRIVER, endpoint=self.endpoint,
                                                 supported_versions=["v1.DRAPlugin"])

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.RegistrationStatusResponse()


class _DRA(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, api: client.ResourceV1Api, node_name: str) -> None:
        self.api = api
        self.node_name = node_name

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = {}
        for claim in request.claims:
            try:
                obj: Any = self.api.read_namespaced_resource_claim(claim.name, claim.namespace)
                results = obj.status.allocation.devices.results or []
                devices = [dra_v1_pb2.Device(request_names=[r.request.split("/")[0]], pool_name=r.pool,
                                             device_name=r.device)
                           for r in results if r.driver == EFA_DRIVER and r.pool == self.node_name]
                out[claim.uid] = dra_v1_pb2.NodePrepareResourceResponse(devices=devices)
            except (ApiException, AttributeError) as e:
                out[claim.uid] = dra_v1_pb2.NodePrepareResourceResponse(error=f"emulated EFA prepare: {e}")
        return dra_v1_pb2.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return dra_v1_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_v1_pb2.NodeUnprepareResourceResponse() for c in request.claims})


class EmulatedEfaDriver:
    """Serves the EFA plugin sockets of one node and keeps its slice published."""

    def __init__(self, api_client: client.ApiClient, node_name: str, host: NeuronHost, plugins_dir: Path,
                 registry_dir: Path, node_uid: str | None = None) -> None:
        self.api = client.ResourceV1Api(api_client)
        self.node_name = node_name
        self.host = host
        self.node_uid = node_uid
        self.dra_socket = plugins_dir / EFA_DRIVER / "dra.sock"
        self.reg_socket = registry_dir / f"{EFA_DRIVER}-reg.sock"
        self._servers: list[grpc.Server] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish_loop, name=f"efa-{node_name}", daemon=True)

    def start(self) -> None:
        if not self.host.efa_bdfs or not any(d.efa_bdf for d in self.host.devices):
            return
        dra = self._serve(self.dra_socket)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DRA(self.api, self.node_name), dra)
        reg = self._serve(self.reg_socket)
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(_Registration(str(self.dra_socket)), reg)
        # DRA socket first, then registration: kubelet dials the endpoint as soon as it sees the registration.
        for server, sock in ((dra, self.dra_socket), (reg, self.reg_socket)):
            server.add_insecure_port(f"unix://{sock}")
            server.start()
            sock.chmod(0o660)
            self._servers.append(server)
        self._thread.start()

    @staticmethod
    def _serve(sock: Path) -> grpc.Server:
        sock.parent.mkdir(parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)
        return grpc.server(futures.ThreadPoolExecutor(max_workers=2))

    def stop(self) -> None:
        self._stop.set()
        for server in self._servers:
            server.stop(grace=1)
        for sock in (self.reg_socket, self.dra_socket):
            sock.unlink(missing_ok=True)

    def _publish_loop(self) -> None:
        # kubelet wipes the node's slices when it starts: keep ours present, like a real driver does.
        while not self._stop.is_set():
            with contextlib.suppress(ApiException):
                existing = self.api.list_resource_slice(
                    field_selector=f"spec.nodeName={self.node_name},spec.driver={EFA_DRIVER}")
                if not existing.items:
                    self.api.create_resource_slice(efa_slice(self.node_name, self.host, self.node_uid))  # type: ignore[arg-type]
            self._stop.wait(2.0)
