"""Benchmark: pods on the real kubelet of a local cluster (one emulated node, the cluster's default minor).

Figures, each the median and max over --samples rounds:
- pod with a ResourceClaimTemplate (1 Neuron device): create -> Running (scheduling, claim allocation, kubelet's
  NodePrepareResources, CDI resolution in the fake runtime) and `kubectl delete pod` with the default grace period
  -> gone (kubelet's NodeUnprepareResources, then the pod object removed);
- baseline, measured in the same run and alternating round by round: the same pod without a claim, so the ratio
  shows what DRA adds on top of kubelet's own pod lifecycle;
- kubelet restart (SIGTERM; the supervisor starts it again) -> /healthz ok, and -> the node's slices (wiped by
  kubelet at start) published again by the driver;
- kubelet RSS after the rounds, and its CPU use while idle over 10 s.

Run as root: python bench/bench_kubelet.py [--samples 10] [--dir /tmp/bench-kubelet] [--kubernetes-version 1.36]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME, neuron_toleration
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.cluster import down, up
from neuron_dra.localcluster.nodes import kubelet
from neuron_dra.localcluster.processes import procs

NODE = "trn1-32xlarge-1"
NS = "default"
TOLERATION = neuron_toleration()


def wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def pod(name: str, with_claim: bool) -> Any:
    spec: dict[str, Any] = {"tolerations": [TOLERATION], "nodeSelector": {"kubernetes.io/hostname": NODE},
                            "containers": [{"name": "main", "image": "bench:emulated"}]}
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


def one_round(core: client.CoreV1Api, name: str, with_claim: bool) -> tuple[float, float]:
    began = time.monotonic()
    core.create_namespaced_pod(NS, pod(name, with_claim))
    wait(lambda: phase(core, name) == "Running", 120, f"{name} Running")
    running = time.monotonic() - began
    began = time.monotonic()
    core.delete_namespaced_pod(name, NS)  # the default grace period
    wait(lambda: phase(core, name) is None, 120, f"{name} gone")
    return running, time.monotonic() - began


def kubelet_pid(pid_file: Path) -> int:
    ref = procs.running(pid_file)
    if ref is None:
        raise SystemExit(f"no kubelet recorded in {pid_file}")
    (pid,) = procs.children(ref.pid)  # `timeout` leads; unshare and sh exec into kubelet
    return pid


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slice_names(res: client.ResourceV1Api) -> set[str]:
    items = res.list_resource_slice(field_selector=f"spec.nodeName={NODE},spec.driver=neuron.aws.com").items
    return {str(s.metadata.name) for s in items if s.metadata is not None}


def node_ready(core: client.CoreV1Api) -> bool:
    node: Any = core.read_node_status(NODE)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.0f} ms  max {max(values) * 1000:7.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kubernetes-version", default=DEFAULT_MINOR)
    args = parser.parse_args()
    cluster_dir = args.dir or Path(tempfile.mkdtemp(prefix="bench-kubelet-"))
    started = time.monotonic()
    cluster = up(cluster_dir, ["trn1.32xlarge:1"], ttl=3600, kubernetes_version=args.kubernetes_version, runtime="fake",
                 log=lambda m: print(m, file=sys.stderr))
    print(f"cluster up (control plane + 1 node with kubelet, fake runtime, driver): "
          f"{time.monotonic() - started:.1f} s")
    api = config.new_client_from_config(str(cluster.kubeconfig))
    try:
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        version = client.VersionApi(api).get_code().git_version
        accounts = core.list_namespaced_service_account
        wait(lambda: any(a.metadata is not None and a.metadata.name == "default" for a in accounts(NS).items),
             30, "default service account")
        template: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": "one"}, "spec": {"spec": {"devices": {"requests": [
                             {"name": "neurons", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME, "count": 1}}]}}}}
        res.create_namespaced_resource_claim_template(NS, template)
        wait(lambda: bool(res.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items), 60, "slices")
        one_round(core, "warmup", True)
        claim_up: list[float] = []
        claim_down: list[float] = []
        base_up: list[float] = []
        base_down: list[float] = []
        for i in range(args.samples):
            for with_claim in (i % 2 == 0, i % 2 != 0):  # alternate which goes first
                up_s, down_s = one_round(core, f"{'claim' if with_claim else 'plain'}-{i}", with_claim)
                (claim_up if with_claim else base_up).append(up_s)
                (claim_down if with_claim else base_down).append(down_s)
        paths = cluster.node_paths(NODE)
        pid = kubelet_pid(paths.kubelet.pid_file)
        rss = rss_mib(pid)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(10)
        idle = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        ref = procs.running(paths.kubelet.pid_file)
        assert ref is not None
        before = slice_names(res)
        restart = time.monotonic()
        procs.signal_group(ref, signal.SIGTERM)
        wait(lambda: (r := procs.running(paths.kubelet.pid_file)) is not None and r != ref, 60, "kubelet restarted")
        port = yaml.safe_load(paths.kubelet.config.read_text())["healthzPort"]
        wait(lambda: kubelet.healthy(port), 60, "kubelet /healthz")
        healthy = time.monotonic() - restart
        wait(lambda: bool(slice_names(res)) and slice_names(res).isdisjoint(before) and node_ready(core), 60,
             "slices republished and Node Ready")
        republished = time.monotonic() - restart
        print(f"Kubernetes {version}, {args.samples} samples each, alternating")
        print(f"pod with a claim    create -> Running  {fmt(claim_up)}")
        print(f"pod without claim   create -> Running  {fmt(base_up)}   (baseline)")
        print(f"  ratio (medians)                       "
              f"{statistics.median(claim_up) / statistics.median(base_up):.2f}x")
        print(f"pod with a claim    delete -> gone     {fmt(claim_down)}   (default grace period)")
        print(f"pod without claim   delete -> gone     {fmt(base_down)}   (baseline)")
        print(f"  ratio (medians)                       "
              f"{statistics.median(claim_down) / statistics.median(base_down):.2f}x")
        print(f"kubelet SIGTERM -> restarted and /healthz ok: {healthy:.1f} s; -> slices republished, Node Ready: "
              f"{republished:.1f} s")
        print(f"kubelet RSS after {2 * args.samples + 1} pods: {rss:.0f} MiB; idle CPU {idle * 100:.2f} % of a core")
    finally:
        api.close()
        down(cluster_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
