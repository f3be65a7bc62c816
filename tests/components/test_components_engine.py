"""The real Pulumi engine (CLI v3.274.1, Kubernetes provider 4.25.0, built by localcluster/build.py) runs the
project's own Pulumi.yaml and programs through the Automation API with inline programs.

- The engine accepts Pulumi.yaml's declarations with only `aws:region` (or only `kubeconfig`) set; a
  declaration without a default makes it refuse the stack, which mocks cannot see.
- The default stack program in existing-cluster mode against a local control plane: `up` (every object in the
  apiserver as planned), a second `up` with no change, a setting change that `preview` shows as exactly the
  expected diff and `up` applies, `destroy` leaving nothing.
- The same for a separate project that pip-installs this package into a virtualenv and composes the components.

Names differ from what `neuron-dra cluster up` installs: the provider would silently adopt same-named objects.
Every step runs in its own process (tests/support/engine_driver.py); step timings are printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.components.claims import module_templates
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.localcluster.controlplane import ControlPlane
from tests.components.test_components_import import (
    PACKAGE_PARTS,
    environment_without_this_checkout,
    with_packages_of_this_interpreter,
)
from tests.support.e2e import eventually
from tests.support.pulumi_engine import DRIVER, Engine, is_subset, read_object

# gobuild: the first use builds the CLI and provider (minutes), cached after.
pytestmark = [pytest.mark.pulumi_engine, pytest.mark.gobuild, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STACK_PROGRAM = "neuron_dra.components.stack:run_program"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = Engine.prepare(tmp_path_factory.mktemp("pulumi-engine"))
    yield eng
    print(f"\nengine step timings (s): {json.dumps(eng.timings)}")


def project_dir(tmp_path: Path, pulumi_yaml: str | None = None) -> Path:
    work = tmp_path / "project"
    work.mkdir(parents=True)
    (work / "Pulumi.yaml").write_text(pulumi_yaml if pulumi_yaml is not None else (ROOT / "Pulumi.yaml").read_text())
    return work


def test_the_engine_accepts_pulumi_yaml_with_only_the_minimal_config(engine: Engine, tmp_path: Path) -> None:
    work = project_dir(tmp_path)
    report = "tests.support.engine_programs:settings_report"
    new = engine.step("up", work_dir=work, stack="aws-only", program=report, config={"aws:region": "us-east-2"})
    assert new["outputs"]["existingCluster"] is False
    assert new["outputs"]["kubernetesVersion"] == "1.36"
    assert new["outputs"]["nodeGroups"] == ["trn2"]
    # The engine passed Pulumi.yaml's defaults ("" and [] for optional settings): they decode to the defaults.
    assert new["outputs"]["settings"] == repr(decode_settings({}))

    kubeconfig = str(tmp_path / "kubeconfig")
    existing = engine.step("up", work_dir=work, stack="kubeconfig-only", program=report,
                           config={"neuron-dra:kubeconfig": kubeconfig})
    assert existing["outputs"]["existingCluster"] is True
    assert existing["outputs"]["settings"] == repr(decode_settings({"kubeconfig": kubeconfig}))

    # The control: one declaration without a default, and the engine refuses the same minimal stack.
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    del doc["config"]["clusterName"]["default"]
    strict = project_dir(tmp_path / "strict", yaml.safe_dump(doc))
    refused = engine.step("up", work_dir=strict, stack="aws-only", program=report,
                          config={"aws:region": "us-east-2"}, check=False)
    assert "is missing configuration value 'clusterName'" in refused["error"]


def planned_driver(options: DriverDeployOptions) -> list[dict[str, Any]]:
    return deploy.manifests(options)


def assert_live_as_planned(api: Any, planned: list[dict[str, Any]]) -> None:
    for manifest in planned:
        live = read_object(api, manifest)
        assert live is not None, f"{deploy.object_key(manifest)} is not in the apiserver"
        differences = is_subset({k: v for k, v in manifest.items() if k != "status"}, live)
        assert not differences, (deploy.object_key(manifest), differences)


def assert_all_gone(api: Any, planned: list[dict[str, Any]]) -> None:
    def gone(manifest: dict[str, Any]) -> bool:
        return read_object(api, manifest) is None

    for manifest in planned:
        # A namespace is gone once its finalizers ran (the controller-manager empties it first).
        eventually(lambda: gone(manifest), 120, what=f"{deploy.object_key(manifest)} gone")  # noqa: B023


def changed_kinds(before: DriverDeployOptions, after: DriverDeployOptions) -> list[str]:
    """The kinds of the driver's objects whose manifests differ between two option sets: what an update must touch."""
    return sorted(a["kind"] for a, b in zip(deploy.manifests(before), deploy.manifests(after), strict=True) if a != b)


def kubernetes_events(result: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [e for e in result["events"] if e["op"] == op and e["type"].startswith("kubernetes:")]


@pytest.mark.cluster
def test_the_stack_program_up_again_change_and_destroy(engine: Engine, plane: ControlPlane, api: Any,
                                                        tmp_path: Path) -> None:
    work = project_dir(tmp_path)
    image = "registry.invalid/neuron-dra-driver:engine-test"
    config = {
        "neuron-dra:kubeconfig": str(plane.kubeconfig),
        "neuron-dra:driverNamespace": "engine-stack-dra",
        "neuron-dra:driverName": "engine-stack.neuron.aws.com",
        "neuron-dra:neuronCoreDeviceClass": "engine-stack.neuroncore.aws.com",
        "neuron-dra:driverImage": image,
        "neuron-dra:driverRolloutTimeoutSeconds": "120",
        # The default templates include an EFA-aligned one: on an existing cluster the stack must be told who
        # publishes EFA devices (the refusal is tested in test_components_efa_driver.py).
        "neuron-dra:efaDriver": "external",
    }
    settings = decode_settings(config)
    options = replace(settings.driver_options(), image=image)
    templates = [dict(t.to_manifest()) for t in module_templates(settings.claim_templates_module)]
    planned = planned_driver(options) + templates
    step: dict[str, Any] = {"work_dir": work, "stack": "existing", "program": STACK_PROGRAM}

    up = engine.step("up", config=config, **step)
    created = kubernetes_events(up, "create")
    assert sorted(e["type"].split(":")[-1] for e in created if e["type"] != "pulumi:providers:kubernetes") == \
        sorted(m["kind"] for m in planned)
    assert up["outputs"]["driverNamespace"] == "engine-stack-dra"
    assert up["outputs"]["claimTemplates"] == [f"{m['metadata']['namespace']}/{m['metadata']['name']}"
                                               for m in templates]
    assert_live_as_planned(api, planned)
    total = sum(up["changes"].values())

    again = engine.step("up", config=config, **step)
    assert again["changes"] == {"same": total}

    changed = {**config, "neuron-dra:driverMetricsPort": "9400"}
    preview = engine.step("preview", config=changed, **step)
    # Exactly what deploy renders differently: the DaemonSet (its args and port) and the NetworkPolicy (the port).
    expected = changed_kinds(options, replace(options, metrics_port=9400))
    assert expected == ["DaemonSet", "NetworkPolicy"]
    assert preview["changes"] == {"same": total - len(expected), "update": len(expected)}
    updates = [e for e in preview["events"] if e["op"] == "update"]
    assert sorted(e["type"].rsplit(":", 1)[1] for e in updates) == expected
    # Only spec fields change (detailed diff paths such as spec.template.spec.containers[0].args[3]).
    assert all(e["detailed"] and all(k.startswith("spec") for k in e["detailed"]) for e in updates), updates
    daemonset = next(m for m in planned if m["kind"] == "DaemonSet")
    live = read_object(api, daemonset)
    assert live is not None and not is_subset(daemonset, live)  # preview changed nothing
    applied = engine.step("up", config=changed, **step)
    assert applied["changes"] == {"same": total - len(expected), "update": len(expected)}
    assert_live_as_planned(api, planned_driver(replace(options, metrics_port=9400)) + templates)

    destroyed = engine.step("destroy", config=changed, **step)
    assert destroyed["changes"] == {"delete": total}  # the stack resource included
    assert_all_gone(api, planned)


TEAM_PROGRAM = '''
"""Another team's program: composes neuron-dra's components with its own provider and namespace."""
import pulumi
import pulumi_kubernetes as k8s

import neuron_dra
from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron
from neuron_dra.components import ClaimTemplates, ClaimTemplatesArgs, NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.driver.deploy import DriverDeployOptions


def program() -> None:
    config = pulumi.Config()
    provider = k8s.Provider("team-cluster", kubeconfig=config.require("kubeconfig"))
    on_cluster = pulumi.ResourceOptions(provider=provider)
    namespace = k8s.core.v1.Namespace("team-ml", metadata={"name": "team-ml"}, opts=on_cluster)
    driver = NeuronDraDriver("dra", NeuronDraDriverArgs(
        options=DriverDeployOptions(namespace="team-dra", driver_name="team.neuron.aws.com",
                                    core_device_class_name="team.neuroncore.aws.com",
                                    metrics_port=config.get_int("metricsPort") or 0),
        image="registry.invalid/team/neuron-dra-driver:1",
        rollout_timeout_seconds=0,  # no node may run it here: do not wait for the rollout
    ), opts=on_cluster)
    ClaimTemplates("claims", ClaimTemplatesArgs(
        templates=[ClaimTemplate("rows", Neuron(4, topology=Connected()), namespace="team-ml")],
        instance_types=["trn2.48xlarge"], depends_on=[namespace]), opts=on_cluster)
    pulumi.export("package", neuron_dra.__file__)
    pulumi.export("image", driver.image)
'''

@pytest.mark.cluster
def test_a_separate_project_with_the_pip_installed_package(engine: Engine, plane: ControlPlane, api: Any,
                                                           tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    source.mkdir()
    for part in PACKAGE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, source / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, source / part)
    venv = tmp_path / "venv"
    python = str(with_packages_of_this_interpreter(venv))
    env = environment_without_this_checkout()  # the program imports the venv's copy
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    str(source)], check=True, cwd=tmp_path, env=env)

    work = tmp_path / "team-infra"
    work.mkdir()
    (work / "Pulumi.yaml").write_text("name: team-infra\nruntime:\n  name: python\n")
    (work / "team_program.py").write_text(textwrap.dedent(TEAM_PROGRAM))
    shutil.copy2(DRIVER, work / "engine_driver.py")
    step: dict[str, Any] = {"work_dir": work, "stack": "dev", "program": "team_program:program", "python": python,
            "driver": work / "engine_driver.py", "env": env, "sys_path": [str(work)]}
    config = {"team-infra:kubeconfig": str(plane.kubeconfig)}

    options = DriverDeployOptions(namespace="team-dra", driver_name="team.neuron.aws.com",
                                  core_device_class_name="team.neuroncore.aws.com",
                                  image="registry.invalid/team/neuron-dra-driver:1")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "rows", "namespace": "team-ml"}}
    planned = [*planned_driver(options), template]

    up = engine.step("up", config=config, **step)
    package = Path(up["outputs"]["package"])
    assert package.is_relative_to(venv) and not package.is_relative_to(ROOT)
    assert up["outputs"]["image"] == options.image
    assert_live_as_planned(api, planned)
    ds = read_object(api, next(m for m in planned if m["kind"] == "DaemonSet"))
    assert ds is not None and ds["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    total = sum(up["changes"].values())

    assert engine.step("up", config=config, **step)["changes"] == {"same": total}

    changed = {**config, "team-infra:metricsPort": "9400"}
    preview = engine.step("preview", config=changed, **step)
    expected = changed_kinds(options, replace(options, metrics_port=9400))
    assert preview["changes"] == {"same": total - len(expected), "update": len(expected)}
    updates = [e for e in preview["events"] if e["op"] == "update"]
    assert sorted(e["type"].rsplit(":", 1)[1] for e in updates) == expected
    # Only spec fields change (detailed diff paths such as spec.template.spec.containers[0].args[3]).
    assert all(e["detailed"] and all(k.startswith("spec") for k in e["detailed"]) for e in updates), updates
    assert engine.step("up", config=changed, **step)["changes"] == {"same": total - len(expected),
                                                                   "update": len(expected)}
    assert_live_as_planned(api, planned_driver(replace(options, metrics_port=9400)))

    assert engine.step("destroy", config=changed, **step)["changes"] == {"delete": total}
    assert_all_gone(api, [*planned, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-ml"}}])
