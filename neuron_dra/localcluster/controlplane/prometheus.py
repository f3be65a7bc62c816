"""A real Prometheus for the local cluster (`cluster up --prometheus`, `demo --prometheus`): the binary built from
the Go module proxy (prometheus_build.py), scraping every node's driver, with its HTTP API on loopback.

How it reaches the drivers: under the containerd runtime each driver pod listens on its pod IP inside its node's
network namespace, which the host cannot route to (nodens.py creates nothing in the host's namespace). Each node
gets a forwarder pair like its API forwarders, the other way round: socat in the node's namespace connects a unix
socket (paths cross network namespaces) to the pod's metrics port, socat on the host listens on a loopback port
and connects to that socket. With the fake runtime the drivers are host processes listening on loopback already.
Each target carries its node's name as the `node` label, as deploy's PodMonitor gives it in a real cluster;
`honor_labels` keeps the `node` the attribution series carry themselves.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from neuron_dra.localcluster.cachedir import Under
from neuron_dra.localcluster.processes import procs

SCRAPE_INTERVAL_S = 2  # a test sees a change within seconds; the drivers answer a scrape in milliseconds
READY_TIMEOUT_S = 60.0
MAX_ANSWER = 8 << 20  # bytes read of one API answer
METRICS_PORT = 9400  # the drivers' metrics port in a local cluster with Prometheus


class PrometheusError(RuntimeError):
    """Prometheus did not start or answer; the message has its log's tail or the API's error."""


@dataclass(frozen=True)
class ScrapeTarget:
    node: str
    address: str  # host:port, reachable from the host


def config(targets: Sequence[ScrapeTarget], extra_targets: Path, interval_s: int = SCRAPE_INTERVAL_S,
           exporters: Sequence[ScrapeTarget] = ()) -> dict[str, Any]:
    """The drivers as static targets; the nodes' neuron-monitor exporters (`exporters`: the local cluster's
    stand-ins, nodes/neuron_monitor_emulator.py) as static targets of job `neuron-monitor`, and `extra_targets`, a
    file-SD file ([{"targets": [...], "labels": {"node": ...}}]), for more of them (watched: written later, picked
    up)."""
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "scrape_configs": [
            {"job_name": "neuron-dra-driver", "honor_labels": True,
             "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in targets]},
            {"job_name": "neuron-monitor",
             "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in exporters],
             "file_sd_configs": [{"files": [str(extra_targets)], "refresh_interval": f"{interval_s}s"}]},
        ],
    }


def extra_targets_file(directory: Path) -> Path:
    return directory / "neuron-monitor-targets.json"


def add_targets(directory: Path, node: str, addresses: Sequence[str]) -> None:
    """Scrape `addresses` (host:port on the host) as node `node`'s neuron-monitor exporters."""
    path = extra_targets_file(directory)
    groups = json.loads(path.read_text()) if path.exists() else []
    groups.append({"targets": list(addresses), "labels": {"node": node}})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


class LocalPrometheus:
    def __init__(self, directory: Path, binary: Path, port: int) -> None:
        self.dir = directory
        self.binary = binary
        self.port = port
        self._popen: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    pid_file = Under("dir", "pids", "prometheus.pid")
    log = Under("dir", "prometheus.log")

    @property
    def extra_targets(self) -> Path:
        return extra_targets_file(self.dir)

    def start(self, targets: Sequence[ScrapeTarget], lifetime_s: float,
              exporters: Sequence[ScrapeTarget] = ()) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(config(targets, self.extra_targets, exporters=exporters), sort_keys=False))
        argv = [str(self.binary), f"--config.file={conf}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
                "--log.level=warn"]
        self._popen = procs.spawn(argv, log=self.log, pid_file=self.pid_file, lifetime_s=lifetime_s)
        popen = self._popen

        def ready() -> bool:
            if popen.poll() is not None:
                return True
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        if procs.wait_for(ready, READY_TIMEOUT_S) and popen.poll() is None:
            return
        tail = procs.log_tail(self.log)
        self.stop()
        raise PrometheusError(f"Prometheus on port {self.port} did not become ready; {self.log} ends:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        ref = procs.read_pid_file(self.pid_file)
        if ref is not None:
            procs.stop(ref, grace_s, popen=self._popen)
        self.pid_file.unlink(missing_ok=True)


def query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's result vector (`[{"metric": {...}, "value": [t, "v"]}, ...]`)."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    request = f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            answer = json.loads(r.read(MAX_ANSWER))
    except urllib.error.HTTPError as e:
        raise PrometheusError(f"query {expr!r}: HTTP {e.code}: {e.read(2000).decode(errors='replace')}") from e
    if answer.get("status") != "success":
        raise PrometheusError(f"query {expr!r}: {answer.get('error', answer)}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def targets_up(url: str, job: str = "neuron-dra-driver") -> Mapping[str, bool]:
    """node -> whether its last scrape of `job` succeeded."""
    return {r["metric"].get("node", ""): r["value"][1] == "1" for r in query(url, f'up{{job="{job}"}}')}


def attribution(url: str, settle_s: float = 3 * SCRAPE_INTERVAL_S) -> list[tuple[str, str, str, str]]:
    """(node, device, namespace/pod, NeuronCores) of every prepared device, as Prometheus has them after a few
    scrapes (what the demo prints)."""
    time.sleep(settle_s)
    rows = {(m["node"], m["device"], f"{m['namespace']}/{m['pod']}", m["neuroncores"])
            for m in (r["metric"] for r in query(url, "neuron_dra_claim_device_info"))}
    return sorted(rows)
