"""Containers' logs (what `kubectl logs` shows), and what the workload image reports in them.

`api_container_log` reads them as `kubectl logs` does: the API server's pod `log` subresource, which the API
server serves by asking the pod's kubelet (kubeletaccess.py). The files themselves, for diagnostics when that
path fails: kubelet writes each container's output to `<podLogsDir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`
in the CRI log format, one `<RFC 3339 time> <stdout|stderr> <F|P> <text>` line per chunk (P: the line goes on in
the next chunk). The workload image (localcluster/nodes/workload/workload.sh) prints `workload: key=value` lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_LOG_BYTES = 1 << 20  # a workload's report is a few lines; never read more than this


def api_container_log(core: Any, namespace: str, pod: str, container: str) -> str:
    """The log of `container` through the API (`GET .../pods/POD/log?container=C`, a `kubernetes.client.CoreV1Api`
    `core`); at most MAX_LOG_BYTES. Raises the client's ApiException when the API server cannot get it."""
    response = core.read_namespaced_pod_log(pod, namespace, container=container, limit_bytes=MAX_LOG_BYTES,
                                            _preload_content=False)
    return bytes(response.data).decode(errors="replace")


def container_log(pod_logs: Path, namespace: str, pod: str, container: str, uid: str | None = None) -> str:
    """The text of the newest log of `container` (all pods of that name when `uid` is None, newest first)."""
    pattern = f"{namespace}_{pod}_{uid or '*'}"
    logs = sorted((d / container for d in pod_logs.glob(pattern) if (d / container).is_dir()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for d in logs:
        files = sorted(d.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1, reverse=True)
        if files:
            return parse_cri_log(files[0].read_bytes()[:MAX_LOG_BYTES].decode(errors="replace"))
    return ""


def parse_cri_log(text: str) -> str:
    out: list[str] = []
    partial = ""
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        tag, body = parts[2], parts[3] if len(parts) == 4 else ""
        if tag == "P":
            partial += body
            continue
        out.append(partial + body)
        partial = ""
    return "\n".join(out) + ("\n" if out else "")


def workload_report(log: str) -> dict[str, str]:
    """The `workload: key=value` lines of a workload container's log (the last value of a key wins)."""
    report: dict[str, str] = {}
    for line in log.splitlines():
        if line.startswith("workload: ") and "=" in line:
            key, _, value = line[len("workload: "):].partition("=")
            report[key] = value
    return report
