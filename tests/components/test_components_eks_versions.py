"""Versions EKS really offers: one table (components/eks_versions.py, its source in docs/kubernetes-versions.md);
a minor EKS does not offer is refused for EKS (not for the driver on a local cluster), and a minor past standard
support gets a preview warning with the date and the extra cost."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import pytest

from neuron_dra.components import eks_versions
from neuron_dra.components.cluster import TrainiumCluster, TrainiumClusterArgs
from neuron_dra.components.driver import NeuronDraDriverArgs
from neuron_dra.components.mocks import run_offline
from neuron_dra.components.settings import SettingError, check_eks_version, kubernetes_version_warnings
from neuron_dra.components.settings_schema import decode_settings

ROOT = Path(__file__).resolve().parents[2]
TODAY = date(2026, 12, 4)


def test_the_docs_table_is_the_code_table() -> None:
    text = (ROOT / "docs" / "kubernetes-versions.md").read_text()
    rows = re.findall(r"^\| (1\.\d+) \| (\S+) \| (\S+) \| (\S+) \| (\S+) \|$", text, re.M)
    assert [(r[0], *map(date.fromisoformat, r[1:])) for r in rows] == [
        (v.minor, v.upstream_release, v.eks_release, v.end_of_standard_support, v.end_of_extended_support)
        for v in eks_versions.EKS_VERSIONS]
    assert "Understand the Kubernetes version lifecycle on EKS" in text
    for v in eks_versions.EKS_VERSIONS:  # 14 months of standard support, then 12 of extended
        months = (v.end_of_standard_support.year - v.eks_release.year) * 12 + (
            v.end_of_standard_support.month - v.eks_release.month)
        assert months == 14 and v.end_of_extended_support == v.end_of_standard_support.replace(
            year=v.end_of_standard_support.year + 1), v.minor


@pytest.mark.parametrize("where", ["cluster", "stack", "node group"])
def test_a_minor_eks_does_not_offer_is_refused_for_eks(where: str) -> None:
    with pytest.raises(SettingError) as err:
        if where == "cluster":
            TrainiumClusterArgs(kubernetes_version="1.37")
        elif where == "stack":
            decode_settings({"neuron-dra:kubernetesVersion": "1.37"})
        else:
            decode_settings({"neuron-dra:nodeGroups": '[{"name": "a", "version": "1.37"}]'})
    assert err.value.value == "1.37"
    assert err.value.field in ("TrainiumClusterArgs.kubernetes_version", "neuron-dra:kubernetesVersion",
                               "neuron-dra:nodeGroups[0].version")
    assert err.value.allowed.startswith("1.34 to 1.36, the minors EKS offers")
    assert "EKS does not offer 1.37" in err.value.allowed


def test_the_driver_on_a_local_cluster_may_run_1_37() -> None:
    assert NeuronDraDriverArgs(kubernetes_version="1.37", image="r.example.com/d:1").deploy_options.serves(
        "core_device_class")


def test_past_standard_support_warns_with_the_date_and_the_cost() -> None:
    (warning,) = kubernetes_version_warnings("1.34", today=TODAY)
    assert "left EKS standard support on 2026-12-02" in warning and "extra per cluster-hour" in warning
    assert "until 2027-12-02" in warning
    assert kubernetes_version_warnings("1.36", today=TODAY) == []
    (soon,) = kubernetes_version_warnings("1.35", today=date(2027, 2, 1))
    assert "ends on 2027-03-27 (in 54 days)" in soon and "extra per cluster-hour" in soon
    assert kubernetes_version_warnings("1.35", today=date(2027, 1, 25)) == []  # 61 days ahead: not yet


def test_past_extended_support_eks_creates_no_cluster() -> None:
    assert check_eks_version("s", "1.34", today=date(2027, 12, 2)).minor == "1.34"
    with pytest.raises(SettingError) as err:
        check_eks_version("s", "1.34", today=date(2027, 12, 3))
    assert "ended extended support of 1.34 on 2027-12-02" in err.value.allowed
    assert err.value.allowed.startswith("1.35 to 1.36, the minors EKS offers")


def test_the_cluster_warns_at_preview(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("neuron_dra.components.settings.today_utc", lambda: TODAY)
    run_offline(lambda: TrainiumCluster("trn", TrainiumClusterArgs(kubernetes_version="1.34")))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("trn: Kubernetes 1.34 left EKS standard support on 2026-12-02") for w in warnings)
    caplog.clear()
    run_offline(lambda: TrainiumCluster("trn", TrainiumClusterArgs(kubernetes_version="1.36")))
    assert not [r for r in caplog.records if "standard support" in r.getMessage()]


@pytest.mark.parametrize("version", ["1.38", "1.33", "2.0", "1.36.1", "latest"])
def test_a_version_outside_the_table_is_told_what_eks_allows(version: str) -> None:
    """Issue 39: outside the table, EKS contexts state EKS's range (1.34 to 1.36), not the driver's (to 1.37)."""
    for make in (lambda: TrainiumClusterArgs(kubernetes_version=version),
                 lambda: decode_settings({"neuron-dra:kubernetesVersion": version})):
        with pytest.raises(SettingError) as err:
            make()
        assert err.value.value == version and err.value.allowed.startswith("1.34 to 1.36")
        assert "1.37" not in err.value.allowed.split("(")[0]
