"""A local cluster's life on the real kubelet, as a new user lives it, on the default Kubernetes minor and the oldest
supported one (1.34): `cluster up` with one node, /version and the Node's kubeletVersion, a pod with a
ResourceClaimTemplate runs, `kubectl delete pod` with the default grace period removes it within seconds after the
claim is unprepared, `cluster down` stops everything, and nothing on the machine outside the cluster directory
changed (the sysctls kubelet would set, /var/lib/kubelet, /var/log/containers, /usr/libexec/kubernetes, the host's
mount table).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.localcluster.build import DEFAULT_MINOR, kube_version
from neuron_dra.localcluster.nodes.kubelet import KUBELET_SYSCTLS
from neuron_dra.localcluster.nodes.topology import runtime_dir
from tests.support.e2e import NEURON_TOLERATION, cdi_specs_naming, eventually, pod_claim, pod_phase, raw

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.process]
HOST_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/usr/libexec/kubernetes",
              "/etc/kubernetes", "/var/lib/kubelet/device-plugins")


def _tree(path: str) -> list[str] | None:
    """Every entry under `path` (None when it does not exist)."""
    if not os.path.lexists(path):
        return None
    out = []
    for root, dirs, files in os.walk(path):
        out += [os.path.join(root, n) for n in dirs + files]
    return sorted(out)


def host_state() -> dict[str, Any]:
    return {"sysctls": {name: Path(f"/proc/sys/{name}").read_text().strip() for name in KUBELET_SYSCTLS},
            "paths": {p: _tree(p) for p in HOST_PATHS}}


def _mounts_mentioning(*needles: Path) -> list[str]:
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if any(str(n) in line for n in needles)]


def _processes_mentioning(path: Path) -> list[str]:
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuron_dra", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "D"
    yield d
    _cli("cluster", "down", "--dir", str(d), timeout=120)  # whatever a failed test left running


@pytest.mark.parametrize("minor", [DEFAULT_MINOR, "1.34"])
def test_cluster_life_on_real_kubelets_leaves_the_host_untouched(cluster_dir: Path, minor: str) -> None:
    before = host_state()
    up = _cli("cluster", "up", "--runtime", "fake", "--dir", str(cluster_dir), "--kubernetes-version", minor,
              "--node", "trn1.32xlarge:1", "--ttl", "900")
    assert up.returncode == 0, up.stderr[-3000:]
    api = config.new_client_from_config(str(cluster_dir / "kubeconfig"))
    try:
        version = kube_version(minor)
        assert raw(client.VersionApi(api).get_code(_preload_content=False))["gitVersion"] == version
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        node = raw(core.read_node("trn1-32xlarge-1", _preload_content=False))
        assert node["status"]["nodeInfo"]["kubeletVersion"] == version
        # kubelet's mounts live in its own namespace: the host's mount table does not see them
        assert not _mounts_mentioning(cluster_dir, runtime_dir(cluster_dir))

        template: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": "one"}, "spec": {"spec": {"devices": {"requests": [
                             {"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com", "count": 1}}]}}}}
        eventually(lambda: core.read_namespaced_service_account("default", "default"), 30, what="default SA")
        res.create_namespaced_resource_claim_template("default", template)
        pod: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "tolerations": [NEURON_TOLERATION], "resourceClaims": [{"name": "n", "resourceClaimTemplateName": "one"}],
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "n"}]}}]}}
        core.create_namespaced_pod("default", pod)
        eventually(lambda: pod_phase(core, "default", "p") == "Running", 120, what="pod running")
        uid = pod_claim(core, res, "default", "p")["metadata"]["uid"]
        cdi = cluster_dir / "nodes" / "trn1-32xlarge-1" / "cdi"
        assert cdi_specs_naming(cdi, [uid])
        began = time.monotonic()
        core.delete_namespaced_pod("p", "default")  # the default grace period, as `kubectl delete pod`
        eventually(lambda: not core.list_namespaced_pod("default").items, 30, interval=0.1, what="pod gone")
        assert time.monotonic() - began < 10
        assert not cdi_specs_naming(cdi, [uid]), "unprepared before the pod was gone"
    finally:
        api.close()
    down = _cli("cluster", "down", "--dir", str(cluster_dir), timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not runtime_dir(cluster_dir).exists()
    eventually(lambda: not _processes_mentioning(cluster_dir), 15, what="no process of the cluster left")
    assert host_state() == before


def test_down_after_the_supervisor_was_killed_stops_every_node_process(cluster_dir: Path) -> None:
    """`cluster down` finds the kubelets, fake runtimes, drivers and control plane through their pid files (procs)
    when the supervisor that started them is gone (kill -9): nothing of the cluster keeps running."""
    from neuron_dra.localcluster.processes import procs
    from neuron_dra.localcluster.supervisor import PID_FILE

    up = _cli("cluster", "up", "--runtime", "fake", "--dir", str(cluster_dir), "--node", "inf2.48xlarge:1",
              "--ttl", "900")
    assert up.returncode == 0, up.stderr[-3000:]
    pid_files = sorted((cluster_dir / "nodes").rglob("*.pid")) + sorted((cluster_dir / "controlplane").rglob("*.pid"))
    assert {p.stem for p in pid_files} >= {"kubelet", "fakecri", "driver", "kube-apiserver", "etcd"}
    refs = [procs.running(p) for p in pid_files]
    assert all(r is not None for r in refs)
    supervisor = procs.running(cluster_dir / PID_FILE)
    assert supervisor is not None
    os.kill(supervisor.pid, 9)
    eventually(lambda: not procs.alive(supervisor), 10, what="supervisor gone")
    assert all(r is not None and procs.alive(r) for r in refs), "the node processes outlive their supervisor"
    down = _cli("cluster", "down", "--dir", str(cluster_dir), timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not any(r is not None and procs.alive(r) for r in refs)
    assert not runtime_dir(cluster_dir).exists()
    eventually(lambda: not _processes_mentioning(cluster_dir), 15, what="no process of the cluster left")
