"""The Karpenter release the components install, against the release localcluster/go/karpenter pins: the same
version, the core module the provider requires, chart values that exist in that release's chart, and zips that
are checked against go.sum (a changed byte is caught)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.components import karpenter as component
from neuron_dra.localcluster.build import BuildError
from tests.support import karpenter

pytestmark = pytest.mark.gobuild


def test_the_component_installs_the_pinned_release() -> None:
    assert karpenter.karpenter_version() == "v" + component.KARPENTER_VERSION
    assert karpenter.required_core_version() == karpenter.core_version()


def paths(values: Any, prefix: str = "") -> set[str]:
    if not isinstance(values, dict) or not values:  # a leaf, or a map the chart leaves empty
        return {prefix}
    return {p for k, v in values.items() for p in paths(v, f"{prefix}.{k}" if prefix else k)}


def test_every_chart_value_the_component_sets_exists_in_the_releases_chart() -> None:
    defaults = karpenter.chart_values()
    ours = component.chart_values(cluster_name="c", queue_name="q", static_capacity=True)
    known = paths(defaults)
    # A leaf we set is a known leaf, or lies under a known map the chart leaves empty (e.g. resources: {}).
    for path in paths(ours):
        assert path in known or any(path.startswith(k + ".") and not _leaf(defaults, k) for k in known), path
    assert defaults["settings"]["featureGates"]["staticCapacity"] is False  # off unless the component sets it
    assert defaults["settings"]["featureGates"]["reservedCapacity"] is True


def _leaf(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def test_a_changed_zip_is_caught(tmp_path: Path) -> None:
    release = karpenter.download(karpenter.AWS_PROVIDER)
    copy = tmp_path / "copy.zip"
    shutil.copy(release.zip_path, copy)
    expected = karpenter.go_sum_hash(karpenter.KARPENTER_MODULE, karpenter.AWS_PROVIDER, release.version)
    assert karpenter.zip_hash(copy) == expected
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(copy) as src, zipfile.ZipFile(changed, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("karpenter.sh_nodepools.yaml"):
                data = data.replace(b"maxItems: 100", b"maxItems: 1000", 1)
            dst.writestr(item, data)
    assert karpenter.zip_hash(changed) != expected


def test_a_zip_whose_hash_is_not_go_sums_is_refused(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text((karpenter.KARPENTER_MODULE / "go.mod").read_text())
    version = karpenter.karpenter_version()
    good = karpenter.go_sum_hash(karpenter.KARPENTER_MODULE, karpenter.AWS_PROVIDER, version)
    lines = (karpenter.KARPENTER_MODULE / "go.sum").read_text().replace(good, "h1:" + "A" * 43 + "=")
    (tmp_path / "go.sum").write_text(lines)
    with pytest.raises(BuildError, match="karpenter-provider-aws"):
        karpenter.download(karpenter.AWS_PROVIDER, tmp_path)


def test_the_crds_are_karpenters_nodepool_nodeclaim_and_ec2nodeclass() -> None:
    crds = {c["metadata"]["name"]: c for c in karpenter.crds()}
    assert set(crds) == {"nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "ec2nodeclasses.karpenter.k8s.aws"}
    assert [v["name"] for v in crds["nodepools.karpenter.sh"]["spec"]["versions"] if v["served"]] == ["v1"]
