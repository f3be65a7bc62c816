"""One emulated node's containerd: its configuration (version 3), its CNI network, its images, its start.

containerd runs inside the node's namespaces (nodens.py), beside its kubelet, with every path of its own under
the node's directory. What differs from a stock containerd, and why (docs/real-runtime.md): a restricted
oom_score_adj, pod netns mounts under the state dir, no SELinux/AppArmor, cgroupfs, Debian's runc, no tracing
or NRI, a pinned pause image, and a bridge + host-local CNI network without masquerade.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from neuron_dra.driver.model.k8s_names import DEFAULT_CDI_ROOT
from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.hostreqs import CNI_BIN_DIR, RUNC
from neuron_dra.localcluster.processes import procs

CDI_SPEC_DIRS = ("/etc/cdi", DEFAULT_CDI_ROOT)  # as seen in the node's mount namespace (its own /run)
K8S_NAMESPACE = "k8s.io"  # containerd namespace of CRI's images and containers


class ContainerdError(RuntimeError):
    """A node's containerd cannot be configured, started or given its images; the message says why."""


@dataclass(frozen=True)
class ContainerdPaths:
    base: Path  # DIR/nodes/NAME/containerd: root, state, config, CNI config, log
    socket: Path  # short: under the node's runtime directory (unix socket paths are limited to 107 bytes)
    pid_file: Path

    root = Under("base", "root")
    state = Under("base", "state")
    config = Under("base", "config.toml")
    cni_conf_dir = Under("base", "cni")
    log = Under("base", "containerd.log")


def config(paths: ContainerdPaths, pause_image: str) -> dict[str, Any]:
    """containerd's configuration (version 3) for one node."""
    runc_options = {"BinaryName": str(RUNC), "SystemdCgroup": False}
    return {
        "version": 3,
        "root": str(paths.root),
        "state": str(paths.state),
        "grpc": {"address": str(paths.socket)},
        "ttrpc": {"address": f"{paths.socket}.ttrpc"},
        "disabled_plugins": ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
                             "io.containerd.nri.v1.nri"],
        "plugins": {
            "io.containerd.cri.v1.images": {
                "snapshotter": "overlayfs",
                "pinned_images": {"sandbox": pause_image},
            },
            "io.containerd.cri.v1.runtime": {
                "cdi_spec_dirs": list(CDI_SPEC_DIRS),
                "netns_mounts_under_state_dir": True,
                "enable_selinux": False,
                "disable_apparmor": True,
                "restrict_oom_score_adj": True,
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2", "options": runc_options}},
                },
                "cni": {"bin_dirs": [str(CNI_BIN_DIR)], "conf_dir": str(paths.cni_conf_dir), "max_conf_num": 1},
            },
        },
    }


def cni_config(subnet: str) -> dict[str, Any]:
    """The pod network of one node: a bridge in the node's network namespace, addresses from `subnet`."""
    return {
        "cniVersion": "1.0.0",
        "name": "neuron-dra-local",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"},
        ],
    }


def prepare(paths: ContainerdPaths, pause_image: str, pod_subnet: str) -> None:
    for d in (paths.root, paths.state, paths.cni_conf_dir, paths.pid_file.parent):
        d.mkdir(parents=True, exist_ok=True)
    for tool in (RUNC, CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local", CNI_BIN_DIR / "loopback"):
        if not tool.exists():
            raise ContainerdError(f"{tool} is missing: the containerd runtime needs Debian's runc and "
                                  "containernetworking-plugins (apt-get install -y runc containernetworking-plugins)")
    paths.config.write_bytes(tomli_w.dumps(config(paths, pause_image)).encode())
    (paths.cni_conf_dir / "10-neuron-dra.conflist").write_text(json.dumps(cni_config(pod_subnet), indent=1))


def start(binary: Path, paths: ContainerdPaths, enter: Sequence[str], lifetime_s: float) -> subprocess.Popen[bytes]:
    """containerd in the node's namespaces (`enter`: the nsenter prefix of nodens.NodeNamespace)."""
    env = {"PATH": f"{binary.parent}:/usr/sbin:/usr/bin:/sbin:/bin"}  # the shim is found next to containerd
    return procs.spawn([*enter, str(binary), "--config", str(paths.config)], log=paths.log,
                       pid_file=paths.pid_file, lifetime_s=lifetime_s, env=env)


def ctr(ctr_binary: Path, paths: ContainerdPaths, args: Sequence[str], timeout: float = 120.0) -> str:
    """`ctr -n k8s.io ARGS` against the node's containerd; its output, or a ContainerdError with it."""
    argv = [str(ctr_binary), "--address", str(paths.socket), "-n", K8S_NAMESPACE, *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise ContainerdError(f"`ctr {' '.join(args)}` gave no answer in {timeout:.0f} s") from e
    if proc.returncode != 0:
        raise ContainerdError(f"`ctr {' '.join(args)}` failed (exit {proc.returncode}): "
                              f"{(proc.stdout + proc.stderr).strip()[-1500:]}")
    return proc.stdout


def import_image(ctr_binary: Path, paths: ContainerdPaths, archive: Path, reference: str) -> None:
    """Import an OCI archive under `reference` unless the node has it already (same archive: same content)."""
    have = ctr(ctr_binary, paths, ["images", "list", "-q"]).split()
    if reference in have:
        return
    # The archive's index names the image (org.opencontainers.image.ref.name, a full reference: buildah push).
    ctr(ctr_binary, paths, ["images", "import", "--snapshotter", "overlayfs", str(archive)])
    if reference not in ctr(ctr_binary, paths, ["images", "list", "-q"]).split():
        raise ContainerdError(f"importing {archive} did not give the node the image {reference}")


CGROUP_MOUNT = Path("/sys/fs/cgroup")


def cgroup_dirs(cgroup_root: str, mount: Path = CGROUP_MOUNT) -> list[Path]:
    """The directories of `cgroup_root` in every cgroup hierarchy mounted under `mount` (v1: one per
    controller; a unified v2 mount: just one)."""
    rel = cgroup_root.strip("/")
    return [h / rel for h in hierarchies(mount) if (h / rel).is_dir()]


def hierarchies(mount: Path = CGROUP_MOUNT) -> list[Path]:
    """Every cgroup hierarchy mounted under `mount` (v1: one per controller and named ones, plus a hybrid
    `unified`); just `mount` itself on a pure cgroup v2 host."""
    if (mount / "cgroup.controllers").exists():
        return [mount]
    return [h for h in sorted(mount.iterdir()) if h.is_dir() and not h.is_symlink()]


def create_cgroups(cgroup_root: str, mount: Path = CGROUP_MOUNT) -> None:
    """Make `cgroup_root` in every hierarchy: kubelet with cgroupsPerQOS wants it to exist in all of them."""
    rel = cgroup_root.strip("/")
    for h in hierarchies(mount):
        (h / rel).mkdir(parents=True, exist_ok=True)


def kill_cgroup_processes(cgroup_root: str, mount: Path = CGROUP_MOUNT) -> int:
    """KILL every process in `cgroup_root`'s trees (the containers of one node); how many were signalled."""
    pids: set[int] = set()
    for top in cgroup_dirs(cgroup_root, mount):
        for procs_file in top.rglob("cgroup.procs"):
            try:
                pids.update(int(x) for x in procs_file.read_text().split())
            except (OSError, ValueError):
                continue
    return procs.kill(pids)


def remove_cgroups(cgroup_root: str, mount: Path = CGROUP_MOUNT, timeout: float = 10.0) -> list[Path]:
    """rmdir `cgroup_root`'s directories depth first in every hierarchy (cgroup v1 is not isolated by the
    node's mount namespace: containers create them on the host); what could not be removed is returned."""
    deadline = time.monotonic() + timeout
    left: list[Path] = []
    while True:
        left = []
        for top in cgroup_dirs(cgroup_root, mount):
            for d in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    left.append(d)
        if not left or time.monotonic() > deadline:
            return left
        kill_cgroup_processes(cgroup_root, mount)  # a process still in it keeps its directory busy
        time.sleep(0.2)


def shim_pids(socket: Path) -> list[int]:
    """The runc shims serving the containerd at `socket` (they outlive containerd by design): matched by the
    `-address` they were started with, which is unique to the node."""
    wanted = str(socket).encode()
    return procs.matching(lambda _pid, argv: argv[0].endswith(b"containerd-shim-runc-v2") and wanted in argv)


def kill_shims(socket: Path) -> int:
    return procs.kill(shim_pids(socket))
