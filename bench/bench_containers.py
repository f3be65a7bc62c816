"""Benchmark: real containers on a local cluster node (`--runtime containerd`, one emulated trn1 node).

Figures, each the median and max over --samples rounds, alternating:
- pod running the workload image with a ResourceClaimTemplate (1 Neuron device): create -> Running (scheduling,
  allocation, NodePrepareResources, sandbox + CNI, CDI applied by containerd, runc start), and delete with the
  default grace period -> gone (the workload exits on TERM);
- the same pod without a claim (baseline);
- memory of the node afterwards (RSS): containerd, kubelet, every runc shim, the driver pod's processes.
Also the time `cluster up` took (binaries and images cached: a warm start).

Run as root: python bench/bench_containers.py [--samples 5] [--dir /tmp/bench-containers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME, neuron_toleration
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.cluster import down, up
from neuron_dra.localcluster.nodes import containerd
from neuron_dra.localcluster.nodes.containerd_node import cgroup_root, containerd_paths
from neuron_dra.localcluster.processes import procs

NODE = "trn1-32xlarge-1"
NS = "default"


def wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def pod(name: str, image: str, with_claim: bool) -> Any:
    spec: dict[str, Any] = {"tolerations": [neuron_toleration()], "nodeSelector": {"kubernetes.io/hostname": NODE},
                            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never"}]}
    if with_claim:
        spec["resourceClaims"] = [{"name": "n", "resourceClaimTemplateName": "one"}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "n"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def phase(core: client.CoreV1Api, name: str) -> str | None:
    try:
        return str(core.read_namespaced_pod_status(name, NS).status.phase)  # type: ignore[union-attr]
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


def one_round(core: client.CoreV1Api, name: str, image: str, with_claim: bool) -> tuple[float, float]:
    began = time.monotonic()
    core.create_namespaced_pod(NS, pod(name, image, with_claim))
    wait(lambda: phase(core, name) == "Running", 120, f"{name} Running")
    running = time.monotonic() - began
    began = time.monotonic()
    core.delete_namespaced_pod(name, NS)  # the default grace period (30 s): the workload exits on TERM
    wait(lambda: phase(core, name) is None, 120, f"{name} gone")
    return running, time.monotonic() - began


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def leader_child(pid_file: Path) -> int:
    ref = procs.running(pid_file)
    if ref is None:
        raise SystemExit(f"nothing running in {pid_file}")
    (pid,) = procs.children(ref.pid)  # `timeout` leads; nsenter execs into the program
    return pid


def driver_pod_pids(cgroup: str) -> list[int]:
    """Processes of the driver container: in the node's cgroup tree, running the driver's entry point."""
    pids = []
    top = containerd.CGROUP_MOUNT / "memory" / cgroup.strip("/")
    if top.is_dir():
        for procs_file in top.rglob("cgroup.procs"):
            for text in procs_file.read_text().split():
                try:
                    cmdline = Path(f"/proc/{text}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"neuron-dra-driver" in cmdline:
                    pids.append(int(text))
    return sorted(set(pids))


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.0f} ms  max {max(values) * 1000:7.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kubernetes-version", default=DEFAULT_MINOR)
    args = parser.parse_args()
    cluster_dir = (args.dir or Path(tempfile.mkdtemp(prefix="bench-containers-"))).resolve()
    started = time.monotonic()
    cluster = up(cluster_dir, ["trn1.32xlarge:1"], ttl=3600, kubernetes_version=args.kubernetes_version,
                 log=lambda m: print(m, file=sys.stderr), runtime="containerd", timeout=900)
    print(f"cluster up --runtime containerd (1 node; control plane, containerd, images imported, kubelet, driver "
          f"DaemonSet Ready): {time.monotonic() - started:.1f} s")
    image = json.loads((cluster_dir / "images.json").read_text())["workload"]
    api = config.new_client_from_config(str(cluster.kubeconfig))
    try:
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        template: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": "one"}, "spec": {"spec": {"devices": {"requests": [
                             {"name": "neurons", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME, "count": 1}}]}}}}
        res.create_namespaced_resource_claim_template(NS, template)
        one_round(core, "warmup", image, True)
        claim_up: list[float] = []
        claim_down: list[float] = []
        base_up: list[float] = []
        base_down: list[float] = []
        for i in range(args.samples):
            for with_claim in (i % 2 == 0, i % 2 != 0):
                up_s, down_s = one_round(core, f"{'claim' if with_claim else 'plain'}-{i}", image, with_claim)
                (claim_up if with_claim else base_up).append(up_s)
                (claim_down if with_claim else base_down).append(down_s)
        core.create_namespaced_pod(NS, pod("resident", image, True))
        wait(lambda: phase(core, "resident") == "Running", 120, "resident Running")
        time.sleep(2)
        paths = cluster.node_paths(NODE)
        ctrd = containerd_paths(paths)
        shims = containerd.shim_pids(ctrd.socket)
        driver = driver_pod_pids(cgroup_root(cluster_dir, NODE))
        print(f"{args.samples} samples each, alternating; the workload image traps TERM")
        print(f"pod with a claim    create -> Running  {fmt(claim_up)}")
        print(f"pod without claim   create -> Running  {fmt(base_up)}   (baseline)")
        print(f"pod with a claim    delete -> gone     {fmt(claim_down)}   (default grace period)")
        print(f"pod without claim   delete -> gone     {fmt(base_down)}")
        print(f"memory of the node with the driver pod and one workload pod (RSS MiB): "
              f"containerd {rss_mib(leader_child(ctrd.pid_file)):.0f}, "
              f"kubelet {rss_mib(leader_child(paths.kubelet.pid_file)):.0f}, "
              f"{len(shims)} shims {sum(rss_mib(p) for p in shims):.0f}, "
              f"driver pod {sum(rss_mib(p) for p in driver):.0f} ({len(driver)} processes)")
    finally:
        api.close()
        down(cluster_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
