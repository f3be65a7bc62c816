"""An emulated node with real containers (`--runtime containerd`): its namespaces, containerd, kubelet, images.

The driver is not started here: it is the DaemonSet `deploy.manifests()` renders, which this node's kubelet
runs in containerd like any pod (supervisor.driver_objects). Start order: namespaces (nodens.py) and the
forwarder of the kubelet's port from the host (kubeletaccess.py), containerd (restarted when it exits, as
systemd would), the images imported into it, kubelet (restarted too), Node Ready, with `--network-policy` the
NetworkPolicy enforcer (netpol.py), then the emulated EFA driver.
Stop order: the EFA driver, the enforcer, kubelet, every container of the node (by its cgroup), containerd, its
shims, the cgroup directories, the namespaces.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from neuron_dra.driver.deploy import POD_SELECTOR
from neuron_dra.localcluster.build import Binaries
from neuron_dra.localcluster.controlplane import kubeletaccess
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from neuron_dra.localcluster.nodes import containerd, kubelet, netpol
from neuron_dra.localcluster.nodes.images import ClusterImages
from neuron_dra.localcluster.nodes.nodeagent import NodeAgentBase, stop_part
from neuron_dra.localcluster.nodes.nodens import NodeNamespace, NodeNamespacePaths, NodeNetwork
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec, runtime_dir
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.restarting import Restarting

log = logging.getLogger(__name__)
SOCKET_TIMEOUT_S = 30.0


def cgroup_root(cluster_dir: Path, node: str) -> str:
    """The node's cgroup (cgroupfs name): unique per cluster directory and node."""
    return f"/{runtime_dir(cluster_dir).name}/{node}"


def containerd_paths(paths: NodePaths) -> containerd.ContainerdPaths:
    return containerd.ContainerdPaths(base=paths.base / "containerd", socket=paths.kubelet.cri_socket,
                                      pid_file=paths.pids / "containerd.pid")


class ContainerdNodeAgent(NodeAgentBase):
    def __init__(self, cluster_dir: Path, node: NodeSpec, index: int, api: client.ApiClient,
                 control_plane: ControlPlane, binaries: Binaries, runtime_binaries: dict[str, Path],
                 images: ClusterImages, deadline: float, catalog_file: Path | None = None,
                 ports: kubelet.PortAllocator | None = None, enforcer_binary: Path | None = None) -> None:
        super().__init__(cluster_dir, node, api, control_plane, binaries, deadline, catalog_file, ports, log)
        self.cluster_dir = cluster_dir
        self.net = NodeNetwork(index)
        self.runtime_binaries = runtime_binaries
        self.images = images
        self.cgroup_root = cgroup_root(cluster_dir, node.name)
        self.ctrd_paths = containerd_paths(self.paths)
        self.namespace: NodeNamespace | None = None
        self.enforcer_binary = enforcer_binary  # kube-router: NetworkPolicy enforced on this node (netpol.py)
        self.enforcer: netpol.NetworkPolicyEnforcer | None = None

    def start(self) -> None:
        p = self.paths
        serving = kubeletaccess.serving_cert(self.control_plane.ca, p.kubelet.cert_dir, self.node.name,
                                             [self.net.node_ip])
        host, spec = self.prepare(self.net.node_ip, [p.host_root / "opt" / "aws" / "neuron"],
                                  cgroup_root=self.cgroup_root, serving_cert=serving)
        lifetime = self.deadline - time.time()
        ns = NodeNamespace(NodeNamespacePaths(p.base, p.runtime), p.kubelet, p.host_root, self.net,
                           self.control_plane.ports.apiserver)
        self.namespace = ns
        ns.start(lifetime)
        ns.forward("kubelet", spec.port, spec.port, lifetime)  # the API server's way in (kubeletaccess.py)
        containerd.prepare(self.ctrd_paths, self.images.pause.reference, self.net.pod_subnet)
        containerd.create_cgroups(self.cgroup_root)
        binary = self.runtime_binaries["containerd"]
        self.runtime = Restarting(f"containerd-{self.node.name}",
                                  lambda life: containerd.start(binary, self.ctrd_paths, ns.enter, life),
                                  self.ctrd_paths.pid_file, self.deadline)
        self.runtime.start()
        self._wait_containerd()
        for image in self.images.all():
            containerd.import_image(self.runtime_binaries["ctr"], self.ctrd_paths, image.archive, image.reference)
        node_uid = self.start_kubelet(spec, enter=ns.enter)
        if self.enforcer_binary is not None:  # it reads its Node's InternalIP at start
            paths = netpol.EnforcerPaths(p.base / "netpol")
            self.control_plane.client_kubeconfig(netpol.USER, path=paths.kubeconfig)
            self.enforcer = netpol.NetworkPolicyEnforcer(self.node.name, paths, self.enforcer_binary, ns.enter,
                                                         ns.enter_net, self.deadline)
            self.enforcer.start()
        self.start_efa(host, node_uid)

    def _wait_containerd(self) -> None:
        def answers() -> bool:
            try:
                containerd.ctr(self.runtime_binaries["ctr"], self.ctrd_paths, ["version"], timeout=5)
            except containerd.ContainerdError:
                return False
            return True

        if not procs.wait_for(answers, SOCKET_TIMEOUT_S):
            raise containerd.ContainerdError(f"containerd of {self.node.name} did not answer within "
                                             f"{SOCKET_TIMEOUT_S:.0f} s; {self.ctrd_paths.log} ends:\n"
                                             f"{procs.log_tail(self.ctrd_paths.log)}")

    def stop(self) -> None:
        self.stop_steps((
            ("EFA driver", lambda: stop_part(self.efa)),
            ("NetworkPolicy enforcer", lambda: stop_part(self.enforcer)),
            ("kubelet", lambda: stop_part(self.kubelet)),
            ("containers", lambda: containerd.kill_cgroup_processes(self.cgroup_root)),
            ("containerd", lambda: stop_part(self.runtime)),
            ("shims", lambda: containerd.kill_shims(self.ctrd_paths.socket)),
            ("cgroups", self._remove_cgroups),
            ("namespaces", lambda: stop_part(self.namespace))))

    def _remove_cgroups(self) -> None:
        left = containerd.remove_cgroups(self.cgroup_root)
        if left:
            log.error("cgroups of %s left behind: %s", self.node.name, ", ".join(map(str, left)))
        # The cluster's own parent directory, once its last node is gone.
        parent = "/" + self.cgroup_root.strip("/").split("/")[0]
        for d in containerd.cgroup_dirs(parent):
            try:
                d.rmdir()
            except OSError:
                continue


def driver_pod_selector() -> str:
    """The label selector of the driver DaemonSet's pods."""
    return ",".join(f"{k}={v}" for k, v in sorted(POD_SELECTOR.items()))


def wait_driver_ready(api: client.ApiClient, options: Any, nodes: list[str], timeout: float) -> None:
    """The DaemonSet's pod is Ready on every node and each node's driver has published its ResourceSlices
    (so the plugin watcher registered it and the driver reached the API server from inside its container)."""
    core = client.CoreV1Api(api)
    resource = client.ResourceV1Api(api)
    waiting: list[str] = list(nodes)

    def ready() -> bool:
        pods: list[Any] = core.list_namespaced_pod(options.namespace, label_selector=driver_pod_selector()).items
        running = {p.spec.node_name for p in pods
                   if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}
        slices = resource.list_resource_slice(field_selector=f"spec.driver={options.driver_name}").items
        published = {s.spec.node_name for s in slices}
        waiting[:] = [n for n in nodes if n not in running or n not in published]
        return not waiting

    if not procs.wait_for(ready, timeout, 0.5):
        raise TimeoutError(f"the driver DaemonSet is not Ready with published slices on {', '.join(waiting)} after "
                           f"{timeout:.0f} s (see `kubectl -n {options.namespace} describe pods` and the nodes' "
                           "kubelet.log / containerd.log)")
