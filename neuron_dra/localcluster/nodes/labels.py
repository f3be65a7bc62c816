"""How an emulated Neuron node is labelled and tainted, as EKS labels a managed Neuron node. Its kubelet registers
the Node with these (kubelet.labels_and_taints) and keeps it Ready."""

from __future__ import annotations

from typing import Any

from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.k8s_names import neuron_taint
from neuron_dra.driver.model.slices import NETWORK_NODE_LABELS


def node_manifest(node_name: str, instance_type: str, zone: str = "us-east-2a", network_nodes: tuple[str, ...] = (),
                  catalog: Catalog = BUILTIN) -> dict[str, Any]:
    """A Node labelled as EKS labels a managed Neuron node (instance type, zone, AMI type, network topology)."""
    spec = catalog.spec(instance_type)
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
