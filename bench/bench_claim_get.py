"""Benchmark: the claim GET every NodePrepareResources makes, against a real kube-apiserver (local control plane).

Target: `KubeClaimLookup.get` (driver/daemon/kube.py on driver/daemon/http1.py, keep-alive connection).
Baselines, measured in
the same run, call for call in rotating order on their own kept connections to the same API server:
- `http.client`: what kube.py did before http1.py, an `http.client.HTTPSConnection` GET with the same headers
  and `json.loads` of the body;
- `bare`: the floor, a hand-written GET request and a Content-Length read over the same kind of TLS socket,
  TCP_NODELAY, no checks at all.
Figures: wall-clock p50/p90/p99 per GET and the p50 ratio to http.client, and the mean CPU time of the calling
thread per GET (user and system: the TLS records, the loopback TCP work done in the sender's system calls).

Run: python bench/bench_claim_get.py [--samples 3000] [--kubernetes-version 1.36]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from neuron_dra.driver.daemon.kube import ApiClient, KubeApi, KubeClaimLookup, api_client
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster.controlplane import ControlPlane

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
NAME = "bench-claim"
WARMUP = 200


def http_client_get(api: ApiClient, path: str) -> Callable[[], Mapping[str, Any]]:
    """The previous kube.py request path: http.client on a kept connection."""
    conn = http.client.HTTPSConnection(api._host, api._port, context=api._ssl, timeout=3.0)
    headers = {"Accept": "application/json", "User-Agent": "neuron-dra-driver"}

    def get() -> Mapping[str, Any]:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        data: Mapping[str, Any] = json.loads(resp.read())
        return data

    return get


def bare_get(api: ApiClient, path: str) -> Callable[[], Mapping[str, Any]]:
    """The floor: one sendall, find the end of the head, read Content-Length bytes; no validation."""
    raw = socket.create_connection((api._host, api._port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = api._ssl.wrap_socket(raw, server_hostname=api._host)
    request = (f"GET {path} HTTP/1.1\r\nHost: {api._host}:{api._port}\r\nAccept: application/json\r\n"
               "User-Agent: neuron-dra-driver\r\n\r\n").encode()
    buf = bytearray()

    def get() -> Mapping[str, Any]:
        sock.sendall(request)
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf.extend(sock.recv(65536))
        head = bytes(buf[:end]).decode("latin-1").lower()
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        del buf[:end + 4]
        while len(buf) < length:
            buf.extend(sock.recv(65536))
        body = bytes(buf[:length])
        del buf[:length]
        data: Mapping[str, Any] = json.loads(body)
        return data

    return get


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
        api = api_client(str(kubeconfig))
        request = {"name": "neurons", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME, "count": 1}}
        KubeApi(api).call("POST", CLAIMS, body={"metadata": {"name": NAME}, "spec": {"devices": {"requests": [
            request]}}})
        lookup = KubeClaimLookup(api)

        def target() -> Mapping[str, Any]:
            claim = lookup.get("default", NAME)
            assert claim is not None
            return claim

        getters = {"http1 (target)": target, "http.client": http_client_get(api, f"{CLAIMS}/{NAME}"),
                   "bare": bare_get(api, f"{CLAIMS}/{NAME}")}
        times, cpu = measure(getters, args.samples)
        p50_ref = percentiles(times["http.client"])[0]
        print(f"claim GET against kube-apiserver {args.kubernetes_version}, {args.samples} samples each "
              f"(interleaved), keep-alive TLS")
        print(f"{'client':16} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p50/http.client':>16} {'CPU us/GET':>11}")
        for name, samples in times.items():
            p50, p90, p99 = percentiles(samples)
            print(f"{name:16} {p50:8.3f} {p90:8.3f} {p99:8.3f} {p50 / p50_ref:16.2f} {cpu[name]:11.0f}")
    finally:
        plane.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
