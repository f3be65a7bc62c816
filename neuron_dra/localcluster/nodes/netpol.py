"""A NetworkPolicy enforcer for the containerd nodes: kube-router's network policy controller, one per node, run
inside the node's mount and network namespaces (`cluster up --network-policy`).

Only kube-router's firewall runs (no router, service proxy, health or metrics servers). Its iptables rules and
ipsets belong to the node's network namespace and go with it; bridged pod traffic passes that namespace's
iptables, and the per-pod chains accept traffic from the node's own addresses (kubelet's probes), as
NetworkPolicy requires. The host's netfilter state is never touched (docs/network-policy.md).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.restarting import Restarting

USER = "neuron-dra:kube-router"  # the client certificate's user; RBAC below grants it what the controller reads
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"  # controlplane/plane.py's service range (SERVICE_IP 10.96.0.1)
ENFORCING_TIMEOUT_S = 60.0
# The chains kube-router's controller hooks into INPUT, FORWARD and OUTPUT once it has synced.
TOP_CHAINS = ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT")
TOOLS = ("iptables", "iptables-save", "iptables-restore", "ipset")


class NetworkPolicyError(RuntimeError):
    """The enforcer cannot run or did not start enforcing; the message names the step and its output."""


def rbac_manifests() -> list[dict[str, Any]]:
    """What kube-router's informers list and watch (pkg/cmd/kube-router.go starts every informer it registers:
    services, endpoints, endpointslices, pods, nodes, namespaces, networkpolicies), read-only."""
    name = "neuron-dra-kube-router"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [
             {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
              "verbs": ["get", "list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
             {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]},
    ]


def enforcer_argv(binary: Path, kubeconfig: Path, node: str) -> list[str]:
    return [str(binary), "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--run-loadbalancer=false", f"--kubeconfig={kubeconfig}", f"--hostname-override={node}",
            "--health-port=0", "--metrics-port=0", "--enable-ipv4=true", "--enable-ipv6=false",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}", "--v=1"]


def require_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise NetworkPolicyError(f"{', '.join(missing)} not on PATH; kube-router runs them inside the node's "
                                 "network namespace (apt-get install -y iptables ipset)")


@dataclass(frozen=True)
class EnforcerPaths:
    base: Path  # DIR/nodes/NAME/netpol

    log = Under("base", "kube-router.log")
    pid_file = Under("base", "kube-router.pid")
    kubeconfig = Under("base", "kube-router.kubeconfig")


class NetworkPolicyEnforcer:
    """kube-router's policy controller of one node, restarted when it exits (as its DaemonSet pod would be)."""

    def __init__(self, node: str, paths: EnforcerPaths, binary: Path, enter: Sequence[str],
                 enter_net: Sequence[str], deadline: float) -> None:
        self.node = node
        self.paths = paths
        self.binary = binary
        self.enter = list(enter)  # nsenter into the node's mount and network namespaces
        self.enter_net = list(enter_net)
        self.deadline = deadline
        self.process: Restarting | None = None

    def start(self) -> None:
        """Start the controller and return once its chains are hooked into the node's filter table."""
        require_tools()
        argv = [*self.enter, *enforcer_argv(self.binary, self.paths.kubeconfig, self.node)]
        self.process = Restarting(
            f"kube-router-{self.node}",
            lambda life: procs.spawn(argv, log=self.paths.log, pid_file=self.paths.pid_file, lifetime_s=life),
            self.paths.pid_file, self.deadline)
        self.process.start()
        self.wait_enforcing(ENFORCING_TIMEOUT_S)

    def filter_rules(self) -> str:
        """`iptables-save -t filter` of the node's network namespace."""
        proc = subprocess.run([*self.enter_net, "iptables-save", "-t", "filter"], capture_output=True, text=True,
                              timeout=30, check=False)
        if proc.returncode != 0:
            raise NetworkPolicyError(f"iptables-save in the namespace of {self.node} failed: {proc.stderr.strip()}")
        return proc.stdout

    def wait_enforcing(self, timeout: float) -> None:
        if not procs.wait_for(lambda: all(f"-j {chain}" in self.filter_rules() for chain in TOP_CHAINS), timeout, 0.5):
            raise NetworkPolicyError(f"kube-router on {self.node} did not hook {', '.join(TOP_CHAINS)} into the "
                                     f"node's filter table within {timeout:.0f} s; {self.paths.log} ends:\n"
                                     f"{procs.log_tail(self.paths.log)}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
