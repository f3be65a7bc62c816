"""The real kubelet as an emulated node's agent: its configuration, its identity, and how it is run isolated.

A stock kubelet writes outside its root directory (the device-plugin socket, /var/log/containers, the volume
plugin dir, six sysctls). Each kubelet therefore runs under `unshare --mount --propagation private`, where a
shell prologue bind-mounts the node's `var-lib` and `var-log` over /var/lib and /var/log and files with the
values kubelet wants over those /proc/sys entries, then execs kubelet with a short `--root-dir` (socket paths
are limited to 107 bytes), a non-loopback `--node-ip` and the Node's EKS labels. docs/real-kubelet.md has the
list and the reasons.
"""

from __future__ import annotations

import contextlib
import random
import shlex
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.controlplane.pki import CertPair
from neuron_dra.localcluster.processes import procs

# What kubelet's container manager wants in these sysctls (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables; values from k8s.io/component-helpers/node/util/sysctl); docs/real-kubelet.md.
KUBELET_SYSCTLS: Mapping[str, int] = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# Host directories a stock kubelet writes to whatever its flags say; shadowed inside its mount namespace.
SHADOWED_DIRS = ("/var/lib", "/var/log")


class KubeletError(RuntimeError):
    """The kubelet of an emulated node cannot be configured or started; the message says why."""


@dataclass(frozen=True)
class KubeletPaths:
    """Where one node's kubelet keeps its state. `root` must be short (it holds the plugin sockets)."""

    base: Path  # DIR/nodes/NAME
    root: Path  # --root-dir: plugins/, plugins_registry/, pods/, checkpoints

    config = Under("base", "kubelet-config.yaml")
    kubeconfig = Under("base", "kubelet.kubeconfig")
    cert_dir = Under("base", "kubelet-pki")
    log = Under("base", "kubelet.log")
    pid_file = Under("base", "pids", "kubelet.pid")
    var_lib = Under("base", "var-lib")
    var_log = Under("base", "var-log")
    pod_logs = Under("base", "pod-logs")
    volume_plugins = Under("base", "volume-plugins")
    sysctls = Under("base", "sysctl")
    registry_dir = Under("root", "plugins_registry")
    plugins_dir = Under("root", "plugins")
    cri_socket = Under("root", "cri.sock")


@dataclass(frozen=True)
class KubeletSpec:
    """Everything that decides one node's kubelet, besides the binary."""

    node_name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    provider_id: str
    node_ip: str
    client_ca: Path  # the control plane's CA: verifies clients of kubelet's own API
    port: int
    healthz_port: int
    minor: int  # Kubernetes minor of the kubelet binary (1.35+ needs failCgroupV1: false here)
    # With a real runtime: the cgroup (cgroupfs name) every pod goes under, one per node, so that what the
    # containers create in the host's cgroup v1 hierarchies can be found and removed (containerd.remove_cgroups).
    cgroup_root: str | None = None
    # The API server reaches this kubelet (`kubectl logs/exec`): kubelet serves this certificate, signed by the
    # control plane's CA, and authenticates and authorizes its clients as a real node does.
    serving_cert: CertPair | None = None


def node_ip() -> str:
    """A non-loopback IPv4 address of this machine (kubelet refuses loopback for --node-ip).

    Read from `ip -4 -o addr show scope global`; if that is not available, the source address the kernel
    would use for a route (a UDP `connect`, which sends no packet)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                             text=True, timeout=5, check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                return parts[parts.index("inet") + 1].split("/")[0]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the routing decision is used
        address = str(s.getsockname()[0])
        if not address.startswith("127."):
            return address
    raise KubeletError("this machine has no non-loopback IPv4 address; kubelet needs one for --node-ip "
                       "(it refuses 127.0.0.1 and would otherwise look its node name up in DNS)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for ports of outgoing connections (32768-60999 by default)."""
    try:
        low, high = (int(p) for p in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


class PortAllocator:
    """Loopback TCP ports for the kubelets' servers, each handed out once.

    A port the kernel picked with bind(0) is an ephemeral one: between closing the probe socket and kubelet's
    own bind, an outgoing connection of any process on the machine may take it (seen with four nodes starting
    side by side: "listen tcp 127.0.0.1:50505: bind: address already in use"). Ports below the ephemeral range
    are never given to outgoing connections, and this allocator never gives one port twice.
    """

    def __init__(self, low: int = 20000, high: int | None = None, seed: int | None = None) -> None:
        self.low = low
        self.high = (ephemeral_range()[0] - 1) if high is None else high
        if not 1024 <= self.low < self.high:
            raise KubeletError(f"no port range below the ephemeral range {ephemeral_range()} to allocate from")
        self._given: set[int] = set()
        self._lock = threading.Lock()
        self._random = random.Random(seed)

    def take(self) -> int:
        with self._lock:
            for _ in range(1000):
                port = self._random.randint(self.low, self.high)
                if port in self._given:
                    continue
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    try:
                        s.bind(("127.0.0.1", port))
                    except OSError:
                        continue
                self._given.add(port)
                return port
        raise KubeletError(f"no free loopback port in {self.low}-{self.high}")


def kubelet_config(spec: KubeletSpec, paths: KubeletPaths) -> dict[str, Any]:
    """The KubeletConfiguration (v1beta1) of an emulated node. Settings that differ from a real node's and why:
    docs/real-kubelet.md."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # kubelet's API on loopback only (of the node's network namespace with a real runtime, where the API
        # server reaches it through a forwarder, nodens.py); nothing dials the node IP.
        "address": "127.0.0.1",
        "port": spec.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": spec.healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(spec.client_ca)}},
        "authorization": {"mode": "AlwaysAllow"},  # loopback only, and anonymous is off
        "containerRuntimeEndpoint": f"unix://{paths.cri_socket}",
        "imageServiceEndpoint": f"unix://{paths.cri_socket}",
        "cgroupDriver": "cgroupfs",
        # No containers run: no QoS cgroup tree, no node-allocatable enforcement (both write cgroups).
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "protectKernelDefaults": False,  # the sysctls it would set are shadowed in its namespace
        "podLogsDir": str(paths.pod_logs),
        "registerWithTaints": [dict(t) for t in spec.taints],
        "providerID": spec.provider_id,
        # A shared disk and memory must not make the emulated node evict pods or report pressure.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "",
        "serializeImagePulls": False,
        "rotateCertificates": False,
    }
    if spec.serving_cert is not None:
        # kubelet's API as on a real cluster (kubeadm's defaults): a client certificate from the control plane's CA
        # or a bearer token the API server confirms (TokenReview) authenticates, nobody else; each request is
        # authorized by a SubjectAccessReview (Webhook), so the API server's own client certificate needs RBAC on
        # the `nodes/*` subresources. kubelet serves a certificate the API server verifies
        # (`--kubelet-certificate-authority`). Reference: kubernetes.io/docs/reference/access-authn-authz/
        # kubelet-authn-authz/.
        config["authentication"]["webhook"]["enabled"] = True
        config.update(authorization={"mode": "Webhook"}, tlsCertFile=str(spec.serving_cert.cert),
                      tlsPrivateKeyFile=str(spec.serving_cert.key))
    if spec.cgroup_root is not None:
        # Real containers: kubelet's QoS tree under the node's own cgroup (created beforehand in every hierarchy,
        # containerd.create_cgroups), so every container's cgroup is below it; without cgroupsPerQOS containerd
        # puts them under the shared /k8s.io.
        config["cgroupRoot"] = spec.cgroup_root
        config["cgroupsPerQOS"] = True
    if spec.minor >= 35:
        # 1.35+ refuses to start on cgroup v1 unless told otherwise; these machines mount cgroup v1.
        config["failCgroupV1"] = False
    return config


def kubelet_argv(binary: Path, spec: KubeletSpec, paths: KubeletPaths, verbosity: int = 3) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(spec.labels.items()))
    # --v=3: kubelet logs "Registered DRA plugin ... chosenService" and its ResourceSlice wipes at that level.
    return [str(binary), f"--config={paths.config}", f"--kubeconfig={paths.kubeconfig}",
            f"--root-dir={paths.root}", f"--cert-dir={paths.cert_dir}", f"--hostname-override={spec.node_name}",
            f"--node-ip={spec.node_ip}", f"--volume-plugin-dir={paths.volume_plugins}", f"--node-labels={labels}",
            f"--v={verbosity}"]


def namespace_prologue(paths: KubeletPaths) -> str:
    """Shell commands run inside the kubelet's mount namespace before it execs kubelet."""
    lines = ["set -eu"]
    for host_dir, own in zip(SHADOWED_DIRS, (paths.var_lib, paths.var_log), strict=True):
        lines.append(f"mount --bind {shlex.quote(str(own))} {host_dir}")
    for name in KUBELET_SYSCTLS:
        lines.append(f"mount --bind {shlex.quote(str(paths.sysctls / name.replace('/', '.')))} /proc/sys/{name}")
    return "\n".join(lines)


def prepare(spec: KubeletSpec, paths: KubeletPaths, write_kubeconfig: Any) -> None:
    """Write the kubelet's directories, configuration and node kubeconfig (via `write_kubeconfig(user, groups,
    path)`: a client certificate for `system:node:<node>` in group `system:nodes`)."""
    for shadowed in SHADOWED_DIRS:
        if paths.base.resolve().is_relative_to(shadowed) or paths.root.resolve().is_relative_to(shadowed):
            raise KubeletError(f"the cluster directory {paths.base} is under {shadowed}, which the kubelet's mount "
                               f"namespace shadows; choose a --dir outside {', '.join(SHADOWED_DIRS)}")
    for d in (paths.base, paths.root, paths.cert_dir, paths.var_lib / "kubelet" / "device-plugins",
              paths.var_log / "containers", paths.pod_logs, paths.volume_plugins, paths.sysctls,
              paths.registry_dir, paths.plugins_dir, paths.pid_file.parent):
        d.mkdir(parents=True, exist_ok=True)
    for name, value in KUBELET_SYSCTLS.items():
        (paths.sysctls / name.replace("/", ".")).write_text(f"{value}\n")
    paths.config.write_text(yaml.safe_dump(kubelet_config(spec, paths), sort_keys=False))
    write_kubeconfig(f"system:node:{spec.node_name}", ["system:nodes"], paths.kubeconfig)


def launch_argv(binary: Path, spec: KubeletSpec, paths: KubeletPaths) -> list[str]:
    """`unshare` + prologue + `exec kubelet ...`: the whole command line of one node's kubelet."""
    script = namespace_prologue(paths) + "\nexec " + shlex.join(kubelet_argv(binary, spec, paths))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def start(binary: Path, spec: KubeletSpec, paths: KubeletPaths, lifetime_s: float,
          enter: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start the kubelet (config written by `prepare`); its pid file is `paths.pid_file`. With `enter` (the
    nsenter prefix of a node whose namespaces are already set up, nodens.py) it joins those instead of making
    its own mount namespace."""
    argv = [*enter, *kubelet_argv(binary, spec, paths)] if enter is not None else launch_argv(binary, spec, paths)
    return procs.spawn(argv, log=paths.log, pid_file=paths.pid_file, lifetime_s=lifetime_s, cwd=paths.base)


def healthy(healthz_port: int) -> bool:
    """kubelet's /healthz (on loopback, `healthzPort` of its configuration) answers ok."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{healthz_port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def labels_and_taints(manifest: Mapping[str, Any]) -> tuple[dict[str, str], tuple[dict[str, str], ...], str]:
    """The labels, taints and providerID of a Node manifest (nodes.node_manifest), as kubelet flags take them."""
    labels = dict(manifest["metadata"]["labels"])
    taints = tuple(dict(t) for t in manifest["spec"].get("taints") or ())
    return labels, taints, str(manifest["spec"].get("providerID", ""))


def require_root(euid: int) -> None:
    if euid != 0:
        raise KubeletError("the local cluster runs real kubelets, which need root: each runs in its own mount "
                           "namespace (unshare --mount) so that it writes nothing outside the cluster directory")



NODE_READY_TIMEOUT_S = 90.0


def wait_node_ready(api: Any, node_name: str, kubelet_log: Path, timeout_s: float = NODE_READY_TIMEOUT_S) -> str:
    """Wait until the kubelet registered its Node and reports it Ready; the Node's uid. KubeletError with the
    end of the kubelet's log when that takes longer than `timeout_s`."""
    core = client.CoreV1Api(api)
    uid: list[str] = []

    def ready() -> bool:
        try:
            node: Any = core.read_node(node_name)
        except client.exceptions.ApiException as e:
            if e.status != 404:
                raise
            return False
        conditions = node.status.conditions or [] if node.status is not None else []
        uid[:] = [str(node.metadata.uid)]
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    if procs.wait_for(ready, timeout_s):
        return uid[0]
    tail = "\n".join(kubelet_log.read_text(errors="replace").splitlines()[-30:]) if kubelet_log.exists() else ""
    raise KubeletError(f"the kubelet of {node_name} did not report the Node Ready within {timeout_s:.0f} s; "
                       f"{kubelet_log} ends:\n{tail}")
