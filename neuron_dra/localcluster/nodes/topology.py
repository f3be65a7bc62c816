"""Which emulated nodes a local cluster has: `--node TYPE[:COUNT]` arguments and their names and paths.

A flag of an UltraServer type (trn2u.48xlarge, trn3p.48xlarge) makes one UltraServer of COUNT nodes (1, 2 or 4,
up to the type's size): their emulated hosts share the UltraServer's ids and run in mode COUNT, each in its own
position (docs/ultraserver.md §7). Nodes of other types are independent hosts."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.nodes.fakeruntime import RuntimePaths
from neuron_dra.localcluster.nodes.kubelet import KubeletPaths

DEMO_NODES = ("trn2.48xlarge:2", "trn1.32xlarge:1", "inf2.48xlarge:1")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    instance_type: str
    ultraserver: str = ""  # the UltraServer the node is part of (seeds its emulated ids); "": not an UltraServer type
    ultraserver_node: int = 0  # its position in it (node_id_4)
    ultraserver_size: int = 0  # the UltraServer's nodes: its ultraserver_mode


def parse_nodes(args: list[str] | tuple[str, ...], catalog: Catalog = BUILTIN) -> list[NodeSpec]:
    """`trn2.48xlarge:2` -> two trn2 nodes named `trn2-48xlarge-1`, `trn2-48xlarge-2`; `trn2u.48xlarge:4` -> one
    UltraServer of four nodes `trn2u-48xlarge-1..4` (the next flag of that type continues the numbering); types not
    in `catalog` are errors."""
    nodes: list[NodeSpec] = []
    counts: dict[str, int] = {}
    ultraservers: dict[str, int] = {}
    for arg in args:
        instance_type, _, count_text = arg.partition(":")
        spec = catalog.spec(instance_type)  # raises with the known types and how to add one
        try:
            count = int(count_text) if count_text else 1
        except ValueError:
            raise ValueError(f"--node {arg!r}: the count after ':' must be an integer 1..16") from None
        if not 1 <= count <= 16:
            raise ValueError(f"--node {arg!r}: the count must be 1..16, got {count}")
        group = ""
        if spec.ultraserver is not None:
            if count not in spec.ultraserver.modes:
                raise ValueError(f"--node {arg!r}: a flag of an UltraServer type is one UltraServer; its node count "
                                 f"{count} is not allowed; allowed: {', '.join(map(str, spec.ultraserver.modes))} "
                                 "(repeat the flag for more UltraServers)")
            ultraservers[instance_type] = ultraservers.get(instance_type, 0) + 1
            group = f"{instance_type}/ultraserver-{ultraservers[instance_type]}"
        for position in range(count):
            counts[instance_type] = counts.get(instance_type, 0) + 1
            name = f"{instance_type.replace('.', '-')}-{counts[instance_type]}"
            nodes.append(NodeSpec(name, instance_type, group, position if group else 0, count if group else 0))
    return nodes


def ultraservers(nodes: list[NodeSpec] | tuple[NodeSpec, ...]) -> dict[str, list[str]]:
    """UltraServer -> the names of its nodes, in position order."""
    out: dict[str, list[str]] = {}
    for n in sorted(nodes, key=lambda n: n.ultraserver_node):
        if n.ultraserver:
            out.setdefault(n.ultraserver, []).append(n.name)
    return out


@dataclass(frozen=True)
class NodePaths:
    """Everything of one emulated node lives under DIR/nodes/NAME, except its sockets (the kubelet root dir)."""

    base: Path
    runtime: Path  # short path for the kubelet dirs: unix socket paths are limited to 107 bytes

    @classmethod
    def of(cls, cluster_dir: Path, node: str) -> NodePaths:
        return cls(cluster_dir / "nodes" / node, runtime_dir(cluster_dir) / node)

    host_root = Under("base", "host")

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet.plugins_dir

    @property
    def registry_dir(self) -> Path:
        return self.kubelet.registry_dir

    cdi_root = Under("base", "cdi")

    @property
    def kubelet(self) -> KubeletPaths:
        """The kubelet's files; its root dir is the short runtime directory (it holds the plugin sockets)."""
        return KubeletPaths(self.base, self.runtime)

    @property
    def fake_runtime(self) -> RuntimePaths:
        return RuntimePaths(socket=self.kubelet.cri_socket, cdi_dir=self.cdi_root, records=self.cri_records,
                            log=self.base / "fakecri.log", pid_file=self.pids / "fakecri.pid")

    # One JSON line per CreateContainer / RemovePodSandbox of the node's fake runtime (fakeruntime.py).
    cri_records = Under("base", "cri-records.jsonl")
    pids = Under("base", "pids")
    driver_kubeconfig = Under("base", "driver.kubeconfig")
    driver_log = Under("base", "driver.log")
    driver_pid = Under("pids", "driver.pid")


def runtime_dir(cluster_dir: Path) -> Path:
    """Where a cluster's sockets live: /tmp/ndra-<hash of the cluster dir> (short, and unique per cluster)."""
    digest = hashlib.sha256(str(cluster_dir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"ndra-{digest}"
