"""The plugin package under the real Pulumi CLI (built from the Go module proxy, docs/pulumi-engine.md): its schema
as `pulumi package get-schema` reads it, and a Pulumi YAML program (pulumi-language-yaml, localcluster/pulumi_yaml.py)
using the components through it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from neuron_dra.localcluster.build import build_pulumi_cli
from neuron_dra.localcluster.pulumi_yaml import build_pulumi_yaml

pytestmark = [pytest.mark.pulumi_engine, pytest.mark.gobuild, pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugin"


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The CLI and the YAML host on PATH, this checkout importable by the provider, an offline file backend."""
    bins = [str(build_pulumi_cli().parent), str(build_pulumi_yaml().parent)]
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
    assert set(resources) == {f"neuron-dra:index:{c}" for c in ("TrainiumCluster", "NeuronDraDriver", "ClaimTemplates")}
    assert {"options", "image", "kubernetesVersion", "kubeconfig"} <= set(
        resources["neuron-dra:index:NeuronDraDriver"]["inputProperties"])
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
