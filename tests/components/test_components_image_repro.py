"""Issue 39 findings 3-5: the driver image the stack builds is reproducible across machines, and existing-cluster
mode creates no AWS resource.

Reproducible: the docker-build Image's inputs hold no path of the machine (the build context is staged under the
working directory, named by its content's tag, with fixed file modes: pulumi-docker-build hashes them), and
`buildOnPreview` is false, so `pulumi preview` needs no Docker. Two installs of the same package (another venv,
Python version and umask) give identical inputs and identical staged trees; a second staging writes nothing.
Existing cluster: the image is given (`driverImage`) or built into a registry of the user's
(`driverImageRegistry`); neither is refused at preview, naming both."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from neuron_dra.components import driver_image
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.plan import plan
from neuron_dra.components.settings import SettingError
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions

KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters: []\n"
REGISTRY = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/neuron-dra-driver"
SOURCES = {"neuron_dra/driver/model/x.py": "X = 1\n", "neuron_dra/driver/daemon/y.py": "Y = 2\n"}


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def site_packages(root: Path, python: str, mask: int) -> Path:
    """A fake install of the package: the build context's files under <venv>/lib/<python>/site-packages, written
    under `mask` (pip's files take the installing user's umask), with a bytecode cache of that Python."""
    site = root / "lib" / python / "site-packages"
    with umask(mask):
        for rel in (*map(str, driver_image.CONTEXT_FILES), *SOURCES):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(SOURCES.get(rel, f"# {rel}\n"))
        cache = site / "neuron_dra" / "driver" / "model" / "__pycache__"
        cache.mkdir()
        (cache / f"x.cpython-{python.removeprefix('python').replace('.', '')}.pyc").write_bytes(os.urandom(16))
    return site


def image_inputs(args: NeuronDraDriverArgs) -> tuple[OfflineRun[Any], dict[str, Any]]:
    def program() -> NeuronDraDriver:
        provider = k8s.Provider("target", kubeconfig="{}")
        return NeuronDraDriver("drv", args, opts=pulumi.ResourceOptions(provider=provider))

    run = run_offline(program)
    inputs: dict[str, Any] = run.one("docker-build:index:Image").plain_inputs
    return run, inputs


def without_password(inputs: dict[str, Any]) -> dict[str, Any]:
    return {**inputs, "registries": [{k: v for k, v in r.items() if k != "password"} for r in inputs["registries"]]}


def test_two_installs_give_identical_image_inputs_with_no_machine_path(tmp_path: Path) -> None:
    a = site_packages(tmp_path / "ci" / "venv", "python3.11", 0o022)
    b = site_packages(tmp_path / "laptop" / ".venv", "python3.12", 0o002)
    _, first = image_inputs(NeuronDraDriverArgs(source_dir=a))
    _, second = image_inputs(NeuronDraDriverArgs(source_dir=b))
    assert without_password(first) == without_password(second)  # no diff, so no rebuild and no push
    assert first["buildOnPreview"] is False  # preview builds nothing: no Docker needed there
    assert str(tmp_path) not in repr(first) and "site-packages" not in repr(first)
    tag = driver_image.context_tag(a)
    assert first["context"] == {"location": f".neuron-dra/driver-image/{tag}"}
    assert first["tags"][0].endswith(f":{tag}")


def test_staging_fixes_modes_and_a_second_staging_writes_nothing(tmp_path: Path) -> None:
    a = site_packages(tmp_path / "a", "python3.11", 0o022)
    b = site_packages(tmp_path / "b", "python3.12", 0o002)
    assert (b / "neuron_dra/driver/model/x.py").stat().st_mode & 0o777 == 0o664  # the install's umask shows
    staged = driver_image.staged_context(a)
    assert driver_image.staged_context(b) == staged
    trees = []
    for source, work in ((a, tmp_path / "w1"), (b, tmp_path / "w2")):
        with umask(0o077):
            target = driver_image.stage(source, staged, work)
        assert target == work / staged.location
        trees.append({p.relative_to(target).as_posix(): (stat.S_IMODE(p.stat().st_mode), p.is_file() and p.read_bytes())
                      for p in target.rglob("*")})
    assert trees[0] == trees[1]
    files = {name: mode for name, (mode, _) in trees[0].items() if name in staged.files}
    assert set(files) == set(staged.files) and set(files.values()) == {0o644}
    assert not any("__pycache__" in name for name in trees[0])
    assert (tmp_path / "w1" / ".neuron-dra" / ".gitignore").read_text().endswith("*\n")
    marker = (tmp_path / "w1" / staged.location / "neuron_dra/driver/model/x.py").stat()
    driver_image.stage(a, staged, tmp_path / "w1")
    again = (tmp_path / "w1" / staged.location / "neuron_dra/driver/model/x.py").stat()
    assert (again.st_ino, again.st_mtime_ns) == (marker.st_ino, marker.st_mtime_ns)  # nothing rewritten
    # A changed source: a new tag and directory; the old version's context goes.
    (a / "neuron_dra/driver/model/x.py").write_text("X = 3\n")
    changed = driver_image.staged_context(a)
    assert changed.tag != staged.tag and changed.location != staged.location
    driver_image.stage(a, changed, tmp_path / "w1")
    assert sorted(p.name for p in (tmp_path / "w1" / driver_image.STAGE_ROOT).iterdir()) == [changed.tag]
    # A planted file in a staged copy is not kept: the copy is made again from the package.
    planted = tmp_path / "w2" / staged.location / "neuron_dra/driver/.env"
    planted.write_text("AWS_SECRET_ACCESS_KEY=x\n")
    driver_image.stage(b, staged, tmp_path / "w2")
    assert not planted.exists()


def test_existing_cluster_without_an_image_is_refused_naming_both_ways() -> None:
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:kubeconfig": KUBECONFIG})
    assert err.value.setting == "neuron-dra:driverImage"
    assert "neuron-dra:driverImageRegistry" in err.value.allowed and "creates no AWS resource" in err.value.allowed
    with pytest.raises(SettingError) as both:
        decode_settings({"neuron-dra:kubeconfig": KUBECONFIG, "neuron-dra:driverImage": "example.com/d:1",
                         "neuron-dra:driverImageRegistry": REGISTRY})
    assert both.value.setting == "neuron-dra:driverImageRegistry"


@pytest.mark.parametrize("registry", ["", "Example.com/UPPER", f"{REGISTRY}:1.0", f"{REGISTRY}\n", "noslash"])
def test_a_bad_registry_names_the_setting(registry: str) -> None:
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:driverImageRegistry": registry} if registry else
                        {"neuron-dra:driverImageRegistry": "-"})
    assert err.value.setting == "neuron-dra:driverImageRegistry"
    with pytest.raises(SettingError, match="driverImageRegistry"):
        NeuronDraDriverArgs(image_registry=registry or "-")


def test_existing_cluster_builds_into_the_given_registry_and_creates_no_aws_resource() -> None:
    run = plan({"neuron-dra:kubeconfig": KUBECONFIG, "neuron-dra:driverImageRegistry": REGISTRY,
                "neuron-dra:clusterInstanceTypes": '["trn2.48xlarge"]', "neuron-dra:efaDriver": "external"})
    assert [r.type for r in run.resources if r.type.startswith("aws:")] == []
    assert [i.token for i in run.invokes if i.token.startswith("aws:")] == []
    image = run.one("docker-build:index:Image").plain_inputs
    tag = f"{REGISTRY}:{image['context']['location'].rsplit('/', 1)[1]}"
    assert image["tags"] == [tag] and not image.get("registries") and image["buildOnPreview"] is False
    (ds,) = [r.plain_inputs for r in run.of_type("kubernetes:apps/v1:DaemonSet")
             if r.plain_inputs["metadata"]["name"] == deploy.DEFAULT_DAEMONSET]  # neuron-monitor's is beside it
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].startswith(f"{tag}@sha256:")
    assert run.exports["driverImage"].startswith(f"{tag}@sha256:")


def test_a_given_image_plans_no_build_and_no_aws_resource() -> None:
    image = "registry.example.com/neuron-dra-driver@sha256:" + "a" * 64
    run = plan({"neuron-dra:kubeconfig": KUBECONFIG, "neuron-dra:driverImage": image,
                "neuron-dra:clusterInstanceTypes": '["trn2.48xlarge"]', "neuron-dra:efaDriver": "external"})
    assert not [r for r in run.resources if r.type.startswith(("aws:", "docker-build:"))]
    assert run.exports["driverImage"] == image


def test_the_component_builds_into_a_registry_without_a_repository(tmp_path: Path) -> None:
    site = site_packages(tmp_path / "v", "python3.11", 0o022)
    run, image = image_inputs(NeuronDraDriverArgs(source_dir=site, image_registry=REGISTRY,
                                                  options=DriverDeployOptions()))
    assert not [r for r in run.resources if r.type.startswith("aws:")]
    assert image["tags"] == [f"{REGISTRY}:{driver_image.context_tag(site)}"]
    with pytest.raises(SettingError, match="unset when image is given"):
        NeuronDraDriverArgs(image="example.com/d:1", image_registry=REGISTRY)
