"""The components are importable from another Pulumi project that installed this repository with pip.

A copy of the checkout is pip-installed (not editable) into a fresh virtualenv whose other packages (Pulumi, the
kubernetes client, pip and setuptools) are those of the interpreter running the tests, whether that is a virtualenv
or a base installation. A separate project directory with its own Pulumi.yaml and program then creates every
component under its own Pulumi mocks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_PARTS = ("neuron_dra", "pyproject.toml", "README.md", "LICENSE")

OTHER_PROGRAM = '''
"""Another team's stack: its own project, its own mocks, our components."""
import json
import sys

import pulumi
import pulumi_kubernetes as k8s

import neuron_dra
from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron
from neuron_dra.components import (
    ClaimTemplates, ClaimTemplatesArgs, NeuronDraDriver, NeuronDraDriverArgs,
    TrainiumCluster, TrainiumClusterArgs, TrainiumNodeGroup, TrainiumNodeGroupArgs,
)
from neuron_dra.driver.deploy import DriverDeployOptions

created = []


class TeamMocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        created.append({"type": args.typ, "name": args.name, "inputs": args.inputs})
        out = dict(args.inputs) if args.custom else {}
        if args.typ == "eks:index:Cluster":
            out.update(kubeconfigJson="{}", clusterSecurityGroupId="sg-0team000000000000")
        if args.typ == "awsx:ec2:Vpc":
            out.update(vpcId="vpc-0team000000000000", privateSubnetIds=["subnet-0team00000000000a"])
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            out.update(latestVersion=3)
        return args.name + "-id", out

    def call(self, args):
        if args.token == "aws:ec2/getSubnets:getSubnets":
            return {"ids": ["subnet-0team00000000000a"]}, []
        return {}, []


pulumi.runtime.set_mocks(TeamMocks(), project="team-infra", stack="dev", preview=False)


@pulumi.runtime.test
def program():
    cluster = TrainiumCluster("team", TrainiumClusterArgs(cluster_name="team-cluster", kubernetes_version="1.35",
                                                          availability_zones=["us-west-2a", "us-west-2d"]))
    group = TrainiumNodeGroup("trn1", TrainiumNodeGroupArgs(
        name="trn1", instance_type="trn1.32xlarge", cluster_name=cluster.cluster_name,
        vpc_id=cluster.vpc_id, cluster_security_group_id=cluster.cluster_security_group_id,
        kubernetes_version=cluster.kubernetes_version, candidate_subnet_ids=cluster.private_subnet_ids,
        availability_zones=["us-west-2d"]))
    cluster.install_coredns(after=[group.node_group])
    driver = NeuronDraDriver("dra", NeuronDraDriverArgs(
        options=DriverDeployOptions(namespace="team-dra"), image="team.example.com/dra:1"),
        opts=pulumi.ResourceOptions(provider=cluster.provider))
    ClaimTemplates("claims", ClaimTemplatesArgs(
        templates=[ClaimTemplate("rows", Neuron(4, topology=Connected()), namespace="team")],
        instance_types=[group.instance_type]), opts=pulumi.ResourceOptions(provider=cluster.provider))
    return driver.image


program()
print(json.dumps({"package": neuron_dra.__file__, "created": created}, default=str))
'''


def with_packages_of_this_interpreter(venv: Path) -> Path:
    """A new virtualenv that also sees this interpreter's site-packages, and its python.

    `venv --system-site-packages` would expose the *base* installation's packages: run from a virtualenv, that is
    not where the dependencies are. A .pth file listing this interpreter's site directories works in both cases;
    its lines are plain paths (no `import` lines), so .pth files inside those directories, such as the editable
    install of this checkout, are not run, and the package can only come from the new venv.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = [*site.getsitepackages(), site.getusersitepackages()] if site.ENABLE_USER_SITE else site.getsitepackages()
    (Path(purelib) / "_outer_site_packages.pth").write_text("".join(f"{d}\n" for d in ours if Path(d).is_dir()))
    return python


def environment_without_this_checkout() -> dict[str, str]:
    """PYTHONPATH (a developer's pointer at a work tree) would put a checkout before the installed copy."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install_a_copy(tmp_path: Path) -> Path:
    """A copy of the checkout pip-installed (not editable) into a new virtualenv; its python."""
    source = tmp_path / "checkout"
    source.mkdir()
    for part in PACKAGE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, source / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, source / part)
    venv = tmp_path / "venv"
    python = with_packages_of_this_interpreter(venv)
    # pip and setuptools of this interpreter build the wheel offline.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(source)], check=True, cwd=tmp_path, env=environment_without_this_checkout())
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp_path = tmp_path_factory.mktemp("installed")
    return tmp_path, install_a_copy(tmp_path)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


@pytest.mark.slow  # builds a wheel into a new virtualenv (~20 s), then runs pytest there
def test_testing_your_stack_md_works_from_a_separate_project(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """docs/testing-your-stack.md followed as written: its infra.py and tests in a project of their own, run by
    pytest in a virtualenv with a pip-installed copy of the package."""
    _, python = installed
    infra, test, errors = python_blocks(ROOT / "docs" / "testing-your-stack.md")
    project = tmp_path / "ml-platform"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: ml-platform\nruntime: python\n")
    (project / "infra.py").write_text(infra)
    (project / "__main__.py").write_text("import infra\n\ninfra.build()\n")
    (project / "test_infra.py").write_text(test + "\n\n" + errors)
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_infra.py"],
                          cwd=project, capture_output=True, text=True, timeout=900,
                          env=environment_without_this_checkout())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


@pytest.mark.slow  # builds a wheel into a new virtualenv (~20 s)
def test_components_from_a_separate_project_with_a_pip_installed_copy(installed: tuple[Path, Path]) -> None:
    tmp_path, python = installed
    venv = python.parent.parent
    env = environment_without_this_checkout()

    project = tmp_path / "team-infra"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: team-infra\nruntime:\n  name: python\n")
    (project / "__main__.py").write_text(textwrap.dedent(OTHER_PROGRAM))
    done = subprocess.run([str(python), "__main__.py"], cwd=project, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    # The package came from the venv's site-packages, not from this checkout.
    package = Path(report["package"])
    assert package.is_relative_to(venv) and not package.is_relative_to(ROOT)
    created = report["created"]
    types = [c["type"] for c in created]
    for component in ("TrainiumCluster", "TrainiumNodeGroup", "NeuronDraDriver", "ClaimTemplates"):
        assert types.count(f"neuron-dra:index:{component}") == 1, component
    ng = next(c["inputs"] for c in created if c["type"] == "aws:eks/nodeGroup:NodeGroup")
    assert ng["amiType"] == "AL2023_x86_64_NEURON" and ng["subnetIds"] == ["subnet-0team00000000000a"]
    assert ng["launchTemplate"]["version"] == "3"
    lt = next(c["inputs"] for c in created if c["type"] == "aws:ec2/launchTemplate:LaunchTemplate")
    assert len(lt["networkInterfaces"]) == 8
    assert next(c["inputs"] for c in created if c["type"] == "eks:index:Cluster")["version"] == "1.35"
    ds = next(c["inputs"] for c in created if c["type"] == "kubernetes:apps/v1:DaemonSet")
    assert ds["metadata"]["namespace"] == "team-dra"
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "team.example.com/dra:1"
    rct = next(c["inputs"] for c in created if c["type"] == "kubernetes:resource.k8s.io/v1:ResourceClaimTemplate")
    assert rct["metadata"] == {"name": "rows", "namespace": "team"}
