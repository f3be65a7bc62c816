"""A STAND-IN for neuron-monitor's Prometheus exporter on an emulated node: no Neuron runtime runs here, so nothing
real can report NeuronCore utilisation. It serves the real exporter's metric names and labels
(deploy/exporter.py: METRICS, INSTANCE_LABELS) with values read from the node's emulated state, so the dashboard's
joins are exercised as on a real node (docs/utilisation.md).

The state is a JSON file in the node's host tree (STATE_FILE), written by `neuron-dra emulate-utilisation` (or
`set_runtime` / `clear_runtimes` here), like the fault emulation's counters: one entry per emulated Neuron runtime
(neuron-monitor's `runtime_tag`: the runtime's process id on a real node), with the NeuronCores it uses, their
utilisation, and the device and host memory it holds. As on a real node, a core no runtime uses has no series.
A file that is missing or unreadable gives no runtime series (and a line on stderr), never a crash.

Run per node by the supervisor: `python -m neuron_dra.localcluster.nodes.neuron_monitor_emulator --host-root DIR
--port N --instance-type T --instance-id I`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from neuron_dra.driver.deploy import exporter
from neuron_dra.localcluster.nodes.topology import NodePaths, NodeSpec
from neuron_dra.localcluster.processes import procs

STATE_FILE = "run/neuron-monitor-emulated.json"  # under the node's host root
MAX_STATE_BYTES = 1 << 20
MAX_RUNTIMES = 64
MAX_CORE_ID = 1023
# The stand-in's fixed instance labels; instance_id and instance_type are the node's.
REGION = "us-east-2"
AVAILABILITY_ZONE = "us-east-2b"
SUBNET_ID = "subnet-0emulated0000000"
# execution_latency_seconds by percentile, as a fraction of the runtime's latency (p50 = the value set).
LATENCY_SHAPE = {"p0": 0.5, "p1": 0.6, "p25": 0.9, "p50": 1.0, "p75": 1.2, "p99": 2.0, "p100": 3.0}


class StateError(ValueError):
    """Emulated utilisation refused: the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class Runtime:
    tag: str
    cores: Mapping[int, float]  # NeuronCore id (NEURON_RT_VISIBLE_CORES numbering) -> utilisation 0..1
    device_bytes: int = 0  # Neuron device memory held, spread evenly over its cores
    host_bytes: int = 0
    latency_s: float = 0.0  # median execution latency

    def to_json(self) -> dict[str, Any]:
        return {"cores": {str(c): u for c, u in sorted(self.cores.items())}, "deviceBytes": self.device_bytes,
                "hostBytes": self.host_bytes, "latencySeconds": self.latency_s}


def state_path(host_root: Path) -> Path:
    return host_root / STATE_FILE


def _runtime(tag: str, entry: Any) -> Runtime:
    if not isinstance(entry, dict) or not isinstance(entry.get("cores"), dict):
        raise StateError(f"runtime {tag!r}: expected an object with 'cores', got {entry!r:.200}")
    cores: dict[int, float] = {}
    for core, util in entry["cores"].items():
        cores[check_core(core)] = check_ratio(util)
    return Runtime(tag, cores, _count(entry.get("deviceBytes", 0), "deviceBytes"),
                   _count(entry.get("hostBytes", 0), "hostBytes"),
                   float(check_ratio(entry.get("latencySeconds", 0.0), upper=3600.0, what="latencySeconds")))


def check_core(core: object) -> int:
    try:
        value = int(str(core))
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_CORE_ID:
        raise StateError(f"core {core!r}: not allowed; a NeuronCore id from 0 to {MAX_CORE_ID}")
    return value


def check_ratio(value: object, upper: float = 1.0, what: str = "utilisation") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= upper:
        raise StateError(f"{what} {value!r}: not allowed; a number from 0 to {upper:g}")
    return float(value)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 50:
        raise StateError(f"{what} {value!r}: not allowed; a whole number of bytes from 0 to 2^50")
    return value


def read_runtimes(host_root: Path) -> list[Runtime]:
    """The emulated runtimes of a node; StateError when the file is not what `set_runtime` writes."""
    path = state_path(host_root)
    if not path.exists():
        return []
    try:
        with path.open("rb") as f:
            raw = json.loads(f.read(MAX_STATE_BYTES + 1) or b"{}")
    except (OSError, ValueError) as e:
        raise StateError(f"{path}: not readable JSON: {e}") from e
    runtimes = raw.get("runtimes") if isinstance(raw, dict) else None
    if not isinstance(runtimes, dict) or len(runtimes) > MAX_RUNTIMES:
        raise StateError(f"{path}: expected {{'runtimes': {{TAG: ...}}}} with at most {MAX_RUNTIMES} runtimes")
    return [_runtime(str(tag), entry) for tag, entry in sorted(runtimes.items())]


def _write(host_root: Path, runtimes: Iterable[Runtime]) -> None:
    path = state_path(host_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"runtimes": {r.tag: r.to_json() for r in runtimes}}, indent=1))
    tmp.replace(path)  # atomic: the exporter never reads half a file


def set_runtime(host_root: Path, runtime: Runtime) -> None:
    """Add or replace one emulated runtime (by tag); StateError, and nothing written, for a value not allowed."""
    _runtime(runtime.tag, runtime.to_json())
    others = [r for r in read_runtimes(host_root) if r.tag != runtime.tag]
    if len(others) >= MAX_RUNTIMES:
        raise StateError(f"runtime {runtime.tag!r}: not added; a node emulates at most {MAX_RUNTIMES} runtimes")
    _write(host_root, [*others, runtime])


def clear_runtimes(host_root: Path, tag: str | None = None) -> None:
    """Remove one runtime, or all (tag None)."""
    _write(host_root, [] if tag is None else [r for r in read_runtimes(host_root) if r.tag != tag])


def instance_id_for(node: str) -> str:
    return "i-0" + hashlib.sha256(node.encode()).hexdigest()[:16]


class EmulatedNeuronMonitor(Collector):
    """neuron-monitor-prometheus.py's runtime series from the emulated state, rebuilt at every scrape."""

    def __init__(self, host_root: Path, instance_type: str, instance_id: str) -> None:
        self._host_root = host_root
        self._instance = {"availability_zone": AVAILABILITY_ZONE, "instance_id": instance_id, "instance_name": "",
                          "instance_type": instance_type, "region": REGION, "subnet_id": SUBNET_ID}
        self._last_error = ""

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []

    def _family(self, name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=[*exporter.METRICS[name], *exporter.INSTANCE_LABELS])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            runtimes = read_runtimes(self._host_root)
            self._last_error = ""
        except StateError as e:
            if str(e) != self._last_error:  # once per distinct error, not per scrape
                print(f"neuron-monitor stand-in: {e}", file=sys.stderr, flush=True)
                self._last_error = str(e)
            runtimes = []
        inst = [self._instance[k] for k in exporter.INSTANCE_LABELS]
        util = self._family(exporter.UTILISATION, "NeuronCore utilization ratio")
        memory = {name: self._family(name, f"NeuronCore memory usage ({kind}) bytes")
                  for name, kind in zip(exporter.CORE_MEMORY, exporter.CORE_MEMORY_KINDS, strict=True)}
        runtime_memory = self._family(exporter.RUNTIME_MEMORY, "Runtime memory used bytes")
        latency = self._family(exporter.LATENCY, "Execution latency seconds")
        for r in runtimes:
            per_core = r.device_bytes // len(r.cores) if r.cores else 0
            for core, ratio in sorted(r.cores.items()):
                util.add_metric([str(core), r.tag, *inst], ratio)
                for name, kind in zip(exporter.CORE_MEMORY, exporter.CORE_MEMORY_KINDS, strict=True):
                    memory[name].add_metric([str(core), r.tag, *inst], per_core if kind == "tensors" else 0)
            runtime_memory.add_metric(["host", r.tag, *inst], r.host_bytes)
            runtime_memory.add_metric(["neuron_device", r.tag, *inst], r.device_bytes)
            for percentile in exporter.LATENCY_PERCENTILES:
                latency.add_metric([percentile, r.tag, *inst], r.latency_s * LATENCY_SHAPE[percentile])
        yield util
        yield from memory.values()
        yield runtime_memory
        yield latency


def start(paths: NodePaths, node: NodeSpec, port: int, lifetime_s: float) -> subprocess.Popen[bytes]:
    """The node's stand-in on loopback `port`, its pid file among the node's (stopped with the node's processes)."""
    argv = [sys.executable, "-m", __name__, "--host-root", str(paths.host_root), "--port", str(port),
            "--instance-type", node.instance_type, "--instance-id", instance_id_for(node.name)]
    return procs.spawn(argv, log=paths.base / "neuron-monitor.log", pid_file=paths.pids / "neuron-monitor.pid",
                       lifetime_s=lifetime_s, env=dict(os.environ))


def registry_for(host_root: Path, instance_type: str, instance_id: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(EmulatedNeuronMonitor(host_root, instance_type, instance_id))
    return registry


def main(argv: list[str] | None = None) -> int:
    from prometheus_client import start_http_server

    parser = argparse.ArgumentParser(prog="neuron-monitor-emulator", description=__doc__.splitlines()[0])
    parser.add_argument("--host-root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--instance-type", required=True)
    parser.add_argument("--instance-id", required=True)
    args = parser.parse_args(argv)
    registry = registry_for(args.host_root, args.instance_type, args.instance_id)
    start_http_server(args.port, addr=args.address, registry=registry)
    print(f"neuron-monitor stand-in for {args.host_root} on {args.address}:{args.port}", flush=True)
    threading.Event().wait()  # the server thread serves; the lifetime wrapper (procs.spawn) ends us
    return 0


if __name__ == "__main__":
    sys.exit(main())
