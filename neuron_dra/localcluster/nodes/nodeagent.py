"""What every emulated node's agent does, whatever its runtime: the emulated host tree, the Node's labels and the
kubelet's spec, the kubelet (restarted when it exits) up to Node Ready, the emulated EFA driver, and the stop steps,
each timed and logged. supervisor.NodeAgent runs the fake runtime, containerd_node.ContainerdNodeAgent real
containers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.catalog_file import load_catalog
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from neuron_dra.localcluster.build import Binaries
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from neuron_dra.localcluster.nodes import kubelet
from neuron_dra.localcluster.nodes.efa_emulator import EmulatedEfaDriver
from neuron_dra.localcluster.nodes.labels import node_manifest
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec
from neuron_dra.localcluster.processes.restarting import Restarting


class NodeAgentBase:
    def __init__(self, cluster_dir: Path, node: NodeSpec, api: client.ApiClient, control_plane: ControlPlane,
                 binaries: Binaries, deadline: float, catalog_file: Path | None,
                 ports: kubelet.PortAllocator | None, log: logging.Logger) -> None:
        self.node = node
        self.ports = ports or kubelet.PortAllocator()
        self.catalog_file = catalog_file  # a catalog file's instance types (docs/catalog-file.md), for the driver too
        self.catalog = load_catalog(catalog_file) if catalog_file else BUILTIN
        self.paths = NodePaths.of(cluster_dir, node.name)
        self.api = api
        self.control_plane = control_plane
        self.binaries = binaries
        self.deadline = deadline
        self.log = log
        self.runtime: Restarting | None = None
        self.kubelet: Restarting | None = None
        self.efa: EmulatedEfaDriver | None = None

    def prepare(self, node_ip: str, extra_dirs: Sequence[Path] = (), **spec_options: Any
                ) -> tuple[NeuronHost, kubelet.KubeletSpec]:
        """The node's directories, its emulated host tree (kept when it exists), and the kubelet's spec, written
        with its node kubeconfig (kubelet.prepare)."""
        p = self.paths
        for d in (p.plugins_dir, p.registry_dir, p.pids):
            d.mkdir(parents=True, exist_ok=True)
        if not p.host_root.exists():
            emulate(self.node.instance_type, p.host_root, emulation_options(self.node), self.catalog)
        for d in extra_dirs:
            d.mkdir(parents=True, exist_ok=True)
        host = discover(p.host_root, catalog=self.catalog)
        net = (f"nn-{self.node.name[:4]}-l1", f"nn-{self.node.name[:4]}-l2", f"nn-{self.node.name}-l3")
        labels, taints, provider_id = kubelet.labels_and_taints(
            node_manifest(self.node.name, self.node.instance_type, network_nodes=net, catalog=self.catalog))
        spec = kubelet.KubeletSpec(self.node.name, labels, taints, provider_id, node_ip, self.control_plane.ca_file,
                                   self.ports.take(), self.ports.take(), int(self.binaries.minor.split(".")[1]),
                                   **spec_options)
        kubelet.prepare(spec, p.kubelet,
                        lambda user, groups, path: self.control_plane.client_kubeconfig(user, groups, path=path))
        return host, spec

    def start_kubelet(self, spec: kubelet.KubeletSpec, enter: list[str] | None = None) -> str:
        """Start the kubelet (joining the node's namespaces with `enter`) and wait for the Node Ready; its uid."""
        self.kubelet = Restarting(f"kubelet-{self.node.name}",
                                  lambda life: kubelet.start(self.binaries.kubelet, spec, self.paths.kubelet, life,
                                                             enter=enter),
                                  self.paths.kubelet.pid_file, self.deadline)
        self.kubelet.start()
        return kubelet.wait_node_ready(self.api, self.node.name, self.paths.kubelet.log)

    def start_efa(self, host: NeuronHost, node_uid: str) -> None:
        p = self.paths
        self.efa = EmulatedEfaDriver(self.api, self.node.name, host, p.plugins_dir, p.registry_dir, node_uid)
        self.efa.start()

    def stop_steps(self, steps: Sequence[tuple[str, Callable[[], object]]]) -> None:
        """Run each stop step in order, timed; a failing one is logged and the next runs."""
        for name, step in steps:
            began = time.monotonic()
            try:
                step()
            except Exception:
                self.log.exception("stopping the %s of %s", name, self.node.name)
            self.log.info("stopped the %s of %s in %.1f s", name, self.node.name, time.monotonic() - began)


def emulation_options(node: NodeSpec) -> EmulationOptions:
    """The node's emulated host: its own serials; on an UltraServer type, its UltraServer's ids and mode, in its
    position (topology.parse_nodes)."""
    if not node.ultraserver:
        return EmulationOptions(host_id=node.name)
    return EmulationOptions(host_id=node.name, ultraserver_id=node.ultraserver, ultraserver_node=node.ultraserver_node,
                            ultraserver_mode=node.ultraserver_size)


def stop_part(part: Any) -> None:
    """Stop a node part that may not have started."""
    if part is not None:
        part.stop()
