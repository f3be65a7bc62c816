"""The local cluster's supervisor: one process that owns the control plane and every emulated node.

`neuron-dra cluster up` starts it detached and waits until it reports ready; `cluster down` stops it.
It stops by itself after `--ttl` seconds, so nothing outlives a forgotten cluster. Per node it
runs what a real Neuron node runs: the driver daemon (restarted when it exits, as kubelet restarts a
DaemonSet container) under its own service-account identity bound to a driver pod on that node,
the kubelet stand-in, a heartbeat that keeps the Node Ready, and an emulated EFA driver.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from neuron_dra.driver.discovery import discover
from neuron_dra.driver.emulate import EmulationOptions, emulate
from neuron_dra.driver.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster.apply import apply_all
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.controlplane import BoundObject, ControlPlane
from neuron_dra.localcluster.efa_emulator import EmulatedEfaDriver, efa_device_class
from neuron_dra.localcluster.kubelet_standin import KubeletStandin, StandinConfig
from neuron_dra.localcluster.nodes import NodeHeartbeat, node_manifest
from neuron_dra.localcluster.topology import NodePaths, NodeSpec, parse_nodes, runtime_dir

log = logging.getLogger("neuron_dra.localcluster.supervisor")
DEFAULT_TTL_S = 2 * 3600
STATUS_FILE = "status.json"
PID_FILE = "supervisor.pid"
LOG_FILE = "supervisor.log"


@dataclass(frozen=True)
class DriverIdentity:
    namespace: str
    service_account: str
    pod_name: str


def write_status(cluster_dir: Path, **status: Any) -> None:
    tmp = cluster_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(status, indent=1), encoding="utf-8")
    tmp.replace(cluster_dir / STATUS_FILE)


class DriverProcess:
    """The driver daemon of one node as a child process, restarted with backoff when it exits."""

    def __init__(self, argv: list[str], paths: NodePaths, env: Mapping[str, str]) -> None:
        self.argv = argv
        self.paths = paths
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"driver-{paths.base.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        logf = self.paths.driver_log.open("ab")
        proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env)
        logf.close()
        self.paths.driver_pid.write_text(str(proc.pid))
        return proc

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            started = time.monotonic()
            self.proc = self._spawn()
            code = self.proc.wait()
            if self._stop.is_set():
                return
            self.restarts += 1
            log.warning("driver on %s exited with %s; restarting", self.paths.base.name, code)
            backoff = 0.5 if time.monotonic() - started > 30 else min(backoff * 2, 10.0)
            self._stop.wait(backoff)

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(timeout=15)


class NodeAgent:
    """Everything that runs for one emulated node."""

    def __init__(self, cluster_dir: Path, node: NodeSpec, api: client.ApiClient, control_plane: ControlPlane,
                 identity: DriverIdentity, driver_name: str, plugin_connector: Any) -> None:
        self.node = node
        self.paths = NodePaths.of(cluster_dir, node.name)
        self.api = api
        self.control_plane = control_plane
        self.identity = identity
        self.driver_name = driver_name
        self.connector = plugin_connector
        self.heartbeat = NodeHeartbeat(api, node.name, node.instance_type)
        self.standin: KubeletStandin | None = None
        self.driver: DriverProcess | None = None
        self.efa: EmulatedEfaDriver | None = None

    def start(self) -> None:
        p = self.paths
        for d in (p.plugins_dir, p.registry_dir, p.cdi_root, p.pods_dir):
            d.mkdir(parents=True, exist_ok=True)
        kubelet_link = p.base / "kubelet"
        if not kubelet_link.exists():
            kubelet_link.symlink_to(p.runtime)  # find the sockets from the node's directory
        if not p.host_root.exists():
            emulate(self.node.instance_type, p.host_root, EmulationOptions(host_id=self.node.name))
        host = discover(p.host_root)
        net = (f"nn-{self.node.name[:4]}-l1", f"nn-{self.node.name[:4]}-l2", f"nn-{self.node.name}-l3")
        node_uid = self.heartbeat.create_node(node_manifest(self.node.name, self.node.instance_type,
                                                            network_nodes=net))["uid"]
        self.heartbeat.start()
        self.standin = KubeletStandin(
            StandinConfig(self.node.name, p.registry_dir, p.cdi_root, p.pods_dir), self.api, self.connector)
        self.standin.start()  # wipes this node's slices first, as kubelet does at start
        self._write_driver_kubeconfig()
        argv = [sys.executable, "-m", "neuron_dra.driver", "--node-name", self.node.name,
                "--driver-name", self.driver_name, "--plugins-dir", str(p.plugins_dir),
                "--registry-dir", str(p.registry_dir), "--cdi-root", str(p.cdi_root),
                "--healthcheck-port", "0", "--metrics-port", "0", "--kubeconfig", str(p.driver_kubeconfig),
                "--host-root", str(p.host_root)]
        self.driver = DriverProcess(argv, p, os.environ)
        self.driver.start()
        self.efa = EmulatedEfaDriver(self.api, self.node.name, host, p.plugins_dir, p.registry_dir, node_uid)
        self.efa.start()

    def _write_driver_kubeconfig(self) -> None:
        """A token bound to a driver pod on this node: the API server adds the node name to the identity, which
        the node-restricting admission policy checks."""
        core = client.CoreV1Api(self.api)
        ident = self.identity
        pod_name = f"{ident.pod_name}-{self.node.name}"
        pod: Any = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ident.namespace,
                         "labels": {"app.kubernetes.io/name": "neuron-dra-driver"}},
            "spec": {"nodeName": self.node.name, "serviceAccountName": ident.service_account,
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
        for part in (self.driver, self.efa, self.standin, self.heartbeat):
            if part is None:
                continue
            try:
                part.stop()
            except Exception:
                log.exception("stopping %s of %s", type(part).__name__, self.node.name)


def driver_objects(driver_name: str) -> tuple[list[dict[str, Any]], DriverIdentity]:
    """The same objects `neuron-dra plan -o yaml` prints for the driver, minus the DaemonSet (the supervisor
    runs the daemon itself), plus the EFA DeviceClass of the emulated EFA driver."""
    from neuron_dra.driver import deploy

    options = deploy.DriverDeployOptions(driver_name=driver_name)
    objects = [o for o in deploy.manifests(options) if o["kind"] != "DaemonSet"]
    identity = DriverIdentity(options.namespace, options.service_account, "neuron-dra-driver-kubelet-plugin")
    return [*objects, efa_device_class()], identity


def run(cluster_dir: Path, nodes: list[NodeSpec], ttl: float, driver_name: str,
        kubernetes_version: str = DEFAULT_MINOR) -> int:
    from neuron_dra.localcluster.pluginclient import StandinConnector

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    (cluster_dir / PID_FILE).write_text(str(os.getpid()))
    agents: list[NodeAgent] = []
    cp = None
    try:
        write_status(cluster_dir, state="starting")
        cp = ControlPlane.start(cluster_dir / "controlplane", kubernetes_version=kubernetes_version)
        admin = config.new_client_from_config(str(cp.kubeconfig))
        objects, identity = driver_objects(driver_name)
        apply_all(admin, objects)
        for node in nodes:
            agent = NodeAgent(cluster_dir, node, admin, cp, identity, driver_name, StandinConnector())
            agents.append(agent)
            agent.start()
        (cluster_dir / "kubeconfig").write_text(Path(cp.kubeconfig).read_text())
        write_status(cluster_dir, state="ready", kubeconfig=str(cluster_dir / "kubeconfig"),
                     nodes=[{"name": n.name, "instanceType": n.instance_type} for n in nodes],
                     driverName=driver_name, deadline=time.time() + ttl)
        log.info("local cluster ready: %d nodes", len(nodes))
        stop.wait(ttl)
        return 0
    except Exception as e:
        log.exception("local cluster failed")
        write_status(cluster_dir, state="failed", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        stoppers = [threading.Thread(target=agent.stop, name=f"stop-{agent.node.name}") for agent in agents]
        for t in stoppers:  # nodes stop independently, as real nodes would
            t.start()
        for t in stoppers:
            t.join(timeout=60)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return run(args.dir.resolve(), parse_nodes(args.node), args.ttl, args.driver_name, args.kubernetes_version)


if __name__ == "__main__":
    sys.exit(main())
