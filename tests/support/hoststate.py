"""What a local cluster with a real runtime could change on the host, as one comparable snapshot: mount points,
network namespaces and interfaces, cgroup directories (two levels deep in every hierarchy), the host paths
buildah, containerd, CNI and kubelet write by default, and /etc/hosts (the API server sees its own copy)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

WATCHED_PATHS = ("/etc/cni", "/etc/containers", "/var/lib/containers", "/var/lib/containerd", "/var/lib/cni",
                 "/run/containers", "/run/containerd", "/run/netns", "/run/cdi", "/etc/cdi", "/var/lib/kubelet",
                 "/var/log/containers", "/var/log/pods", "/opt/aws", "/run/neuron-dra-host")


def _tree(path: Path, depth: int) -> list[str]:
    if not path.exists():
        return []
    out = [str(path)]
    if depth > 0 and path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir()):
            out += _tree(child, depth - 1)
    return out


def snapshot() -> dict[str, Any]:
    mounts = sorted({line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()})
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    interfaces = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
    cgroups: list[str] = []
    for hierarchy in sorted(Path("/sys/fs/cgroup").iterdir()):
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            cgroups += [p for p in _tree(hierarchy, 2) if Path(p).is_dir()]
    files = [p for watched in WATCHED_PATHS for p in _tree(Path(watched), 4)]
    etc_hosts = Path("/etc/hosts").read_text(errors="replace").splitlines()
    return {"mounts": mounts, "interfaces": interfaces, "cgroups": cgroups, "files": files, "etc_hosts": etc_hosts}


def sibling_cgroup_parents() -> set[Path]:
    """The directories holding this process's own cgroups where it is not at a hierarchy's root (a sandbox that
    puts each of its processes in a cgroup of its own, e.g. memory:/process_api/ID): what appears there belongs to
    the machine's other processes, never to the cluster, whose cgroups live below its own cgroup root."""
    parents = set()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if not path.strip("/"):
            continue
        if controllers:  # v1: one hierarchy per controller set
            parents.add(Path("/sys/fs/cgroup", controllers.removeprefix("name="), path.strip("/")).parent)
        elif Path("/sys/fs/cgroup/cgroup.controllers").exists():  # v2 mounted alone
            parents.add(Path("/sys/fs/cgroup", path.strip("/")).parent)
    return parents


def differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per kind, what appeared and what went away. Cgroups that went away are not counted: other processes on the
    machine end theirs meanwhile, and the cluster removes only directories below its own cgroup root; neither are
    new cgroups beside this process's own (sibling_cgroup_parents)."""
    out = {}
    foreign = sibling_cgroup_parents()
    for kind in before:
        added = sorted(set(after[kind]) - set(before[kind]))
        if kind == "cgroups":
            added = [c for c in added if Path(c).parent not in foreign]
        removed = [] if kind == "cgroups" else sorted(set(before[kind]) - set(after[kind]))
        if added or removed:
            out[kind] = {"added": added, "removed": removed}
    return out
