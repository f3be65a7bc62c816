"""The plugin package under the real Pulumi CLI (built from the Go module proxy, docs/pulumi-engine.md): its schema
as `pulumi package get-schema` reads it, and a Pulumi YAML program (pulumi-language-yaml, tests/support/pulumi_yaml.py)
using the components through it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.localcluster.build import build_pulumi_cli, build_pulumi_kubernetes
from tests.support.e2e import eventually
from tests.support.plane import api, plane  # noqa: F401  (fixtures)
from tests.support.pulumi_engine import is_subset, read_object
from tests.support.pulumi_yaml import build_pulumi_yaml

pytestmark = [pytest.mark.pulumi_engine, pytest.mark.gobuild, pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugin"


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The CLI and the YAML host on PATH, this checkout importable by the provider, an offline file backend."""
    bins = [str(build_pulumi_cli().parent), str(build_pulumi_yaml().parent), str(build_pulumi_kubernetes().parent)]
    (tmp_path / "home").mkdir()
    (tmp_path / "state").mkdir()
    return {**os.environ, "PATH": os.pathsep.join([*bins, os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PULUMI_HOME": str(tmp_path / "home"), "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": "provider-tests", "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true"}


def pulumi(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["pulumi", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"pulumi {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def test_get_schema_lists_the_components_with_their_inputs(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    done = pulumi(["package", "get-schema", str(PLUGIN / "pulumi-resource-neuron-dra")], tmp_path, env)
    schema = json.loads(done.stdout)
    assert schema["name"] == "neuron-dra"
    resources = schema["resources"]
    assert set(resources) == {f"neuron-dra:index:{c}" for c in (
        "TrainiumCluster", "TrainiumNodeGroup", "TrainiumKarpenter", "TrainiumNodePool", "NeuronDraDriver",
        "ClaimTemplates")}
    assert {"options", "image", "kubernetesVersion", "kubeconfig"} <= set(
        resources["neuron-dra:index:NeuronDraDriver"]["inputProperties"])
    assert {"clusterName", "vpcId", "clusterSecurityGroupId", "candidateSubnetIds", "installCoredns"} <= set(
        resources["neuron-dra:index:TrainiumNodeGroup"]["inputProperties"])
    assert set(resources["neuron-dra:index:TrainiumNodePool"]["requiredInputs"]) == {
        "nodeRoleName", "subnetIds", "securityGroupIds"}
    assert resources["neuron-dra:index:ClaimTemplates"]["requiredInputs"] == ["templatesFile"]


TEMPLATES = '''
from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron

rows = ClaimTemplate("rows", Neuron(4, topology=Connected()), namespace="team-ml")
'''


def test_a_yaml_program_reaches_the_components_checks(tmp_path: Path) -> None:
    """A YAML program's ClaimTemplates runs our check in the provider: a template that fits no node of the given
    instance types fails the preview with the template's name (before any Kubernetes object is planned)."""
    env = cli_env(tmp_path)
    templates = tmp_path / "templates.py"
    templates.write_text(textwrap.dedent(TEMPLATES))
    work = tmp_path / "team"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: team
        runtime: yaml
        plugins:
          providers:
            - name: neuron-dra
              path: {PLUGIN}
        resources:
          claims:
            type: neuron-dra:ClaimTemplates
            properties:
              templatesFile: {templates}
              instanceTypes: [trn1.2xlarge]
        """))
    pulumi(["stack", "init", "dev"], work, env)
    done = pulumi(["preview", "--non-interactive"], work, env, check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "claim template team-ml/rows cannot be satisfied by the cluster's node groups (trn1.2xlarge)" in out, \
        out[-3000:]


def test_a_yaml_programs_node_group_reaches_the_args_checks(tmp_path: Path) -> None:
    """A YAML program's TrainiumNodeGroup, placed by plain values as a cluster's outputs would place it, reaches
    TrainiumNodeGroupArgs: an instance type typo fails the preview naming the field and the closest type (before
    any AWS resource is planned: the AWS side cannot run here; tests/components/test_components_provider.py checks
    the resources under mocks)."""
    env = cli_env(tmp_path)
    work = tmp_path / "team"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: team
        runtime: yaml
        plugins:
          providers:
            - name: neuron-dra
              path: {PLUGIN}
        resources:
          trn2:
            type: neuron-dra:TrainiumNodeGroup
            properties:
              clusterName: team-a
              vpcId: vpc-0123456789abcdef0
              clusterSecurityGroupId: sg-0123456789abcdef0
              candidateSubnetIds: [subnet-0123456789abcdef0]
              kubernetesVersion: "1.36"
              availabilityZones: [us-east-2b]
              instanceType: trn2.48xlarg
              desiredSize: 2
        """))
    pulumi(["stack", "init", "dev"], work, env)
    done = pulumi(["preview", "--non-interactive"], work, env, check=False)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "TrainiumNodeGroupArgs('trn2').instance_type: 'trn2.48xlarg' is not allowed" in out, out[-3000:]
    assert "did you mean 'trn2.48xlarge'?" in out, out[-3000:]


TEAM_YAML = """\
name: team
runtime: yaml
plugins:
  providers:
    - name: neuron-dra
      path: {plugin}
config:
  kubeconfig: {{type: string}}
resources:
  k8s:
    type: pulumi:providers:kubernetes
    properties:
      kubeconfig: ${{kubeconfig}}
  ml:
    type: kubernetes:core/v1:Namespace
    properties:
      metadata: {{name: team-ml}}
    options:
      provider: ${{k8s}}
  driver:
    type: neuron-dra:NeuronDraDriver
    properties:
      kubeconfig: ${{kubeconfig}}
      image: registry.invalid/team/neuron-dra-driver:1
      rolloutTimeoutSeconds: 0
      options: {{namespace: team-dra, driver_name: team.neuron.aws.com}}
  claims:
    type: neuron-dra:ClaimTemplates
    properties:
      kubeconfig: ${{kubeconfig}}
      templatesFile: {templates}
      instanceTypes: [trn2.48xlarge]
    options:
      dependsOn:
        - ${{ml}}
        - ${{driver}}
outputs:
  namespace: ${{driver.namespace}}
  image: ${{driver.image}}
  templates: ${{claims.names}}
"""


@pytest.mark.cluster
def test_a_yaml_program_brings_up_the_driver_and_templates(plane: Any, api: Any, tmp_path: Path) -> None:  # noqa: F811
    """`pulumi up` of a YAML program using NeuronDraDriver and ClaimTemplates through the plugin, on a local control
    plane: the driver's objects as the Python component renders them, the template, the outputs; destroy removes
    them."""
    env = cli_env(tmp_path)
    templates = tmp_path / "templates.py"
    templates.write_text(textwrap.dedent(TEMPLATES))
    work = tmp_path / "team"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(TEAM_YAML.format(plugin=PLUGIN, templates=templates))
    pulumi(["stack", "init", "dev"], work, env)
    pulumi(["config", "set", "kubeconfig", str(plane.kubeconfig)], work, env)
    pulumi(["up", "--yes", "--skip-preview", "--non-interactive"], work, env)
    out = json.loads(pulumi(["stack", "output", "--json"], work, env).stdout)
    assert out == {"namespace": "team-dra", "image": "registry.invalid/team/neuron-dra-driver:1",
                   "templates": ["team-ml/rows"]}
    options = DriverDeployOptions(namespace="team-dra", driver_name="team.neuron.aws.com",
                                  image="registry.invalid/team/neuron-dra-driver:1")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "rows", "namespace": "team-ml"}}
    planned = [m for m in deploy.manifests(options) if m["kind"] != "DaemonSet"]  # its skipAwait annotation differs
    for manifest in [*planned, template]:
        live = read_object(api, manifest)
        assert live is not None, f"{deploy.object_key(manifest)} is not in the apiserver"
        assert not is_subset({k: v for k, v in manifest.items() if k != "status"}, live), manifest["kind"]
    pulumi(["destroy", "--yes", "--skip-preview", "--non-interactive"], work, env)
    for manifest in [*planned, template]:
        eventually(lambda: read_object(api, manifest) is None or None, 120,  # noqa: B023
                   what=f"{deploy.object_key(manifest)} gone")
