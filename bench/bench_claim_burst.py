"""Benchmark: a node that starts 64 NeuronCore claim pods at once, on the real kubelet of a local cluster.

One emulated trn2.48xlarge node (64 NeuronCores at LNC=2; Kubernetes 1.36+, where the driver publishes
NeuronCores), the fake CRI runtime and the driver as a host process (localcluster). `--pods` pods are created at
once, each with one claim from the typed template `NeuronCores(1, instance_types="trn2.48xlarge")`. The bench
records when each claim's allocation appears (the scheduler wrote it; polled every 50 ms) and when its pod turns
Ready (a watch: kubelet's NodePrepareResources, in which the driver GETs the claim, then the fake runtime's
containers). Figures: per pod, allocation -> Ready (p50, max) and the whole burst (first allocation -> last Ready),
with the driver's API client rate (`--kube-api-qps/--kube-api-burst`: the driver's defaults unless given, passed
through its environment).

Run as root: python bench/bench_claim_burst.py [--pods 64] [--kube-api-qps 5 --kube-api-burst 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from urllib3.exceptions import ProtocolError

from neuron_dra.claim_templates import ClaimTemplate, NeuronCores
from neuron_dra.driver.model.k8s_names import neuron_toleration
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.cluster import down, up

NODE = "trn2-48xlarge-1"
NS = "default"
MAX_PODS = 64  # the node's NeuronCores at LNC=2
TIMEOUT_S = 300.0
TEMPLATE = ClaimTemplate("one-core", NeuronCores(1, instance_types="trn2.48xlarge"))


class Times:
    """First time (monotonic) each name was seen in a state, filled by a watch thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}

    def mark(self, name: str) -> None:
        with self.lock:
            self.at.setdefault(name, time.monotonic())

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.at)


def watch_claims(api: client.ApiClient, allocated: Times, stop: threading.Event) -> None:
    """Pod name -> when its claim's status.allocation first appeared (the claim is owned by its pod), polled every
    50 ms (the Python client has no ResourceClaim model to watch with)."""
    custom = client.CustomObjectsApi(api)
    while not stop.is_set():
        claims: Any = custom.list_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims")
        for claim in claims.get("items", []):
            owners = claim["metadata"].get("ownerReferences") or []
            if (claim.get("status") or {}).get("allocation") and owners:
                allocated.mark(owners[0]["name"])
        time.sleep(0.05)


def watch_pods(api: client.ApiClient, scheduled: Times, ready: Times, stop: threading.Event) -> None:
    core = client.CoreV1Api(api)
    w = watch.Watch()
    while not stop.is_set():
        try:
            for event in w.stream(core.list_namespaced_pod, NS, timeout_seconds=5):
                pod: Any = event["object"]
                if pod.spec is not None and pod.spec.node_name:
                    scheduled.mark(pod.metadata.name)
                conditions = (pod.status.conditions if pod.status is not None else None) or []
                if any(c.type == "Ready" and c.status == "True" for c in conditions):
                    ready.mark(pod.metadata.name)
                if stop.is_set():
                    break
        except (ProtocolError, client.exceptions.ApiException):  # a watch cut (the cluster going away at the end)
            if stop.is_set():
                return
            time.sleep(0.2)


def pod(name: str, with_claim: bool) -> Any:
    container: dict[str, Any] = {"name": "main", "image": "bench:emulated"}
    spec: dict[str, Any] = {"tolerations": [neuron_toleration()], "nodeSelector": {"kubernetes.io/hostname": NODE},
                            "containers": [container]}
    if with_claim:
        spec["resourceClaims"] = [{"name": "c", "resourceClaimTemplateName": TEMPLATE.name}]
        container["resources"] = {"claims": [{"name": "c"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"bench_claim_burst: timed out after {timeout:.0f} s waiting for {what}")


@dataclass(frozen=True)
class Result:
    allocated: dict[str, float]
    scheduled: dict[str, float]
    ready: dict[str, float]

    def waits(self, since: dict[str, float]) -> list[float]:
        return sorted(self.ready[p] - since[p] for p in self.ready if p in since)

    @staticmethod
    def text(waits: list[float]) -> str:
        return f"p50 {statistics.median(waits):.2f} s, max {waits[-1]:.2f} s"


def burst(api: client.ApiClient, pods: int, with_claim: bool) -> Result:
    core = client.CoreV1Api(api)
    allocated, scheduled, ready, stop = Times(), Times(), Times(), threading.Event()
    threads = [threading.Thread(target=watch_claims, args=(api, allocated, stop), daemon=True),
               threading.Thread(target=watch_pods, args=(api, scheduled, ready, stop), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(1)  # both listening
    prefix = "claim" if with_claim else "plain"
    names = [f"{prefix}-{i:02d}" for i in range(pods)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: core.create_namespaced_pod(NS, pod(n, with_claim)), names))
    wait(lambda: len(ready.snapshot()) >= pods, TIMEOUT_S, f"{pods} pods Ready")
    stop.set()
    for t in threads:
        t.join(10)
    core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    wait(lambda: not core.list_namespaced_pod(NS).items, TIMEOUT_S, "the pods deleted")
    return Result(allocated.snapshot(), scheduled.snapshot(), ready.snapshot())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=MAX_PODS, help=f"pods at once (1..{MAX_PODS})")
    parser.add_argument("--kube-api-qps", type=float, default=None, help="the driver's API QPS (default: its own)")
    parser.add_argument("--kube-api-burst", type=int, default=None, help="the driver's API burst")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kubernetes-version", default=DEFAULT_MINOR)
    args = parser.parse_args(argv)
    if not 1 <= args.pods <= MAX_PODS:
        raise SystemExit(f"bench_claim_burst: --pods {args.pods}: give 1 to {MAX_PODS} (a trn2.48xlarge's cores)")
    for flag, value in (("KUBE_API_QPS", args.kube_api_qps), ("KUBE_API_BURST", args.kube_api_burst)):
        if value is not None:
            os.environ[flag] = f"{value:g}"  # the driver (a host process under the fake runtime) inherits it
    cluster_dir = args.dir or Path(tempfile.mkdtemp(prefix="bench-claim-burst-"))
    cluster = up(cluster_dir, ["trn2.48xlarge:1"], ttl=1800, kubernetes_version=args.kubernetes_version,
                 runtime="fake", log=lambda m: print(m, file=sys.stderr))
    api = config.new_client_from_config(str(cluster.kubeconfig))
    try:
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        accounts = core.list_namespaced_service_account
        wait(lambda: any(a.metadata is not None and a.metadata.name == "default" for a in accounts(NS).items), 60,
             "the default service account")
        template: Any = TEMPLATE.to_manifest()
        res.create_namespaced_resource_claim_template(NS, template)
        cores = f"spec.nodeName={NODE},spec.driver=neuron.aws.com"
        wait(lambda: sum(len(s.spec.devices or []) for s in res.list_resource_slice(field_selector=cores).items)
             >= 16 + MAX_PODS, 120, "the node's NeuronCores published")
        claims = burst(api, args.pods, with_claim=True)
        waits = claims.waits(claims.allocated)
        if len(waits) < args.pods:
            raise SystemExit(f"bench_claim_burst: only {len(waits)} of {args.pods} pods had an allocation seen")
        span = max(claims.ready.values()) - min(claims.allocated.values())
        plain = burst(api, args.pods, with_claim=False)  # the baseline: kubelet and the runtime alone
        rate = ("the driver's defaults" if args.kube_api_qps is None and args.kube_api_burst is None else
                f"QPS {os.environ.get('KUBE_API_QPS', 'default')}, burst {os.environ.get('KUBE_API_BURST', 'default')}")
        version = client.VersionApi(api).get_code().git_version
        print(f"Kubernetes {version}; {args.pods} NeuronCore claim pods at once on one trn2.48xlarge; driver API "
              f"client: {rate}; load average {os.getloadavg()[0]:.1f}")
        print(f"claim allocated -> pod Ready: {Result.text(waits)}; first allocation -> last Ready {span:.2f} s")
        print(f"pod scheduled -> Ready, with claims: {Result.text(claims.waits(claims.scheduled))}; "
              f"without (baseline, same node after): {Result.text(plain.waits(plain.scheduled))}")
    finally:
        api.close()
        down(cluster_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
