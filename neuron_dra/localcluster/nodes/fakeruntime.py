"""The fake CRI runtime of an emulated node (`go/fakecri`): how it is started, and what it recorded.

It runs no containers. For every CreateContainer it resolves the CDI device ids kubelet passed against the
node's CDI directory (failing the container on an unknown id, as containerd does) and appends one JSON line
to the node's record file:

    {"event": "CreateContainer", "pod": {"namespace", "name", "uid"}, "container", "attempt", "cdiDevices": [ids
     as kubelet passed them], "env": {container env + CDI env edits}, "deviceNodes": [CDI device nodes],
     "containerId", "sandboxId", "time"}            (or "error" instead of containerId/env/deviceNodes)
    {"event": "RemovePodSandbox", "pod": {...}, "sandboxId", "time"}

The demo's table and the end-to-end tests read these records: they are what a container would have got.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.localcluster.processes import procs


@dataclass(frozen=True)
class RuntimePaths:
    socket: Path
    cdi_dir: Path
    records: Path
    log: Path
    pid_file: Path


def start(binary: Path, paths: RuntimePaths, lifetime_s: float) -> subprocess.Popen[bytes]:
    paths.cdi_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), "--socket", str(paths.socket), "--cdi-dir", str(paths.cdi_dir),
            "--record", str(paths.records)]
    return procs.spawn(argv, log=paths.log, pid_file=paths.pid_file, lifetime_s=lifetime_s)


def records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record line of a node's record file, oldest first (a line being written is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            yield entry


def created_containers(path: Path, namespace: str, pod: str, uid: str | None = None) -> dict[str, dict[str, Any]]:
    """The latest successful CreateContainer record of each container of a pod (of the pod with `uid` if given:
    a pod re-created under the same name has a new uid)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in records(path):
        who = entry.get("pod") or {}
        if entry.get("event") != "CreateContainer" or entry.get("error"):
            continue
        if who.get("namespace") != namespace or who.get("name") != pod or (uid is not None and who.get("uid") != uid):
            continue
        out[str(entry["container"])] = entry
    return out
