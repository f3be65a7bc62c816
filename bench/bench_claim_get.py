"""Benchmark: the claim GET every NodePrepareResources makes, against a real kube-apiserver (local control plane).

Target: `KubeClaimLookup.get` (driver/kubeletplugin/_kube.py: its kept TLS connections, answers parsed by
httptools, with its deadline, size caps and rate limit in the path; the limit set high here so that it never waits).
Baselines, measured in the same run, call for call in rotating order on their own kept connections to the same API
server:
- `http.client`: the standard library's client alone on a kept `HTTPSConnection`, the same headers, `json.loads`
  of the body (what the daemon's client ran on before httptools, with its own layers on top);
- `urllib3`: urllib3's `HTTPSConnectionPool`, which the daemon's client ran on until 2026-12-06 (`urlopen` without
  preloading, read, `json.loads`);
- `kubernetes`: the official client (`ResourceV1Api.read_namespaced_resource_claim`, `_preload_content=False`
  and `json.loads`, so that its model classes are not measured; they would cost more).
Figures: wall-clock p50/p90/p99 per GET and the p50 ratio to http.client, the mean CPU time of the calling
thread per GET (user and system: the TLS records, the loopback TCP work done in the sender's system calls), and
what importing each client costs a fresh interpreter in resident memory.

Run: python bench/bench_claim_get.py [--samples 3000] [--kubernetes-version 1.36]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from neuron_dra.driver.kubeletplugin._kube import ApiClient, ClientOptions, KubeApi, KubeClaimLookup
from neuron_dra.driver.kubeletplugin._kubeconfig import ClusterConfig, load_kubeconfig
from neuron_dra.driver.kubeletplugin._ratelimit import Rate
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster.controlplane.plane import ControlPlane

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
NAME = "bench-claim"
WARMUP = 200


def http_client_get(config: ClusterConfig, path: str) -> Callable[[], Mapping[str, Any]]:
    """http.client on a kept connection, the same TLS settings."""
    url = urlsplit(config.server)
    ctx = ssl.create_default_context(cafile=config.ca_file)
    if config.cert_file:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=ctx, timeout=10.0)
    headers = {"Accept": "application/json", "User-Agent": "neuron-dra-driver"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"

    def get() -> Mapping[str, Any]:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        data: Mapping[str, Any] = json.loads(resp.read())
        return data

    return get


def urllib3_get(config: ClusterConfig, path: str) -> Callable[[], Mapping[str, Any]]:
    """urllib3's pool (the kubernetes client's dependency), the same TLS settings and headers."""
    import urllib3

    url = urlsplit(config.server)
    ctx = ssl.create_default_context(cafile=config.ca_file)
    if config.cert_file:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    pool = urllib3.HTTPSConnectionPool(url.hostname or "", url.port, ssl_context=ctx, maxsize=1, retries=False)
    headers = {"Accept": "application/json", "User-Agent": "neuron-dra-driver"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"

    def get() -> Mapping[str, Any]:
        resp = pool.urlopen("GET", path, headers=headers, preload_content=False, decode_content=False)
        data: Mapping[str, Any] = json.loads(resp.read())
        resp.release_conn()
        return data

    return get


def kubernetes_get(kubeconfig: Path) -> Callable[[], Mapping[str, Any]]:
    from kubernetes import client, config

    api = client.ResourceV1Api(config.new_client_from_config(str(kubeconfig)))

    def get() -> Mapping[str, Any]:
        resp: Any = api.read_namespaced_resource_claim(NAME, "default", _preload_content=False)
        data: Mapping[str, Any] = json.loads(resp.data)  # a urllib3 response when not preloaded
        return data

    return get


def import_cost(module: str) -> float:
    """MiB of resident memory that importing `module` adds to a fresh interpreter (VmRSS before and after)."""
    code = ("import importlib\n"
            "def rss():\n"
            "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
            f"before = rss(); importlib.import_module({module!r}); print(rss() - before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out) / 1024


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p90, p99 in milliseconds."""
    s = sorted(samples)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(len(s) * q))] * 1e3

    return at(0.5), at(0.9), at(0.99)


def measure(getters: dict[str, Callable[[], Mapping[str, Any]]],
            samples: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Wall-clock seconds per call and this thread's mean CPU microseconds per call, the getters called in
    rotating order so that the machine's load affects all alike."""
    names = list(getters)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu = dict.fromkeys(names, 0)
    for i in range(samples + WARMUP):
        for name in names[i % len(names):] + names[:i % len(names)]:
            cpu_start, start = time.thread_time_ns(), time.perf_counter()
            claim = getters[name]()
            elapsed, cpu_used = time.perf_counter() - start, time.thread_time_ns() - cpu_start
            if claim["metadata"]["name"] != NAME:
                raise AssertionError(f"{name}: got {claim['metadata']['name']!r}")
            if i >= WARMUP:
                times[name].append(elapsed)
                cpu[name] += cpu_used
    return times, {n: ns / samples / 1e3 for n, ns in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--kubernetes-version", default="1.36")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-claim-get-"))
    plane = ControlPlane.start(base / "controlplane", max_lifetime_s=1800, kubernetes_version=args.kubernetes_version)
    try:
        kubeconfig = base / "kubeconfig.json"  # JSON: the client then needs no yaml import
        kubeconfig.write_text(json.dumps(yaml.safe_load(plane.kubeconfig.read_text())))
        config = load_kubeconfig(str(kubeconfig))
        api = ApiClient(config, ClientOptions(rate=Rate(100_000, 100_000)))
        request = {"name": "neurons", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME, "count": 1}}
        KubeApi(api).call("POST", CLAIMS, body={"metadata": {"name": NAME}, "spec": {"devices": {"requests": [
            request]}}})
        lookup = KubeClaimLookup(api)

        def target() -> Mapping[str, Any]:
            claim = lookup.get("default", NAME)
            assert claim is not None
            return claim

        getters = {"ours (target)": target, "http.client": http_client_get(config, f"{CLAIMS}/{NAME}"),
                   "urllib3": urllib3_get(config, f"{CLAIMS}/{NAME}"), "kubernetes": kubernetes_get(kubeconfig)}
        times, cpu = measure(getters, args.samples)
        if config.temp_dir:
            shutil.rmtree(config.temp_dir, ignore_errors=True)
        p50_ref = percentiles(times["http.client"])[0]
        print(f"claim GET against kube-apiserver {args.kubernetes_version}, {args.samples} samples each "
              f"(interleaved), keep-alive TLS")
        print(f"{'client':17} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p50/http.client':>16} {'CPU us/GET':>11}")
        for name, samples in times.items():
            p50, p90, p99 = percentiles(samples)
            print(f"{name:17} {p50:8.3f} {p90:8.3f} {p99:8.3f} {p50 / p50_ref:16.2f} {cpu[name]:11.0f}")
        for module in ("neuron_dra.driver.kubeletplugin._kube", "http.client", "urllib3", "kubernetes.client"):
            print(f"import {module}: +{import_cost(module):.1f} MiB RSS")
    finally:
        plane.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
