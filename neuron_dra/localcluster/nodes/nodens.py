"""The namespaces of one emulated node with a real container runtime: one mount and one network namespace that
its kubelet and containerd share, held open by a `sleep` process (the holder) and entered with `nsenter`.

The mount namespace carries kubelet's shadowed /var/lib, /var/log and sysctls (kubelet.namespace_prologue), the
node's own /run, kubelet's root over /var/lib/kubelet and the emulated host tree at HOST_TREE; the network
namespace a veth with the node IP and the `kubernetes` Service IP. socat forwarders over unix sockets join the
node and the host's loopback both ways (API server -> node, `NodeNamespace.forward` host -> node), so nothing
is created in the host's network namespace. Details and reasons: docs/real-runtime.md.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.localcluster import hostreqs
from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.nodes.kubelet import KubeletPaths, namespace_prologue
from neuron_dra.localcluster.processes import procs

HOST_TREE = "/run/neuron-dra-host"  # where the node's emulated sys/dev/opt tree appears inside its namespace
SERVICE_IP = "10.96.0.1"  # controlplane.SERVICE_IP: in the API server's certificate
HOLDER_TIMEOUT_S = 15.0
_FORWARD_NAME = re.compile(r"[A-Za-z0-9-]{1,20}")


class NodeNamespaceError(RuntimeError):
    """The namespaces of a node cannot be made; the message says which step failed and its output."""


@dataclass(frozen=True)
class NodeNetwork:
    """Addresses of node number `index` (1-based): unique per node so Node objects differ, never routed."""

    index: int

    @property
    def node_ip(self) -> str:
        return f"10.201.{self.index}.2"

    @property
    def pod_subnet(self) -> str:
        return f"10.202.{self.index}.0/24"


@dataclass(frozen=True)
class NodeNamespacePaths:
    base: Path  # DIR/nodes/NAME
    runtime: Path  # the node's short runtime directory (kubelet root)

    run_dir = Under("base", "run")
    holder_pid = Under("base", "pids", "netns-holder.pid")
    # Written by the holder itself: the pid to enter (the pid file above records its `timeout` leader).
    holder_own_pid = Under("base", "pids", "netns-holder.self")
    api_socket = Under("runtime", "api.sock")
    log = Under("base", "netns.log")


def holder_script(paths: NodeNamespacePaths, kubelet_paths: KubeletPaths, host_tree: Path) -> str:
    lines = [namespace_prologue(kubelet_paths)]
    q = shlex.quote
    lines += [
        f"mount --bind {q(str(kubelet_paths.root))} /var/lib/kubelet",
        f"mount --bind {q(str(paths.run_dir))} /run",
        f"mkdir -p {HOST_TREE}",
        f"mount --bind {q(str(host_tree))} {HOST_TREE}",
        f"echo $$ > {q(str(paths.holder_own_pid))}",
        "exec sleep infinity",
    ]
    return "\n".join(lines)


def network_script(net: NodeNetwork) -> str:
    return "\n".join([
        "set -eu",
        "ip link set lo up",
        "ip link add n0 type veth peer name n1",
        f"ip addr add {net.node_ip}/24 dev n0",
        "ip link set n1 up",
        "ip link set n0 up",
        f"ip addr add {SERVICE_IP}/32 dev lo",
    ])


class NodeNamespace:
    """The holder of one node's namespaces and the API forwarders; `enter` is the nsenter prefix."""

    def __init__(self, paths: NodeNamespacePaths, kubelet_paths: KubeletPaths, host_tree: Path, net: NodeNetwork,
                 api_port: int) -> None:
        self.paths = paths
        self.kubelet_paths = kubelet_paths
        self.host_tree = host_tree
        self.net = net
        self.api_port = api_port
        self.pid: int | None = None
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    @property
    def enter(self) -> list[str]:
        if self.pid is None:
            raise NodeNamespaceError("the node's namespaces are not set up yet")
        return ["nsenter", f"--target={self.pid}", "--mount", "--net", "--"]

    @property
    def enter_net(self) -> list[str]:
        if self.pid is None:
            raise NodeNamespaceError("the node's namespaces are not set up yet")
        return ["nsenter", f"--target={self.pid}", "--net", "--"]

    def start(self, lifetime_s: float) -> None:
        p = self.paths
        for d in (p.run_dir, p.holder_pid.parent, (self.kubelet_paths.var_lib / "kubelet")):
            d.mkdir(parents=True, exist_ok=True)
        p.holder_own_pid.unlink(missing_ok=True)
        script = holder_script(p, self.kubelet_paths, self.host_tree)
        argv = ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script]
        holder = procs.spawn(argv, log=p.log, pid_file=p.holder_pid, lifetime_s=lifetime_s)
        self._procs.append((holder, p.holder_pid))

        def holding() -> bool:
            if holder.poll() is not None:
                raise NodeNamespaceError(f"the namespace holder of {p.base.name} did not start: "
                                         f"{procs.log_tail(p.log, 1500)}")
            return p.holder_own_pid.exists() and bool(p.holder_own_pid.read_text().strip())

        if not procs.wait_for(holding, HOLDER_TIMEOUT_S, 0.05):
            raise NodeNamespaceError(f"the namespace holder of {p.base.name} did not start: "
                                     f"{procs.log_tail(p.log, 1500)}")
        self.pid = int(p.holder_own_pid.read_text())
        _run([*self.enter_net, "sh", "-c", network_script(self.net)], f"network of {p.base.name}")
        socat = hostreqs.require("socat", NodeNamespaceError)
        p.api_socket.unlink(missing_ok=True)
        self._spawn("api-forward-host", [socat, f"UNIX-LISTEN:{p.api_socket},fork",
                                         f"TCP:127.0.0.1:{self.api_port}"], lifetime_s)
        for name, listen in (("api-forward-service", f"TCP-LISTEN:443,bind={SERVICE_IP},fork,reuseaddr"),
                             ("api-forward-loopback", f"TCP-LISTEN:{self.api_port},bind=127.0.0.1,fork,reuseaddr")):
            self._spawn(name, [*self.enter_net, socat, listen, f"UNIX-CONNECT:{p.api_socket}"], lifetime_s)
        _wait_for(p.api_socket.exists, f"the API forwarder of {p.base.name} made no socket {p.api_socket}")

    def forward(self, name: str, host_port: int, node_port: int, lifetime_s: float, *,
                node_address: str = "127.0.0.1") -> Path:
        """Make `127.0.0.1:host_port` on the host reach `node_address:node_port` inside the node (a server the
        node's processes listen on); returns the unix socket between the two forwarders. `name` (letters,
        digits, `-`) names the forwarders' pid files and the socket. Returns once the host port accepts."""
        if not _FORWARD_NAME.fullmatch(name):
            raise NodeNamespaceError(f"forward name {name!r} is not allowed: use 1-20 letters, digits or '-'")
        for what, port in (("host_port", host_port), ("node_port", node_port)):
            if not 1 <= port <= 65535:
                raise NodeNamespaceError(f"forward {name}: {what} {port} is not a TCP port (1-65535)")
        socat = hostreqs.require("socat", NodeNamespaceError)
        sock = self.paths.runtime / f"fwd-{name}.sock"
        sock.unlink(missing_ok=True)
        self._spawn(f"forward-{name}-node", [*self.enter_net, socat, f"UNIX-LISTEN:{sock},fork",
                                             f"TCP:{node_address}:{node_port}"], lifetime_s)
        _wait_for(lambda: sock.exists(), f"the forwarder {name} of {self.paths.base.name} made no socket {sock}")
        self._spawn(f"forward-{name}-host", [socat, f"TCP-LISTEN:{host_port},bind=127.0.0.1,fork,reuseaddr",
                                             f"UNIX-CONNECT:{sock}"], lifetime_s)
        _wait_for(lambda: host_listening(host_port),
                  f"the forwarder {name} of {self.paths.base.name} does not listen on 127.0.0.1:{host_port} "
                  f"(taken by another process?); see {self.paths.log}")
        return sock

    def _spawn(self, name: str, argv: Sequence[str], lifetime_s: float) -> None:
        pid_file = self.paths.base / "pids" / f"{name}.pid"
        popen = procs.spawn(argv, log=self.paths.log, pid_file=pid_file, lifetime_s=lifetime_s)
        self._procs.append((popen, pid_file))

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the forwarders and the holder: the namespaces end when their last process has exited."""
        for popen, pid_file in reversed(self._procs):
            ref = procs.read_pid_file(pid_file)
            if ref is not None:
                procs.stop(ref, grace_s, popen=popen)
            pid_file.unlink(missing_ok=True)
        self._procs.clear()
        self.pid = None


def host_listening(port: int) -> bool:
    """Something listens on the host's 127.0.0.1:`port` (read from /proc/net/tcp: connecting would start a
    forwarded connection)."""
    wanted = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[1] == wanted and f[3] == "0A" for f in (line.split() for line in lines) if len(f) > 3)


def _wait_for(check: Callable[[], bool], error: str) -> None:
    if not procs.wait_for(check, HOLDER_TIMEOUT_S, 0.05):
        raise NodeNamespaceError(error)


def _run(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise NodeNamespaceError(f"{what} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()}")
