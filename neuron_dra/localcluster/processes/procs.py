"""The local cluster's processes: how they are started, recorded, recognised and stopped (one module for all).

Every long-running process of a local cluster (etcd, the API server, controller-manager, scheduler, each
node's kubelet, fake runtime and driver daemon) is started by `spawn`:

- under coreutils `timeout --kill-after=10 <lifetime>`, in a session of its own, so it dies after its
  lifetime even if every Python process that knew about it was killed with -9;
- `timeout` leads the process group, so signalling the group reaches the process and anything it started;
- a pid file `<pgid> <start time>` records it. The start time (field 22 of /proc/PID/stat, clock ticks
  since boot) identifies the process: a pid reused by an unrelated process never matches, so a stale pid
  file can never make us signal someone else's process.

`alive(ref)` is the one liveness check (a zombie counts as gone), `stop(ref)` the one way to end a group
(TERM, then KILL after a grace period), `stop_all(root)` ends every recorded process under a directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KILL_AFTER_S = 10  # `timeout` sends KILL this long after TERM at the end of the lifetime


class ProcessError(RuntimeError):
    """A process could not be started; the message names the program and why."""


@dataclass(frozen=True)
class ProcessRef:
    """One process (and the group it leads), identified by pid and start time."""

    pid: int
    start_time: int

    def render(self) -> str:
        return f"{self.pid} {self.start_time}\n"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot, or None when no such process exists."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # field 22 overall; fields[0] is field 3


def parent(pid: int) -> int | None:
    """The parent pid of `pid`, or None when no such process exists."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def ref_of(pid: int) -> ProcessRef:
    started = start_time(pid)
    if started is None:
        raise ProcessError(f"process {pid} does not exist")
    return ProcessRef(pid, started)


def alive(ref: ProcessRef) -> bool:
    """The process runs (not a zombie) and is the one recorded (same start time)."""
    fields = _stat_fields(ref.pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == ref.start_time


def write_pid_file(path: Path, ref: ProcessRef) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(ref.render())
    tmp.replace(path)


def read_pid_file(path: Path) -> ProcessRef | None:
    """The process a pid file records, or None when the file is missing or malformed."""
    try:
        parts = path.read_text().split()
        return ProcessRef(int(parts[0]), int(parts[1]))
    except (OSError, ValueError, IndexError):
        return None


def running(path: Path) -> ProcessRef | None:
    """The process a pid file records if it is still alive, else None."""
    ref = read_pid_file(path)
    return ref if ref is not None and alive(ref) else None


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/PID/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            out.extend(int(c) for c in (task / "children").read_text().split())
    return sorted(set(out))


def matching(match: Callable[[int, list[bytes]], bool]) -> list[int]:
    """The pids of the live processes whose (pid, argv) `match` accepts (zombies have no command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv != [b""] and match(int(entry.name), argv):
            found.append(int(entry.name))
    return sorted(found)


def kill(pids: Iterable[int]) -> int:
    """KILL each of `pids` (those already gone are skipped); how many there were."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Call `check` every `interval` s until it returns true (True), or `timeout` s and one last call (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


def log_tail(path: Path, chars: int = 2000) -> str:
    """The end of a log file for an error message; "" when there is none."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def spawn(argv: Sequence[str], *, log: Path, pid_file: Path, lifetime_s: float, cwd: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` under `timeout` in a new session, output appended to `log`, recorded in `pid_file`.

    The returned Popen is the `timeout` process (the group leader); its exit status is the program's
    (124 when the lifetime ran out). The caller reaps it (`wait`/`poll`)."""
    wrapper = shutil.which("timeout")
    if wrapper is None:
        raise ProcessError("coreutils `timeout` is not on PATH; it bounds every local-cluster process's lifetime")
    if lifetime_s < 1:
        raise ProcessError(f"lifetime_s must be at least 1 s, got {lifetime_s}")
    full = [wrapper, f"--kill-after={KILL_AFTER_S}", f"{int(lifetime_s)}s", *argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            popen = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=cwd, env=dict(env) if env is not None else None, start_new_session=True)
        except OSError as e:
            raise ProcessError(f"cannot start {argv[0]}: {e}") from e
    started = start_time(popen.pid)
    # A process that already exited and was reaped has no /proc entry; record it anyway (it is not alive).
    write_pid_file(pid_file, ProcessRef(popen.pid, started if started is not None else -1))
    return popen


def signal_group(ref: ProcessRef, sig: int) -> bool:
    """Send `sig` to the group `ref` leads, if `ref` is still the recorded process; True when sent."""
    if not alive(ref):
        return False
    try:
        os.killpg(ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop(ref: ProcessRef, grace_s: float = 15.0, popen: subprocess.Popen[bytes] | None = None) -> None:
    """TERM the group, wait up to `grace_s` for its leader to exit, then KILL the group.

    With `popen` (when we are the parent) the leader is reaped, so it does not linger as a zombie."""
    if not signal_group(ref, signal.SIGTERM):
        if popen is not None:
            popen.poll()
        return
    wait_for(lambda: popen.poll() is not None if popen is not None else not alive(ref), grace_s, 0.05)
    # KILL whatever is left of the group (children that ignored TERM), even after the leader exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(ref.pid, signal.SIGKILL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)


def stop_pid_file(path: Path, grace_s: float = 15.0) -> bool:
    """Stop the process a pid file records, then remove the file; True when it was running."""
    ref = running(path)
    if ref is not None:
        stop(ref, grace_s)
    path.unlink(missing_ok=True)
    return ref is not None


def stop_all(root: Path, grace_s: float = 15.0) -> list[Path]:
    """Stop every process recorded by a `*.pid` file under `root` (the last resort of `cluster down`);
    returns the pid files of the processes that were running."""
    stopped = []
    for path in sorted(root.rglob("*.pid")):
        if stop_pid_file(path, grace_s):
            stopped.append(path)
    return stopped
