"""Control-plane profiles (localcluster/controlplane/profiles.py): what each component gets, and a tuned plane
that runs.

The unit tests check the flags and the KubeSchedulerConfiguration a profile produces; the cluster test starts a
tuned control plane and reads the scheduler's effective configuration back from its /configz endpoint, so a
setting the real scheduler ignores or rejects fails here.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

import pytest
import yaml

from neuron_dra.localcluster.controlplane import plane
from neuron_dra.localcluster.controlplane.plane import ControlPlane, ControlPlaneError, Ports
from neuron_dra.localcluster.controlplane.profiles import PROFILES, get_profile, scheduler_config

PORTS = Ports(etcd_client=1, etcd_peer=2, apiserver=3, controller_manager=4, scheduler=5)


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"profile 'fast' is not known; choose one of default, tuned"):
        get_profile("fast")


def test_control_plane_refuses_an_unknown_profile(tmp_path: Path) -> None:
    with pytest.raises(ControlPlaneError, match="profile 'fast' is not known"):
        ControlPlane.start(tmp_path / "cp", profile="fast")


def test_default_profile_runs_the_scheduler_on_its_flags(tmp_path: Path) -> None:
    args = plane._scheduler_args(tmp_path, PORTS, PROFILES["default"])
    assert not any(a.startswith("--config=") for a in args)
    assert f"--kubeconfig={tmp_path / 'kubeconfigs' / 'kube-scheduler.kubeconfig'}" in args
    assert PROFILES["default"].apiserver_args == PROFILES["default"].controller_manager_args == ()


def test_tuned_scheduler_gets_a_config_file_instead_of_its_deprecated_flags(tmp_path: Path) -> None:
    (tmp_path / "kubeconfigs").mkdir()
    args = plane._scheduler_args(tmp_path, PORTS, PROFILES["tuned"])
    config_args = [a for a in args if a.startswith("--config=")]
    assert len(config_args) == 1
    assert not [a for a in args if a.startswith(("--kubeconfig=", "--leader-elect=", "--profiling="))]
    config = yaml.safe_load(Path(config_args[0].split("=", 1)[1]).read_text())
    assert config["clientConnection"] == {"kubeconfig": str(tmp_path / "kubeconfigs" / "kube-scheduler.kubeconfig"),
                                          "qps": 300, "burst": 500}
    assert config["percentageOfNodesToScore"] == 10
    assert config["leaderElection"] == {"leaderElect": True}
    assert config["enableProfiling"] is False


def test_tuned_raises_the_controller_manager_and_apiserver_limits() -> None:
    tuned = PROFILES["tuned"]
    assert tuned.controller_manager_args == ("--kube-api-qps=300", "--kube-api-burst=500")
    assert tuned.apiserver_args == ("--max-requests-inflight=800", "--max-mutating-requests-inflight=400")


def test_profiling_turns_on_pprof_in_the_config() -> None:
    assert scheduler_config(PROFILES["tuned"], Path("/k"), profiling=True)["enableProfiling"] is True


@pytest.mark.cluster
def test_tuned_plane_runs_with_its_settings(tmp_path: Path) -> None:
    with ControlPlane.start(tmp_path / "cp", max_lifetime_s=600, profile="tuned") as plane:
        ctx = ssl.create_default_context(cafile=str(plane.ca_file))
        ctx.load_cert_chain(str(plane.dir / "pki" / "admin.crt"), str(plane.dir / "pki" / "admin.key"))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
        with opener.open(f"https://127.0.0.1:{plane.ports.scheduler}/configz", timeout=10) as resp:
            effective = json.loads(resp.read())["componentconfig"]
        assert effective["clientConnection"]["qps"] == 300
        assert effective["clientConnection"]["burst"] == 500
        assert effective["percentageOfNodesToScore"] == 10
        with opener.open(f"https://127.0.0.1:{plane.ports.controller_manager}/configz", timeout=10) as resp:
            kcm = json.loads(resp.read())["kubecontrollermanager.config.k8s.io"]["Generic"]["ClientConnection"]
        assert (kcm["qps"], kcm["burst"]) == (300, 500)
        assert json.loads((plane.dir / "controlplane.json").read_text())["profile"] == "tuned"


def test_cluster_up_refuses_an_unknown_profile_before_starting_anything(tmp_path: Path) -> None:
    from neuron_dra.localcluster.cluster import ClusterError, up

    with pytest.raises(ClusterError, match=r"--profile 'fast' is not known; choose one of default, tuned"):
        up(tmp_path / "c", ["trn2.48xlarge"], profile="fast")
    assert not (tmp_path / "c").exists()


def test_cluster_up_offers_the_profiles() -> None:
    import argparse

    from neuron_dra.cli import cluster

    parser = argparse.ArgumentParser()
    cluster.configure(parser)
    args = parser.parse_args(["up", "--dir", "/tmp/x", "--profile", "tuned"])
    assert args.profile == "tuned"
    assert parser.parse_args(["up", "--dir", "/tmp/x"]).profile == "default"
