"""What `cluster up --network-policy` refuses before it builds or starts anything (that the enforcer enforces is
tests/e2e/test_e2e_network_policy.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def test_network_policy_needs_the_containerd_runtime(tmp_path: Path) -> None:
    from neuron_dra.localcluster.cluster import ClusterError, up

    with pytest.raises(ClusterError, match=r"--network-policy needs --runtime containerd .* not 'fake'"):
        up(tmp_path, ["trn2.48xlarge:1"], runtime="fake", network_policy=True)
    assert not (tmp_path / "supervisor.pid").exists()


def test_missing_ipset_is_named_with_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_dra.localcluster.nodes import netpol

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "ipset" else real(tool))
    with pytest.raises(netpol.NetworkPolicyError, match=r"^ipset not on PATH;.*apt-get install -y iptables ipset"):
        netpol.require_tools()

