"""The parts of a containerd node that need no running cluster: containerd's and CNI's configuration, the node
namespace scripts, cgroup and shim cleanup, the image cache keys, and the deploy option the DaemonSet gets."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from neuron_dra.driver import deploy
from neuron_dra.localcluster.nodes import containerd, images
from neuron_dra.localcluster.nodes.kubelet import KubeletPaths, KubeletSpec, kubelet_config
from neuron_dra.localcluster.nodes.nodens import (
    HOST_TREE,
    SERVICE_IP,
    NodeNamespacePaths,
    NodeNetwork,
    holder_script,
    network_script,
)


def _paths(tmp_path: Path) -> containerd.ContainerdPaths:
    return containerd.ContainerdPaths(tmp_path / "containerd", tmp_path / "rt" / "cri.sock",
                                      tmp_path / "pids" / "c.pid")


def test_containerd_config_keeps_everything_under_the_node_and_has_the_settings_this_machine_needs(
        tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    text = containerd.config(paths, "localhost/pause:3.10.2")
    import tomli_w

    parsed = tomllib.loads(tomli_w.dumps(text))
    assert parsed["version"] == 3
    assert parsed["root"] == str(paths.root) and parsed["state"] == str(paths.state)
    assert parsed["grpc"]["address"] == str(paths.socket)
    runtime = parsed["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE here
    assert runtime["netns_mounts_under_state_dir"] is True  # not the host's /var/run/netns
    assert "/var/run/cdi" in runtime["cdi_spec_dirs"]
    assert runtime["cni"]["conf_dir"] == str(paths.cni_conf_dir)
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    assert parsed["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/pause:3.10.2"


def test_cni_config_is_a_bridge_without_masquerade_on_the_nodes_subnet() -> None:
    conf = containerd.cni_config("10.202.3.0/24")
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.202.3.0/24"}]]
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "loopback"]


def test_prepare_names_the_missing_debian_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerd, "RUNC", tmp_path / "no-runc")
    with pytest.raises(containerd.ContainerdError, match=r"no-runc is missing.*apt-get install -y runc"):
        containerd.prepare(_paths(tmp_path), "localhost/pause:1", "10.202.1.0/24")


def test_node_networks_differ_per_node() -> None:
    nets = [NodeNetwork(i) for i in range(1, 5)]
    assert len({n.node_ip for n in nets}) == 4 and len({n.pod_subnet for n in nets}) == 4
    assert NodeNetwork(2).node_ip == "10.201.2.2"


def test_holder_script_shadows_run_and_kubelet_dirs_and_mounts_the_host_tree(tmp_path: Path) -> None:
    kp = KubeletPaths(tmp_path / "node", tmp_path / "rt")
    script = holder_script(NodeNamespacePaths(tmp_path / "node", tmp_path / "rt"), kp, tmp_path / "node" / "host")
    lines = script.splitlines()
    assert lines[0] == "set -eu"
    assert f"mount --bind {kp.var_lib} /var/lib" in lines
    # kubelet's root over /var/lib/kubelet comes after /var/lib itself is shadowed
    assert lines.index(f"mount --bind {kp.root} /var/lib/kubelet") > lines.index(f"mount --bind {kp.var_lib} /var/lib")
    assert f"mount --bind {tmp_path / 'node' / 'run'} /run" in lines
    assert f"mount --bind {tmp_path / 'node' / 'host'} {HOST_TREE}" in lines
    assert lines[-1] == "exec sleep infinity"
    assert f"ip addr add {SERVICE_IP}/32 dev lo" in network_script(NodeNetwork(1))


def test_kubelet_gets_the_nodes_cgroup_root_only_with_a_real_runtime(tmp_path: Path) -> None:
    spec = KubeletSpec("n", {}, (), "", "10.201.1.2", tmp_path / "ca", 1, 2, 36)
    paths = KubeletPaths(tmp_path, tmp_path / "rt")
    assert "cgroupRoot" not in kubelet_config(spec, paths)
    from dataclasses import replace

    assert kubelet_config(replace(spec, cgroup_root="/ndra-x/n"), paths)["cgroupRoot"] == "/ndra-x/n"


def test_remove_cgroups_removes_the_nodes_tree_depth_first_in_every_hierarchy(tmp_path: Path) -> None:
    for hierarchy in ("cpu", "memory", "pids"):
        (tmp_path / hierarchy / "ndra-x" / "n1" / "pod" / "ctr").mkdir(parents=True)
    (tmp_path / "memory" / "other").mkdir()
    assert len(containerd.cgroup_dirs("/ndra-x/n1", tmp_path)) == 3
    assert containerd.remove_cgroups("/ndra-x/n1", tmp_path) == []
    for hierarchy in ("cpu", "memory", "pids"):
        assert not (tmp_path / hierarchy / "ndra-x" / "n1").exists()
        assert (tmp_path / hierarchy / "ndra-x").is_dir()  # the parent is the caller's (other nodes)
    assert (tmp_path / "memory" / "other").is_dir()


@pytest.mark.process
def test_shims_are_found_by_the_nodes_socket_only(tmp_path: Path) -> None:
    sock = tmp_path / "cri.sock"
    sleeper = "import time; time.sleep(60)"
    mine = subprocess.Popen(["bash", "-c", f'exec -a /x/containerd-shim-runc-v2 {sys.executable} -c "{sleeper}" '
                             f"-namespace k8s.io -address {sock}"])
    other = subprocess.Popen(["bash", "-c", f'exec -a /x/containerd-shim-runc-v2 {sys.executable} -c "{sleeper}" '
                              f"-namespace k8s.io -address {tmp_path / 'other.sock'}"])
    try:
        deadline = time.monotonic() + 10
        while containerd.shim_pids(sock) != [mine.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert containerd.shim_pids(sock) == [mine.pid]
        assert containerd.kill_shims(sock) == 1
        assert mine.wait(10) == -9
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_host_paths_root_moves_only_the_hosts_device_trees() -> None:
    default = {v["name"]: v["hostPath"]["path"] for v in deploy.daemonset(deploy.DriverDeployOptions())["spec"][
        "template"]["spec"]["volumes"] if "hostPath" in v}
    assert default["host-sys"] == "/sys" and default["host-dev"] == "/dev"
    local = {v["name"]: v["hostPath"]["path"] for v in deploy.daemonset(deploy.DriverDeployOptions(
        host_paths_root="/run/neuron-dra-host"))["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    assert local["host-sys"] == "/run/neuron-dra-host/sys"
    assert local["host-neuron-config"] == "/run/neuron-dra-host/opt/aws/neuron"
    assert {k: v for k, v in local.items() if not k.startswith("host-")} == \
        {k: v for k, v in default.items() if not k.startswith("host-")}


@pytest.mark.parametrize("bad", ["relative", "/a/", "/a//b", "/a/../b"])
def test_host_paths_root_refuses_paths_that_are_not_absolute_and_normalised(bad: str) -> None:
    with pytest.raises(deploy.DeployOptionError, match=r"host_paths_root.*absolute, normalised"):
        deploy.DriverDeployOptions(host_paths_root=bad)


def test_image_keys_change_with_content(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.py").write_text("x = 1\n")
    (tmp_path / "d" / "__pycache__").mkdir()
    (tmp_path / "d" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    key = images.content_hash([tmp_path / "d"], tmp_path)
    (tmp_path / "d" / "__pycache__" / "a.pyc").write_bytes(b"other junk")
    assert images.content_hash([tmp_path / "d"], tmp_path) == key  # bytecode is not content
    (tmp_path / "d" / "a.py").write_text("x = 2\n")
    assert images.content_hash([tmp_path / "d"], tmp_path) != key
    assert images.content_hash([tmp_path / "d"], tmp_path, extra=["base-1"]) != \
        images.content_hash([tmp_path / "d"], tmp_path, extra=["base-2"])


def test_buildah_runs_with_host_etc_and_var_lib_behind_overlays(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name, path=None: f"/usr/bin/{name}")
    argv = images.buildah_argv(tmp_path / "store", tmp_path / "scratch", ["bud", "."])
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = argv[-1]
    assert f"lowerdir=/etc,upperdir={tmp_path / 'scratch' / 'etc' / 'upper'}" in script
    assert "lowerdir=/var/lib," in script and "mount -t tmpfs tmpfs /run" in script
    assert script.splitlines()[-1].startswith("exec /usr/bin/buildah --root")
    assert "--storage-driver vfs bud ." in script


def test_missing_tools_name_the_debian_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name, path=None: None)
    from neuron_dra.localcluster.build import BuildError

    with pytest.raises(BuildError, match=r"`mmdebstrap` is not on PATH \(Debian package mmdebstrap, for the driver "
                                         r"image.s Debian base\); real containers need .*apt-get install -y runc "
                                         r"containernetworking-plugins buildah"):
        images.require_tool("mmdebstrap")


def test_cluster_up_refuses_an_unknown_runtime(tmp_path: Path) -> None:
    from neuron_dra.localcluster.cluster import ClusterError, up

    with pytest.raises(ClusterError, match=r"--runtime 'docker' is not supported; choose one of containerd, fake"):
        up(tmp_path, ["trn2.48xlarge:1"], runtime="docker")


def test_container_logs_are_read_from_the_cri_format_and_the_report_parsed(tmp_path: Path) -> None:
    from neuron_dra.localcluster.processes.podlogs import container_log, parse_cri_log, workload_report

    d = tmp_path / "demo_p1_uid-1" / "main"
    d.mkdir(parents=True)
    (d / "0.log").write_text("2026-12-01T00:00:00Z stdout F workload: devices=neuron0 neuron1\n"
                             "2026-12-01T00:00:00Z stdout P workload: NEURON_RT_VIS\n"
                             "2026-12-01T00:00:00Z stdout F IBLE_CORES=0-7\n"
                             "2026-12-01T00:00:01Z stdout F workload: ready=yes\n")
    (d / "1.log").write_text("2026-12-01T00:00:02Z stdout F workload: devices=neuron3\n")  # after a restart
    assert workload_report(container_log(tmp_path, "demo", "p1", "main"))["devices"] == "neuron3"
    first = workload_report(parse_cri_log((d / "0.log").read_text()))
    assert first == {"devices": "neuron0 neuron1", "NEURON_RT_VISIBLE_CORES": "0-7", "ready": "yes"}
    assert container_log(tmp_path, "demo", "p1", "main", uid="other") == ""
    assert container_log(tmp_path, "demo", "nope", "main") == ""


def test_demo_pods_run_the_workload_images_own_command_with_a_real_runtime() -> None:
    from neuron_dra.localcluster.demo.workloads import IMAGE, pod_manifest, workloads

    w = workloads()[0]
    fake = pod_manifest(w)["spec"]["containers"][0]
    assert fake["image"] == IMAGE and fake["command"] == ["sleep", "infinity"]
    real = pod_manifest(w, image="localhost/neuron-dra-workload:x")["spec"]["containers"][0]
    assert real["image"] == "localhost/neuron-dra-workload:x" and "command" not in real
    assert real["resources"] == fake["resources"]


@pytest.mark.parametrize(("runtime", "prometheus"), [("fake", False), ("containerd", True)])
def test_no_driver_needs_containerd_and_no_prometheus(tmp_path: Path, runtime: str, prometheus: bool) -> None:
    """`cluster up --no-driver` (the nodes for a Helm install, docs/helm.md) is refused before anything is built or
    started where nothing could install the driver (the fake runtime runs it as a host process) or where Prometheus
    would scrape a driver the cluster did not install."""
    from neuron_dra.localcluster.cluster import ClusterError, up

    with pytest.raises(ClusterError, match=r"--no-driver needs --runtime containerd .* and no --prometheus"):
        up(tmp_path, ["trn2.48xlarge:1"], runtime=runtime, prometheus=prometheus, driver=False)
    assert not (tmp_path / "supervisor.pid").exists()
