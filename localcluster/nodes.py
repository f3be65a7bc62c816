"""Node objects for emulated Neuron hosts, labelled and tainted like EKS Neuron nodes, kept Ready by a heartbeat."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver.catalog import get_instance_spec
from neuron_dra.driver.k8s_names import neuron_taint
from neuron_dra.driver.slices import NETWORK_NODE_LABELS

log = logging.getLogger("neuron_dra.localcluster.nodes")
HEARTBEAT_S = 10.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(node_name: str, instance_type: str, zone: str = "us-east-2a", network_nodes: tuple[str, ...] = ()
                  ) -> dict[str, Any]:
    """A Node labelled as EKS labels a managed Neuron node (instance type, zone, AMI type, network topology)."""
    spec = get_instance_spec(instance_type)
    labels = {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/region": zone[:-1],
        "topology.kubernetes.io/zone": zone,
        "eks.amazonaws.com/nodegroup": f"{spec.family.name}-group",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "eks.amazonaws.com/compute-type": "ec2",
        "neuron.amazonaws.com/neuron-device": "true",
    }
    for key, value in zip(NETWORK_NODE_LABELS, network_nodes, strict=False):
        labels[key] = value
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": labels},
        "spec": {"taints": [neuron_taint()], "providerID": f"aws:///{zone}/i-emulated-{node_name}"},
    }


def node_status(instance_type: str) -> dict[str, Any]:
    now = _now()
    cap = {"cpu": "192", "memory": "2Ti", "pods": "110", "ephemeral-storage": "500Gi"}
    return {
        "capacity": cap,
        "allocatable": cap,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "emulated Neuron node",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            *({"type": t, "status": "False", "reason": f"KubeletHas{r}", "lastHeartbeatTime": now,
               "lastTransitionTime": now}
              for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                           ("PIDPressure", "SufficientPID"))),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {"kubeletVersion": "v1.34.2", "kubeProxyVersion": "", "osImage": "Amazon Linux 2023 (emulated)",
                     "operatingSystem": "linux", "architecture": "amd64", "kernelVersion": "6.1",
                     "containerRuntimeVersion": "containerd://2.0", "machineID": "", "systemUUID": "",
                     "bootID": ""},
    }


class NodeHeartbeat:
    """Keeps a Node Ready (status + Lease) as kubelet does, so node lifecycle control leaves it schedulable."""

    def __init__(self, api_client: client.ApiClient, node_name: str, instance_type: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self.node_name = node_name
        self.instance_type = instance_type
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{node_name}", daemon=True)

    def create_node(self, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            self.core.create_node(manifest)  # type: ignore[arg-type]  # the client accepts plain dicts
        except ApiException as e:
            if e.status != 409:
                raise
        self.beat()
        node = self.core.read_node(self.node_name)
        assert node.metadata is not None
        return {"uid": node.metadata.uid}

    def beat(self) -> None:
        self.core.patch_node_status(self.node_name, {"status": node_status(self.instance_type)})
        lease: Any = {"metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": 40,
                          "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            self.coord.patch_namespaced_lease(self.node_name, "kube-node-lease", lease)
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", lease)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.beat()
            except Exception as e:
                log.warning("heartbeat of %s failed: %s", self.node_name, e)
