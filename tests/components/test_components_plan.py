"""`neuron-dra plan`: the offline run of the stack program, as a table or as the manifests it applies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import neuron_dra.claim_templates.stack_examples as examples
from neuron_dra.claim_templates.loader import templates_in
from neuron_dra.cli import main
from neuron_dra.components import driver_image
from neuron_dra.components.plan import load_config_file, plan
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.stack import driver_options
from neuron_dra.driver import deploy
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[2]


PINNED = "registry.example.com/neuron-dra-driver@sha256:" + "0" * 64
PINNED_CONFIG = f"config:\n  neuron-dra:driverImage: {PINNED}\n"


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Pulumi.test.yaml"
    path.write_text(text)
    return path


def test_yaml_output_is_exactly_the_driver_objects_and_the_templates(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    assert main(["plan", "-o", "yaml", "--config", str(write_config(tmp_path, PINNED_CONFIG))]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    for doc in docs:
        kubeschema.validate(doc, "1.36", strict=True)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == PINNED  # the given image: -o yaml prints no reference that does not exist
    driver = deploy.manifests(driver_options(decode_settings({})).replace(image=image))
    templates = [t.to_manifest() for t in templates_in(vars(examples))]
    # The same objects (in the plan's apply order: by kind, then namespace and name).
    def key(m: dict[str, Any]) -> str:
        return json.dumps(m, sort_keys=True)

    assert sorted(docs, key=key) == sorted(driver + templates, key=key)
    # Apply order: namespace and RBAC before the DaemonSet.
    kinds = [d["kind"] for d in docs]
    assert kinds.index("Namespace") < kinds.index("ClusterRoleBinding") < kinds.index("DaemonSet")


def test_yaml_shows_the_network_policy_and_the_tightened_rbac(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """Issue 14: the deployment ships a NetworkPolicy and RBAC that grants only what the daemon calls."""
    assert main(["plan", "-o", "yaml", "--config", str(write_config(tmp_path, PINNED_CONFIG))]) == 0
    docs = {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)
            if d["metadata"]["name"] != "neuron-monitor"}  # the driver's (tests/driver/deploy/test_exporter.py)
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
    err = capsys.readouterr().err  # warnings of the program may come first
    assert any(line.startswith("neuron-dra plan: ") for line in err.splitlines()) and message in err


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
    # The user's templates, and neuron-monitor's in the driver's namespace (on by default).
    assert {(d["kind"], d["metadata"].get("namespace")) for d in docs if d["kind"] == "ResourceClaimTemplate"} == \
        {("ResourceClaimTemplate", "ml"), ("ResourceClaimTemplate", "neuron-dra-driver")}
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


def helm_block(out: str) -> list[dict[str, Any]]:
    """The YAML comment block `-o yaml` ends with, uncommented and parsed."""
    lines = out.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("# Helm releases this plan installs"))
    assert all(line.startswith("#") for line in lines[start:])
    releases: list[dict[str, Any]] = yaml.safe_load("\n".join(line[2:] for line in lines[start + 1:]))
    return releases


@pytest.mark.parametrize(("config", "expected"), [
    (None, ["aws-dranet"]),
    (ROOT / "Pulumi.karpenter-example.yaml", ["karpenter", "aws-dranet"]),
])
def test_yaml_names_every_helm_release_it_cannot_render(capsys: pytest.CaptureFixture[str], config: Path | None,
                                                        expected: list[str], tmp_path: Path) -> None:
    config = config or write_config(tmp_path, PINNED_CONFIG)
    assert main(["plan", "-o", "yaml", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    releases = helm_block(captured.out)
    assert sorted(r["release"] for r in releases) == sorted(expected)
    # What the components give the engine, release by release: chart, repository, version and values.
    run = plan(load_config_file(config))
    sent = {r.plain_inputs["name"]: r.plain_inputs for r in run.of_type("kubernetes:helm.sh/v3:Release")}
    for release in releases:
        inputs = sent[release["release"]]
        assert release["chart"] == inputs["chart"] and release["version"] == inputs["version"]
        assert release["namespace"] == inputs["namespace"] and release["values"] == inputs["values"]
        assert release["repository"] and release["version"]
    by_name = {r["release"]: r for r in releases}
    assert by_name["aws-dranet"]["repository"] == "https://aws.github.io/eks-charts"
    if "karpenter" in by_name:  # an OCI chart names its own repository
        assert by_name["karpenter"]["repository"] == "oci://public.ecr.aws/karpenter"
    # Every YAML document is still a Kubernetes object: the block is comments only.
    assert all(d["kind"] != "Release" for d in yaml.safe_load_all(captured.out))
    for name in expected:
        assert name in captured.err
    assert "comment block" in captured.err and "not rendered as manifests" in captured.err
    (image,) = [x for x in captured.out.splitlines() if x.startswith("# Driver image: ")]
    # Which image the DaemonSet runs, in the YAML too: the given one (-o yaml refuses a built one).
    assert "runs the given image" in image


def test_table_output_says_nothing_about_helm_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    captured = capsys.readouterr()
    assert "Helm release" not in captured.err and "aws-dranet" in captured.out
    (line,) = [x for x in captured.out.splitlines() if x.startswith("Driver image: ")]
    staged = f".neuron-dra/driver-image/{driver_image.context_tag(ROOT)}"  # no path of this machine
    assert f"built here from {staged} ({staged}/neuron_dra/driver/Dockerfile)" in line and "pinned by digest" in line


@pytest.mark.parametrize(("image", "says"), [
    ("registry.example.com/dra@sha256:" + "1" * 64, "pinned by digest"),
    ("registry.example.com/dra:1", "a tag, which floats"),
])
def test_table_output_says_which_given_image_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], image: str,
                                                  says: str) -> None:
    config = write_config(tmp_path, f"config:\n  neuron-dra:driverImage: '{image}'\n")
    assert main(["plan", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("Driver image: ")]
    assert f"runs the given image {image}" in line and says in line
    assert "docker-build:index:Image" not in out and "aws:ecr/repository:Repository" not in out


def test_yaml_refuses_an_image_that_does_not_exist_yet(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39 finding 5: without driverImage the stack builds the image at `pulumi up`; offline its digest is a
    placeholder, so -o yaml stops and says what to set instead of printing a reference nobody can pull."""
    assert main(["plan", "-o", "yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "set neuron-dra:driverImage" in captured.err and "DaemonSet neuron-dra-driver/" in captured.err
    assert main(["plan"]) == 0  # the table shows the build, as a build
    assert "docker-build:index:Image" in capsys.readouterr().out


def test_no_plan_names_the_unpublished_default_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The library's old default image (never published) appears in no plan: the given image, or a build."""
    for config in (write_config(tmp_path, PINNED_CONFIG), ROOT / "Pulumi.karpenter-example.yaml"):
        assert main(["plan", "-o", "yaml", "--config", str(config)]) == 0
        assert deploy.DEFAULT_IMAGE not in capsys.readouterr().out
    assert main(["plan"]) == 0
    assert deploy.DEFAULT_IMAGE not in capsys.readouterr().out
