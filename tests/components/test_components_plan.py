"""`neuron-dra plan`: the offline run of the stack program, as a table or as the manifests it applies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import neuron_dra.claim_templates.stack_examples as examples
from neuron_dra.claim_templates.loader import templates_in
from neuron_dra.cli import main
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.stack import driver_options
from neuron_dra.driver import deploy
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Pulumi.test.yaml"
    path.write_text(text)
    return path


def test_yaml_output_is_exactly_the_driver_objects_and_the_templates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-o", "yaml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    for doc in docs:
        kubeschema.validate(doc, "1.36", strict=True)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    driver = deploy.manifests(replace(driver_options(decode_settings({})), image=image))
    templates = [t.to_manifest() for t in templates_in(vars(examples))]
    assert docs == driver + sorted(templates, key=lambda m: m["metadata"]["name"])
    # Apply order: namespace and RBAC before the DaemonSet.
    kinds = [d["kind"] for d in docs]
    assert kinds.index("Namespace") < kinds.index("ClusterRoleBinding") < kinds.index("DaemonSet")


def test_yaml_shows_the_network_policy_and_the_tightened_rbac(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14: the deployment ships a NetworkPolicy and RBAC that grants only what the daemon calls."""
    assert main(["plan", "-o", "yaml"]) == 0
    docs = {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)}
    policy = docs["NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []
    slice_rules = [r for r in docs["ClusterRole"]["rules"] if r["resources"] == ["resourceslices"]]
    assert [sorted(r["verbs"]) for r in slice_rules] == [["create", "delete", "list", "update", "watch"]]
    env = {e["name"]: e for e in docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    validations = docs["ValidatingAdmissionPolicy"]["spec"]["validations"]
    assert any("variables.objectDriver ==" in v["expression"] for v in validations)


def test_table_output_shows_the_tree_and_key_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, """
config:
  aws:region: eu-north-1
  neuron-dra:driverImage: example.com/neuron-dra-driver:1
  neuron-dra:claimTemplatesModule: ""
  neuron-dra:nodeGroups:
    - {name: big, instanceType: trn1.32xlarge, desiredSize: 2}
""")
    assert main(["plan", "--config", str(config), "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "neuron-dra:index:TrainiumNodeGroup  ng-big" in lines
    ng_line = next(line for line in lines if "aws:eks/nodeGroup:NodeGroup" in line)
    assert ng_line.startswith("  ")  # a child of the node group component
    assert "ami=AL2023_x86_64_NEURON" in ng_line and "types=trn1.32xlarge" in ng_line and "size=0/2/2" in ng_line
    lt_line = next(line for line in lines if "LaunchTemplate" in line)
    assert "efa=8 (1 efa, 7 efa-only)" in lt_line and "imds=required/hop1" in lt_line
    assert "name=neuron-dra-prod version=1.36 auth=API" in out
    assert "eu-north-1a" in out
    assert "kubeconfig: [secret]" in out


@pytest.mark.parametrize(("text", "code", "message"), [
    ("config:\n  neuron-dra:kubernetesVersion: '1.30'\n", 1, "neuron-dra:kubernetesVersion: '1.30'"),
    ("config:\n  neuron-dra:clusterName:\n    secure: AAABAJ==\n", 2, "encrypted secret"),
    ("config: [1, 2]\n", 2, "expected a mapping"),
    ("config:\n  neuron-dra:claimTemplatesModule: neuron_dra.claim_templates.examples\n", 1,
     "cannot be satisfied by the cluster's node groups"),
])
def test_plan_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, code: int, message: str) -> None:
    assert main(["plan", "--config", str(write_config(tmp_path, text))]) == code
    err = capsys.readouterr().err
    assert err.startswith("neuron-dra plan: ") and message in err


@pytest.mark.parametrize(("text", "message"), [
    ("confg:\n  neuron-dra:clusterName: typo\n", "unknown top-level key 'confg'"),
    ("config:\n  neuron-dra:nodeGroups: " + "[" * 5000 + "]" * 5000 + "\n", "at most 64 levels of nested"),
    ("config:\n  neuron-dra:kubernetesVersion: '" + "9" * 1_000_000 + "'\n", "characters)"),
])
def test_plan_refuses_what_it_used_to_accept_or_crash_on(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          text: str, message: str) -> None:
    """Issue 14 item 9: a misspelt `config:` key ran the default stack; deep nesting gave a traceback; a 1 MB value
    came back whole in the error."""
    code = main(["plan", "--config", str(write_config(tmp_path, text))])
    err = capsys.readouterr().err
    assert code in (1, 2) and err.startswith("neuron-dra plan: ") and message in err, err[:2000]
    assert "Traceback" not in err and len(err) < 2000


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read --config" in capsys.readouterr().err


NETWORK_OUTPUTS = """\
acme/network/prod:
  vpcId: vpc-0123456789abcdef0
  privateSubnetIds: [subnet-0123456789abcdef0, subnet-0fedcba9876543210]
"""


def user_project(tmp_path: Path) -> Path:
    """A separate Pulumi project: its Pulumi.yaml with a config default, a stack file, a helper module next to
    its __main__.py (importable only with the project directory on sys.path), the docs/components.md program."""
    from tests.components.test_components_composition import python_block

    project = tmp_path / "ml-platform"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: ml-platform\nruntime: python\nconfig:\n"
                                         "  driverImage:\n    type: string\n    default: registry.example/dra:1\n")
    (project / "Pulumi.dev.yaml").write_text(
        "config:\n  aws:region: us-east-2\n  capacityBlockId: cr-00000000000000abc\n")
    (project / "naming.py").write_text("SUFFIX = '-team'\n")
    program = python_block(ROOT / "docs" / "components.md", "## A complete stack")
    (project / "__main__.py").write_text("import naming\n" + program + "pulumi.export('suffix', naming.SUFFIX)\n")
    (tmp_path / "network.yaml").write_text(NETWORK_OUTPUTS)
    return project


def test_plan_program_runs_a_users_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = user_project(tmp_path)
    args = ["plan", "--program", str(project), "--stack", "dev", "--stack-outputs", str(tmp_path / "network.yaml")]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "neuron-dra:index:TrainiumNodeGroup  trn2-block" in table
    assert "capacity-block=cr-00000000000000abc" in table  # Pulumi.dev.yaml's value, not the program's fallback
    assert "image=registry.example/dra:1" in table  # Pulumi.yaml's config default
    assert 'suffix: "-team"' in table and 'clusterName: "training"' in table
    assert main([*args, "-o", "yaml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {(d["kind"], d["metadata"].get("namespace")) for d in docs if d["kind"] == "ResourceClaimTemplate"} == \
        {("ResourceClaimTemplate", "ml")}
    for doc in docs:
        kubeschema.validate(doc, "1.36", strict=True)


def test_plan_program_errors_say_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = user_project(tmp_path)
    assert main(["plan", "--program", str(project), "--stack", "dev"]) == 1
    assert "pulumi.StackReference 'acme/network/prod'" in capsys.readouterr().err
    assert main(["plan", "--program", str(tmp_path)]) == 2
    assert "no Pulumi.yaml" in capsys.readouterr().err
    assert main(["plan", "--stack-outputs", str(tmp_path / "network.yaml")]) == 2
    assert "--stack-outputs is for --program" in capsys.readouterr().err
