"""The local cluster's supervisor: one process that owns the control plane and every emulated node.

`neuron-dra cluster up` starts it detached and waits until it reports ready; `cluster down` stops it.
It stops by itself after `--ttl` seconds, so nothing outlives a forgotten cluster (and every process it
starts is bounded by the same lifetime through `procs.spawn`, even if the supervisor is killed with -9).
Per node it runs what a real Neuron node runs: the real kubelet of the cluster's Kubernetes version (in its
own mount namespace, see kubelet.py) against a fake CRI runtime (fakeruntime.py), the driver daemon under
its own service-account identity bound to a driver pod on that node, and an emulated EFA driver. kubelet,
runtime and driver are restarted when they exit, as systemd restarts kubelet and kubelet a DaemonSet's
container.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from neuron_dra.driver import deploy
from neuron_dra.driver.kubeletplugin._signals import set_on_signals
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.catalog_file import load_catalog
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster.build import (
    DEFAULT_MINOR,
    Binaries,
    build_containerd,
    build_fakecri,
    build_kube_router,
    ensure_binaries,
)
from neuron_dra.localcluster.controlplane.apply import apply_all
from neuron_dra.localcluster.controlplane.groups import LocalGroupController
from neuron_dra.localcluster.controlplane.plane import BoundObject, ControlPlane
from neuron_dra.localcluster.controlplane.profiles import DEFAULT_PROFILE, PROFILES
from neuron_dra.localcluster.controlplane.prometheus import METRICS_PORT, LocalPrometheus, ScrapeTarget
from neuron_dra.localcluster.controlplane.prometheus_build import build_prometheus
from neuron_dra.localcluster.nodes import fakeruntime, kubelet, netpol, neuron_monitor_emulator
from neuron_dra.localcluster.nodes.containerd_node import ContainerdNodeAgent, driver_pod_selector, wait_driver_ready
from neuron_dra.localcluster.nodes.efa_emulator import efa_device_class
from neuron_dra.localcluster.nodes.images import ensure_images, write_references
from neuron_dra.localcluster.nodes.nodeagent import NodeAgentBase, stop_part
from neuron_dra.localcluster.nodes.nodens import HOST_TREE
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec, parse_nodes, runtime_dir
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.restarting import Restarting

log = logging.getLogger(__name__)
DEFAULT_TTL_S = 2 * 3600
STATUS_FILE = "status.json"
PID_FILE = "supervisor.pid"
LOG_FILE = "supervisor.log"
RUNTIMES = ("containerd", "fake")  # cluster up --runtime: real containers, or the fake CRI runtime


@dataclass(frozen=True)
class DriverIdentity:
    namespace: str
    service_account: str
    pod_name: str


def write_status(cluster_dir: Path, **status: Any) -> None:
    tmp = cluster_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(status, indent=1), encoding="utf-8")
    tmp.replace(cluster_dir / STATUS_FILE)


class NodeAgent(NodeAgentBase):
    """Everything that runs for one emulated node: fake runtime, kubelet, driver daemon, emulated EFA driver."""

    def __init__(self, cluster_dir: Path, node: NodeSpec, api: client.ApiClient, control_plane: ControlPlane,
                 identity: DriverIdentity, driver_name: str, binaries: Binaries, fakecri: Path,
                 deadline: float, catalog_file: Path | None = None,
                 ports: kubelet.PortAllocator | None = None, metrics_port: int = 0,
                 core_partitions: str = "") -> None:
        super().__init__(cluster_dir, node, api, control_plane, binaries, deadline, catalog_file, ports, log)
        self.metrics_port = metrics_port  # 0: none; else the driver's, on loopback (Prometheus scrapes it)
        self.core_partitions = core_partitions or LOCAL_CORE_PARTITIONS
        self.identity = identity
        self.driver_name = driver_name
        self.fakecri = fakecri
        self.driver: Restarting | None = None

    def start(self) -> None:
        p = self.paths
        host, spec = self.prepare(kubelet.node_ip(), [p.cdi_root])
        rt = p.fake_runtime
        self.runtime = Restarting(f"fakecri-{self.node.name}",
                                  lambda life: fakeruntime.start(self.fakecri, rt, life), rt.pid_file, self.deadline)
        self.runtime.start()
        node_uid = self.start_kubelet(spec)
        self._write_driver_kubeconfig()
        argv = [sys.executable, "-m", "neuron_dra.driver", "--node-name", self.node.name,
                "--driver-name", self.driver_name, "--plugins-dir", str(p.plugins_dir),
                "--registry-dir", str(p.registry_dir), "--cdi-root", str(p.cdi_root),
                "--healthcheck-port", "0", "--metrics-port", str(self.metrics_port), "--bind-address", "127.0.0.1",
                "--kubeconfig", str(p.driver_kubeconfig),
                "--host-root", str(p.host_root),
                "--core-partitions", local_core_partitions(self.binaries.minor, self.core_partitions)]
        if self.catalog_file:
            argv += ["--catalog", str(self.catalog_file)]
        env = dict(os.environ)
        self.driver = Restarting(f"driver-{self.node.name}",
                                 lambda life: procs.spawn(argv, log=p.driver_log, pid_file=p.driver_pid,
                                                          lifetime_s=life, env=env),
                                 p.driver_pid, self.deadline)
        self.driver.start()
        self.start_efa(host, node_uid)

    def _write_driver_kubeconfig(self) -> None:
        """A token bound to a driver pod on this node: the API server adds the node name to the identity, which
        the node-restricting admission policy checks. The kubelet "runs" that pod in the fake runtime."""
        core = client.CoreV1Api(self.api)
        ident = self.identity
        pod_name = f"{ident.pod_name}-{self.node.name}"
        pod: Any = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ident.namespace,
                         "labels": {"app.kubernetes.io/name": "neuron-dra-driver"}},
            "spec": {"nodeName": self.node.name, "serviceAccountName": ident.service_account,
                     "automountServiceAccountToken": False,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "plugin", "image": "neuron-dra-driver:local"}]},
        }
        try:
            created = core.create_namespaced_pod(ident.namespace, pod)
        except client.exceptions.ApiException as e:
            if e.status != 409:
                raise
            created = core.read_namespaced_pod(pod_name, ident.namespace)
        assert created.metadata is not None
        bound = BoundObject(kind="Pod", api_version="v1", name=pod_name, uid=str(created.metadata.uid))
        token = self.control_plane.service_account_token(ident.namespace, ident.service_account, bound_object=bound,
                                                         expiration_s=DEFAULT_TTL_S + 3600, create=False)
        user = f"system:serviceaccount:{ident.namespace}:{ident.service_account}"
        self.control_plane.token_kubeconfig(token, user, self.paths.driver_kubeconfig)
        self.paths.driver_kubeconfig.chmod(0o600)

    def stop(self) -> None:
        # The driver first (it must not see a half-stopped node as a reason to act), the runtime last.
        self.stop_steps((("driver", lambda: stop_part(self.driver)), ("EFA driver", lambda: stop_part(self.efa)),
                         ("kubelet", lambda: stop_part(self.kubelet)),
                         ("fake runtime", lambda: stop_part(self.runtime))))


def start_all(agents: list[Any]) -> None:
    """Start the nodes side by side (each waits for its kubelet to report the Node Ready); the first failure is
    raised once every start has returned."""
    errors: list[BaseException] = []

    def start(agent: NodeAgent) -> None:
        try:
            agent.start()
        except BaseException as e:  # reported below, with the node's name
            log.exception("starting node %s failed", agent.node.name)
            errors.append(e)

    threads = [threading.Thread(target=start, args=(a,), name=f"start-{a.node.name}") for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_for_service_account(api: client.ApiClient, namespace: str, name: str, timeout: float) -> None:
    core = client.CoreV1Api(api)
    if not procs.wait_for(lambda: any(sa.metadata is not None and sa.metadata.name == name
                                      for sa in core.list_namespaced_service_account(namespace).items), timeout):
        raise RuntimeError(f"namespace {namespace} has no service account {name} after {timeout:.0f} s "
                           "(is kube-controller-manager running?)")


# A local cluster has a handful of nodes: NeuronCores on every minor that serves them (1.36+), whatever the
# 1.36 scheduler would cost at 1,000 nodes (DriverDeployOptions.core_partitions). `cluster up` may turn them off
# (`up(core_partitions="off")`): whole devices without counters, as on EKS 1.34-1.36 by default.
LOCAL_CORE_PARTITIONS = "on"
CORE_PARTITION_CHOICES = ("on", "off")


def local_core_partitions(minor: str | None, mode: str = LOCAL_CORE_PARTITIONS) -> str:
    """The fake runtime's daemon's --core-partitions: the DaemonSet's rule (deploy.core_partitions_arg)."""
    options = deploy.DriverDeployOptions(kubernetes_version=minor, core_partitions=mode)
    return deploy.core_partitions_arg(options) or "auto"


def driver_objects(driver_name: str, kubernetes_version: str | None = None,
                   core_partitions: str = LOCAL_CORE_PARTITIONS) -> tuple[list[dict[str, Any]], DriverIdentity]:
    """The same objects `neuron-dra plan -o yaml` prints for the driver, minus the DaemonSet (with the fake
    runtime the supervisor runs the daemon itself), plus the EFA DeviceClass of the emulated EFA driver."""
    # neuron_monitor: AWS's image cannot run on an emulated node; the nodes' stand-in exporter replaces it.
    options = deploy.DriverDeployOptions(driver_name=driver_name, core_partitions=core_partitions,
                                         kubernetes_version=kubernetes_version, neuron_monitor=False)
    objects = [o for o in deploy.manifests(options) if o["kind"] != "DaemonSet"]
    identity = DriverIdentity(options.namespace, options.service_account, "neuron-dra-driver-kubelet-plugin")
    return [*objects, efa_device_class()], identity


def daemonset_options(driver_name: str, image: str, catalog_file: Path | None = None, metrics_port: int = 0,
                      kubernetes_version: str | None = None, core_partitions: str = LOCAL_CORE_PARTITIONS) -> Any:
    """The deploy options of a containerd cluster's driver: the defaults, except what a local node must differ
    in: the image (imported, not pulled), the emulated host tree's path on the node, a catalog file's text, and
    the metrics port when a Prometheus scrapes the drivers."""
    return deploy.DriverDeployOptions(driver_name=driver_name, image=image, host_paths_root=HOST_TREE,
                                      catalog_yaml=catalog_file.read_text() if catalog_file else None,
                                      metrics_port=metrics_port, core_partitions=core_partitions,
                                      kubernetes_version=kubernetes_version, neuron_monitor=False)


def expose_drivers(api: client.ApiClient, options: Any, agents: list[Any], ports: kubelet.PortAllocator,
                   lifetime_s: float) -> list[Any]:
    """Scrape targets on the host for the driver pods of a containerd cluster (controlplane/prometheus.py)."""
    pods = client.CoreV1Api(api).list_namespaced_pod(options.namespace, label_selector=driver_pod_selector()).items
    ip_of = {p.spec.node_name: p.status.pod_ip for p in pods if p.spec and p.status and p.status.pod_ip}
    targets = []
    for agent in agents:
        port = ports.take()
        agent.namespace.forward("metrics", port, options.metrics_port, lifetime_s, node_address=ip_of[agent.node.name])
        targets.append(ScrapeTarget(agent.node.name, f"127.0.0.1:{port}"))
    return targets


def start_group_controller(controllers: list[LocalGroupController], cluster_dir: Path, nodes: list[NodeSpec],
                           admin: client.ApiClient, cp: ControlPlane, driver_name: str, namespace: str,
                           deadline: float) -> None:
    """With a node of an UltraServer type, the UltraServer group controller and its objects (the group
    DeviceClass among them), appended to `controllers` once made (the caller stops it)."""
    if not any(n.ultraserver for n in nodes):
        return
    controller = LocalGroupController(cluster_dir, admin, cp, driver_name, namespace, deadline,
                                      DEFAULT_TTL_S + 3600)
    controllers.append(controller)
    controller.start()


def start_nodes(agents: list[Any], cluster_dir: Path, nodes: list[NodeSpec], admin: client.ApiClient,
                cp: ControlPlane, binaries: Binaries, ports: kubelet.PortAllocator, deadline: float, *,
                driver_name: str, catalog_file: Path | None, runtime: str, prometheus: bool,
                network_policy: bool, controllers: list[LocalGroupController] | None = None,
                driver: bool = True, core_partitions: str = LOCAL_CORE_PARTITIONS) -> list[ScrapeTarget]:
    """Apply the driver's objects and start every node's agent, each appended to `agents` as it is made (the
    caller stops them), and the UltraServer group controller (into `controllers`) where nodes form UltraServers;
    the drivers' scrape targets when `prometheus`. Without `driver` (containerd only) the nodes come up with the
    driver's image but neither the driver's objects nor the group controller (a Helm install brings them)."""
    controllers = [] if controllers is None else controllers
    if runtime == "containerd":
        images = ensure_images()  # built by `cluster up` before it started us
        runtime_binaries = build_containerd()
        # The metrics port is on for a Prometheus, and with NetworkPolicy enforced: the policy's scrape rule
        # then has a port to admit (docs/network-policy.md).
        options = daemonset_options(driver_name, images.driver.reference, catalog_file,
                                    METRICS_PORT if prometheus or network_policy else 0, binaries.minor,
                                    core_partitions)
        enforcer = None
        if network_policy:
            enforcer = build_kube_router()  # built by `cluster up` before it started us
            apply_all(admin, netpol.rbac_manifests())
        apply_all(admin, [*(deploy.manifests(options) if driver else []), efa_device_class()])
        if driver:
            start_group_controller(controllers, cluster_dir, nodes, admin, cp, driver_name, options.namespace,
                                   deadline)
        agents += [ContainerdNodeAgent(cluster_dir, node, i, admin, cp, binaries, runtime_binaries, images,
                                       deadline, catalog_file, ports, enforcer)
                   for i, node in enumerate(nodes, 1)]
        start_all(agents)
        if driver:
            wait_driver_ready(admin, options, [n.name for n in nodes], timeout=180.0)
        write_references(images, cluster_dir / "images.json")
        return expose_drivers(admin, options, agents, ports, deadline - time.time()) if prometheus else []
    fakecri = build_fakecri()
    objects, identity = driver_objects(driver_name, binaries.minor, core_partitions)
    apply_all(admin, objects)
    start_group_controller(controllers, cluster_dir, nodes, admin, cp, driver_name, identity.namespace, deadline)
    agents += [NodeAgent(cluster_dir, node, admin, cp, identity, driver_name, binaries, fakecri, deadline,
                         catalog_file, ports, ports.take() if prometheus else 0, core_partitions) for node in nodes]
    start_all(agents)
    return [ScrapeTarget(a.node.name, f"127.0.0.1:{a.metrics_port}") for a in agents if a.metrics_port]


def run(cluster_dir: Path, nodes: list[NodeSpec], ttl: float, driver_name: str,
        kubernetes_version: str = DEFAULT_MINOR, catalog_file: Path | None = None, runtime: str = "fake",
        profile: str = DEFAULT_PROFILE, prometheus: bool = False, network_policy: bool = False,
        driver: bool = True, core_partitions: str = LOCAL_CORE_PARTITIONS) -> int:
    stop = threading.Event()
    set_on_signals(stop)
    procs.write_pid_file(cluster_dir / PID_FILE, procs.ref_of(os.getpid()))
    agents: list[Any] = []  # NodeAgent or ContainerdNodeAgent
    controllers: list[LocalGroupController] = []
    cp: ControlPlane | None = None
    scraper: LocalPrometheus | None = None
    deadline = time.time() + ttl
    try:
        write_status(cluster_dir, state="starting")
        kubelet.require_root(os.geteuid())
        binaries = ensure_binaries(kubernetes_version)  # cached by `cluster up` before it started us
        # With containerd the API server reaches the kubelets through forwarders on the host (kubeletaccess.py).
        kubelet_hosts = [n.name for n in nodes] if runtime == "containerd" else []
        cp = ControlPlane.start(cluster_dir / "controlplane", binaries=binaries, max_lifetime_s=ttl + 60,
                                kubelet_hosts=kubelet_hosts, profile=profile)
        admin = config.new_client_from_config(str(cp.kubeconfig))
        ports = kubelet.PortAllocator()  # one for all nodes: no port is given twice
        targets = start_nodes(agents, cluster_dir, nodes, admin, cp, binaries, ports, deadline, driver_name=driver_name,
                              catalog_file=catalog_file, runtime=runtime, prometheus=prometheus,
                              network_policy=network_policy, controllers=controllers, driver=driver,
                              core_partitions=core_partitions)
        if prometheus:
            # A neuron-monitor stand-in per node (nodes/neuron_monitor_emulator.py): the utilisation panels' source.
            exporters = []
            for node in nodes:
                port = ports.take()
                neuron_monitor_emulator.start(NodePaths.of(cluster_dir, node.name), node, port,
                                              deadline - time.time())
                exporters.append(ScrapeTarget(node.name, f"127.0.0.1:{port}"))
            scraper = LocalPrometheus(cluster_dir / "prometheus", build_prometheus(), ports.take())
            scraper.start(targets, deadline - time.time(), exporters)
        # Pods are refused until kube-controller-manager has made a namespace's `default` service account:
        # ready means a user's first `kubectl apply` of a pod into `default` works.
        wait_for_service_account(admin, "default", "default", timeout=120.0)
        (cluster_dir / "kubeconfig").write_text(Path(cp.kubeconfig).read_text())
        write_status(cluster_dir, state="ready", kubeconfig=str(cluster_dir / "kubeconfig"),
                     nodes=[{"name": n.name, "instanceType": n.instance_type,
                             **({"ultraserver": n.ultraserver, "ultraserverNode": n.ultraserver_node}
                                if n.ultraserver else {})} for n in nodes],
                     driverName=driver_name, deadline=deadline, kubernetesVersion=binaries.kube_version,
                     runtime=runtime, networkPolicy=network_policy,
                     **({"prometheus": scraper.url} if scraper is not None else {}))
        log.info("local cluster ready: Kubernetes %s, %d nodes", binaries.kube_version, len(nodes))
        stop.wait(ttl)
        return 0
    except Exception as e:
        log.exception("local cluster failed")
        write_status(cluster_dir, state="failed", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        stop_cluster(cluster_dir, agents, scraper, cp, controllers)


def stop_cluster(cluster_dir: Path, agents: list[Any], scraper: LocalPrometheus | None,
                 cp: ControlPlane | None, controllers: list[LocalGroupController] | None = None) -> None:
    """The group controller (nodes going away must not look like members leaving), the nodes, Prometheus,
    whatever a node left running, the control plane; the status says stopped unless the start failed."""
    for controller in controllers or ():
        try:
            controller.stop()
        except Exception:
            log.exception("stopping the UltraServer group controller")
    stoppers = [threading.Thread(target=agent.stop, name=f"stop-{agent.node.name}") for agent in agents]
    for t in stoppers:  # nodes stop independently, as real nodes would
        t.start()
    for t in stoppers:
        t.join(timeout=60)
    if scraper is not None:
        scraper.stop()
    procs.stop_all(cluster_dir / "nodes")  # anything a node agent could not stop (it logged why)
    procs.stop_all(cluster_dir / "ultraserver")
    if cp is not None:
        cp.stop()
    shutil.rmtree(runtime_dir(cluster_dir), ignore_errors=True)
    if (cluster_dir / STATUS_FILE).exists():
        status = json.loads((cluster_dir / STATUS_FILE).read_text())
        if status.get("state") != "failed":
            write_status(cluster_dir, state="stopped")
    (cluster_dir / PID_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-dra-localcluster-supervisor")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL_S)
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME)
    parser.add_argument("--kubernetes-version", default=DEFAULT_MINOR)
    parser.add_argument("--catalog", type=Path, default=None)
    parser.add_argument("--runtime", choices=RUNTIMES, default="fake")
    parser.add_argument("--prometheus", action="store_true")
    parser.add_argument("--network-policy", action="store_true")
    parser.add_argument("--profile", choices=list(PROFILES), default=DEFAULT_PROFILE)
    parser.add_argument("--no-driver", dest="driver", action="store_false")
    parser.add_argument("--core-partitions", choices=CORE_PARTITION_CHOICES, default=LOCAL_CORE_PARTITIONS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    catalog = load_catalog(args.catalog) if args.catalog else BUILTIN
    return run(args.dir.resolve(), parse_nodes(args.node, catalog), args.ttl, args.driver_name,
               args.kubernetes_version, args.catalog.resolve() if args.catalog else None, args.runtime, args.profile,
               args.prometheus, args.network_policy, args.driver, args.core_partitions)


if __name__ == "__main__":
    sys.exit(main())
