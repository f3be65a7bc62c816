"""`cluster up` / `cluster down`: start the supervisor detached, wait until it is ready; stop it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.catalog_file import load_catalog
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster.build import (
    DEFAULT_MINOR,
    build_containerd,
    build_fakecri,
    build_kube_router,
    check_minor,
    ensure_binaries,
)
from neuron_dra.localcluster.controlplane.profiles import DEFAULT_PROFILE, PROFILES
from neuron_dra.localcluster.controlplane.prometheus_build import build_prometheus
from neuron_dra.localcluster.nodes.images import ensure_images
from neuron_dra.localcluster.nodes.kubelet import KubeletError, require_root
from neuron_dra.localcluster.nodes.netpol import NetworkPolicyError, require_tools
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec, parse_nodes, runtime_dir
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.supervisor import (
    CORE_PARTITION_CHOICES,
    DEFAULT_TTL_S,
    LOCAL_CORE_PARTITIONS,
    LOG_FILE,
    PID_FILE,
    RUNTIMES,
    STATUS_FILE,
)

# Real containers by default; `fake` for fast tests of the driver (docs/real-runtime.md).
DEFAULT_RUNTIME = "containerd"


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalCluster:
    dir: Path
    kubeconfig: Path
    nodes: tuple[NodeSpec, ...]
    driver_name: str
    prometheus: str | None = None  # the local Prometheus's URL (`up(prometheus=True)`)

    def node_paths(self, node: str) -> NodePaths:
        return NodePaths.of(self.dir, node)

    def down(self, timeout: float = 60.0) -> None:
        down(self.dir, timeout)


def read_status(cluster_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((cluster_dir / STATUS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data


def build_all(minor: str, runtime: str, *, prometheus: bool = False, network_policy: bool = False,
              log: Callable[[str], None] = lambda _m: None) -> None:
    """Every binary and image a cluster of `runtime` runs, built once from the Go module proxy (then cached)."""
    ensure_binaries(minor, log=log)
    if runtime == "containerd":
        build_containerd(log=log)
        ensure_images(log=log)
    else:
        build_fakecri(log=log)
    if prometheus:
        build_prometheus(log=log)
    if network_policy:
        try:
            require_tools()
        except NetworkPolicyError as e:
            raise ClusterError(str(e)) from e
        build_kube_router(log=log)


def up(cluster_dir: Path, node_args: Sequence[str], *, ttl: float = DEFAULT_TTL_S,
       driver_name: str = DEFAULT_DRIVER_NAME, kubernetes_version: str = DEFAULT_MINOR, timeout: float = 300.0,
       log: Callable[[str], None] = lambda _m: None, catalog_file: Path | None = None,
       runtime: str = DEFAULT_RUNTIME, profile: str = DEFAULT_PROFILE, prometheus: bool = False,
       network_policy: bool = False, driver: bool = True,
       core_partitions: str = LOCAL_CORE_PARTITIONS) -> LocalCluster:
    """Start a local cluster in `cluster_dir` on Kubernetes `kubernetes_version` (a minor such as "1.36") and
    return when every node's kubelet reports Ready and its driver runs. `catalog_file` adds instance types
    (docs/catalog-file.md) for the nodes, their emulated hosts and their drivers. `runtime` is `containerd`
    (real containers; the driver runs as the DaemonSet from its image) or `fake` (the fake CRI runtime; the
    driver runs as a host process). `profile` names the control plane's rate limits (controlplane/profiles.py).
    `prometheus`: a Prometheus scraping every node's driver (controlplane/prometheus.py; its URL is
    `LocalCluster.prometheus`). `network_policy`: NetworkPolicy enforced on every node by kube-router's policy
    controller inside the node's network namespace (containerd only; localcluster/nodes/netpol.py). `driver`
    False: containerd nodes with the driver's image imported but no driver installed, for installing it another
    way (its Helm chart: docs/helm.md); ready when the nodes are. `core_partitions`: the drivers publish
    NeuronCores (counters) where the minor serves them (`on`), or whole devices only (`off`, as EKS 1.34-1.36 by
    default)."""
    catalog = load_catalog(catalog_file) if catalog_file else BUILTIN  # a bad file fails here, before any build
    nodes = parse_nodes(list(node_args), catalog)
    if not nodes:
        raise ClusterError("give at least one --node TYPE[:COUNT]")
    minor = check_minor(kubernetes_version)
    if profile not in PROFILES:
        raise ClusterError(f"--profile {profile!r} is not known; choose one of {', '.join(PROFILES)}")
    if runtime not in RUNTIMES:
        raise ClusterError(f"--runtime {runtime!r} is not supported; choose one of {', '.join(RUNTIMES)}")
    if core_partitions not in CORE_PARTITION_CHOICES:
        raise ClusterError(f"core_partitions {core_partitions!r} is not allowed; allowed: "
                           f"{', '.join(CORE_PARTITION_CHOICES)}")
    if network_policy and runtime != "containerd":
        raise ClusterError(f"--network-policy needs --runtime containerd (pods with network namespaces), not "
                           f"{runtime!r}")
    if not driver and (runtime != "containerd" or prometheus):
        raise ClusterError("--no-driver needs --runtime containerd (the driver then comes as a DaemonSet) and no "
                           "--prometheus (it scrapes the driver the cluster installs)")
    try:
        require_root(os.geteuid())
    except KubeletError as e:
        raise ClusterError(str(e)) from e
    cluster_dir = cluster_dir.resolve()
    pid_file = cluster_dir / PID_FILE
    running = procs.running(pid_file)
    if running is not None:
        raise ClusterError(f"a local cluster is already running in {cluster_dir} (pid {running.pid}); "
                           "run `neuron-dra cluster down --dir` first")
    cluster_dir.mkdir(parents=True, exist_ok=True)
    (cluster_dir / STATUS_FILE).unlink(missing_ok=True)
    (cluster_dir / "images.json").unlink(missing_ok=True)
    build_all(minor, runtime, prometheus=prometheus, network_policy=network_policy, log=log)
    argv = [sys.executable, "-m", "neuron_dra.localcluster.supervisor", "--dir", str(cluster_dir), "--ttl", str(ttl),
            "--driver-name", driver_name, "--kubernetes-version", minor, "--runtime", runtime, "--profile", profile,
            "--core-partitions", core_partitions]
    for arg in node_args:
        argv += ["--node", arg]
    if catalog_file:
        argv += ["--catalog", str(Path(catalog_file).resolve())]
    if prometheus:
        argv.append("--prometheus")
    if network_policy:
        argv.append("--network-policy")
    if not driver:
        argv.append("--no-driver")
    with (cluster_dir / LOG_FILE).open("ab") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    # We are its parent: reap it when it exits, or it lingers as a zombie for as long as this process runs.
    threading.Thread(target=proc.wait, name="reap-supervisor", daemon=True).start()
    status: dict[str, Any] = {}

    def ready() -> bool:
        status.update(read_status(cluster_dir))
        if status.get("state") == "failed" or (status.get("state") != "ready" and proc.poll() is not None):
            raise ClusterError(f"local cluster failed to start: {status.get('error', 'supervisor exited')}\n"
                               f"{procs.log_tail(cluster_dir / LOG_FILE, 3000)}")
        return status.get("state") == "ready"

    if procs.wait_for(ready, timeout, 0.3):
        return LocalCluster(cluster_dir, Path(status["kubeconfig"]), tuple(nodes), driver_name,
                            status.get("prometheus"))
    down(cluster_dir)
    raise ClusterError(f"local cluster not ready after {timeout:.0f} s; see {cluster_dir / LOG_FILE}")


def down(cluster_dir: Path, timeout: float = 60.0) -> bool:
    """Stop the supervisor (which stops everything it started); True when something was running.

    If the supervisor does not exit in `timeout` (or was killed), every process recorded under the cluster
    directory is stopped through its pid file (procs.stop_all), and the socket directory removed."""
    cluster_dir = cluster_dir.resolve()
    pid_file = cluster_dir / PID_FILE
    ref = procs.running(pid_file)
    if ref is not None:
        procs.stop(ref, grace_s=timeout)
    leftovers = (procs.stop_all(cluster_dir / "ultraserver") + procs.stop_all(cluster_dir / "nodes")
                 + procs.stop_all(cluster_dir / "controlplane") + procs.stop_all(cluster_dir / "prometheus"))
    if ref is not None or leftovers:
        shutil.rmtree(runtime_dir(cluster_dir), ignore_errors=True)
    pid_file.unlink(missing_ok=True)
    return ref is not None or bool(leftovers)
