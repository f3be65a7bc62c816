"""Day two under mocks: objects the API server will not patch are replaced (and the plan says so), a driver rename
is refused before anything registers, and `neuron-dra plan --diff OLD` says what an upgrade creates, updates,
replaces and deletes, what replaces nodes and what changes what running claims get (docs/upgrades.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml

from neuron_dra.claim_templates import ClaimTemplate, Neuron
from neuron_dra.cli import plan as plan_cli
from neuron_dra.components.claims import ClaimTemplates, ClaimTemplatesArgs
from neuron_dra.components.driver import DriverRenameError, NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.k8s_objects import REPLACED_ON_CHANGE
from neuron_dra.components.mocks import OfflineRun, PlanMocks, run_offline
from neuron_dra.components.plan_diff import changed_paths, diff_runs, render_diff
from neuron_dra.components.settings import SettingError
from neuron_dra.driver.deploy import DriverDeployOptions

IMAGE = "registry.example.com/neuron-dra-driver@sha256:" + "a" * 64


class CountingMocks(PlanMocks):
    """PlanMocks that remember which resources the engine was asked to create."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.created: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.created.append(args.typ)
        return super().new_resource(args)


def team_program(devices: int = 8, *, metrics_port: int = 0, driver_name: str = "neuron.aws.com",
                 previous: str | None = None) -> Any:
    def program() -> NeuronDraDriver:
        provider = pulumi.ResourceOptions(provider=k8s.Provider("target", kubeconfig="{}"))
        driver = NeuronDraDriver("drv", NeuronDraDriverArgs(
            options=DriverDeployOptions(driver_name=driver_name, metrics_port=metrics_port), image=IMAGE,
            kubernetes_version="1.34", previous_driver_name=previous), opts=provider)
        ClaimTemplates("claims", ClaimTemplatesArgs(
            templates=[ClaimTemplate("training", Neuron(devices), namespace="ml")], driver=driver,
            instance_types=["trn2.48xlarge"]), opts=provider)
        return driver

    return program


def run(program: Any, mocks: PlanMocks | None = None) -> OfflineRun[Any]:
    return run_offline(program, mocks=mocks, exports=lambda d: {"driverName": d.driver_name})


def test_claim_templates_are_registered_to_be_replaced_old_one_first_and_mutable_kinds_are_not() -> None:
    result = run(team_program())
    kinds = {r.plain_inputs["kind"]: r for r in result.resources if r.type.startswith("kubernetes:")
             and "kind" in r.plain_inputs}
    template = kinds["ResourceClaimTemplate"]
    assert template.replace_on_changes == ("spec",) and template.delete_before_replace
    assert kinds["ClusterRoleBinding"].replace_on_changes == ("roleRef",)
    assert kinds["DaemonSet"].replace_on_changes == ("spec.selector",)
    # The API server patches these in place: a change must stay an update (a replace would delete the class
    # every claim names, or the policy that guards the slices, for the length of the update).
    for kind in ("DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Namespace"):
        assert kinds[kind].replace_on_changes == () and not kinds[kind].delete_before_replace, kind
    assert {k for _, k in REPLACED_ON_CHANGE} == {"ResourceClaimTemplate", "ClusterRoleBinding", "DaemonSet"}


def test_a_claim_template_spec_change_is_a_replace_and_a_removed_object_a_delete() -> None:
    old = run(team_program(8, metrics_port=9400))
    new = run(team_program(4), PlanMocks(previous=old.exports))
    diff = diff_runs(old, new)
    (replaced,) = diff.of("replace")
    assert replaced.type == "kubernetes:resource.k8s.io/v1:ResourceClaimTemplate"
    assert replaced.replaced_by == ("spec",) and replaced.fields == ("spec.spec.devices.requests[0].exactly.count",)
    assert [c.type.rsplit(":", 1)[1] for c in diff.of("delete")] == ["Service"]  # the metrics port's
    assert sorted(c.type.rsplit(":", 1)[1] for c in diff.of("update")) == ["DaemonSet", "NetworkPolicy"]
    assert not diff.of("create") and not diff.nodes and not diff.claims
    text = render_diff(diff)
    assert "+- replace  kubernetes:resource.k8s.io/v1:ResourceClaimTemplate" in text
    assert "(replaced: spec cannot change in place; the old one goes first)" in text
    assert "0 to create, 2 to update, 1 to replace, 1 to delete" in text
    assert render_diff(diff_runs(old, old)).startswith("No changes.")


def test_changed_paths_name_the_leaves_that_differ() -> None:
    assert changed_paths({"a": {"b": [1, 2]}, "c": 1}, {"a": {"b": [1, 3]}, "c": 1}) == ["a.b[1]"]
    assert changed_paths({"a": [1]}, {"a": [1, 2]}) == ["a"]
    assert changed_paths({"a": 1}, {"b": 1}) == ["a", "b"]


def test_a_driver_rename_is_refused_before_any_object_registers() -> None:
    mocks = CountingMocks()
    with pytest.raises(Exception) as caught:
        run(team_program(driver_name="team.neuron.aws.com", previous="neuron.aws.com"), mocks)
    error = caught.value
    while error is not None and not isinstance(error, DriverRenameError):
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    assert isinstance(error, DriverRenameError), caught.value
    message = str(error)
    assert message.startswith("driverName: this stack's driver runs as 'neuron.aws.com'; renaming it to "
                              "'team.neuron.aws.com'")
    for why in ("both would publish every Neuron device of the same nodes", "its own lock and checkpoint",
                "could no longer be unprepared", "drain the driver's nodes", "`pulumi destroy`",
                "set driverName back to 'neuron.aws.com'", "docs/upgrades.md"):
        assert why in message, why
    assert not [t for t in mocks.created if t.startswith("kubernetes:") and t != "pulumi:providers:kubernetes"
                and not t.startswith("kubernetes:helm")], mocks.created


@pytest.mark.parametrize("previous", [None, "", "neuron.aws.com"])
def test_no_previous_name_or_the_same_name_deploys(previous: str | None) -> None:
    result = run(team_program(previous=previous))
    assert result.exports == {"driverName": "neuron.aws.com"}
    kinds = sorted(r.type.rsplit(":", 1)[1] for r in result.resources if r.type.startswith("kubernetes:resource"))
    # the class and the team's template, and neuron-monitor's admin-access template (docs/utilisation.md)
    assert kinds == ["DeviceClass", "ResourceClaimTemplate", "ResourceClaimTemplate"]


def test_a_previous_name_that_is_not_a_string_names_the_field() -> None:
    with pytest.raises(Exception) as caught:
        run(team_program(previous=42))  # type: ignore[arg-type]
    error = caught.value
    while error is not None and not isinstance(error, SettingError):
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    assert isinstance(error, SettingError) and "NeuronDraDriverArgs.previous_driver_name" in str(error)


def plan_args(tmp_path: Path, old: dict[str, Any], new: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_cli.configure(parser)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump({"config": old}))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump({"config": new}))
    return parser.parse_args(["--diff", str(tmp_path / "old.yaml"), "--config", str(tmp_path / "new.yaml")])


GROUP = {"name": "trn2", "instanceType": "trn2.48xlarge", "desiredSize": 1, "minSize": 0, "maxSize": 1}


CORE_TEMPLATES = """
from neuron_dra.claim_templates import ClaimTemplate, Neuron, NeuronCores

two_cores = ClaimTemplate("two-cores", NeuronCores(2), namespace="ml")
one_device = ClaimTemplate("one-device", Neuron(1), namespace="ml")
"""


def test_plan_diff_of_the_default_stack_names_node_replacements_and_the_lnc_halving(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "day_two_core_templates.py").write_text(CORE_TEMPLATES)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = {"neuron-dra:claimTemplatesModule": "day_two_core_templates"}
    old = {**common, "neuron-dra:kubernetesVersion": "1.36", "neuron-dra:nodeGroups": [{**GROUP, "lnc": 2}]}
    new = {**common, "neuron-dra:kubernetesVersion": "1.36", "neuron-dra:nodeGroups": [{**GROUP, "lnc": 1,
                                                                                          "version": "1.35"}]}
    assert plan_cli.run(plan_args(tmp_path, old, new)) == 0
    out = capsys.readouterr().out
    assert "eks:index:Cluster" not in out  # the control plane stays at 1.36
    assert "node group trn2: Kubernetes 1.36 -> 1.35: EKS replaces every node" in out
    assert "node group ng-trn2: its launch template changes (userData): a new version" in out
    assert ("node group trn2: LNC 2 -> 1: a NeuronCore becomes 1 physical core instead of 2, so a NeuronCores(2) "
            "claim gets 2 physical cores instead of 4 (half the cores and their memory") in out
    # The templates that ask for NeuronCores are named, the whole-device one is not.
    assert "Templates that request NeuronCores: ml/two-cores\n" in out
    assert "Changes what running claims get:" in out and "Replaces nodes:" in out


def test_plan_diff_names_a_control_plane_upgrade(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = plan_args(tmp_path, {"neuron-dra:kubernetesVersion": "1.35"}, {"neuron-dra:kubernetesVersion": "1.36"})
    assert plan_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "~ update   eks:index:Cluster  cluster-eks  (version)" in out
    assert "node group trn2: Kubernetes 1.35 -> 1.36: EKS replaces every node" in out
    assert "Changes what running claims get:" not in out


def test_plan_diff_refuses_a_driver_rename_as_up_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kube = {"neuron-dra:kubeconfig": str(tmp_path / "kubeconfig"), "neuron-dra:driverImage": IMAGE,
            "neuron-dra:efaDriver": "external"}
    args = plan_args(tmp_path, kube, {**kube, "neuron-dra:driverName": "team.neuron.aws.com"})
    assert plan_cli.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("neuron-dra plan: driverName: this stack's driver runs as 'neuron.aws.com'")


def test_plan_diff_with_yaml_output_is_refused_before_planning(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = plan_args(tmp_path, {}, {})
    args.output = "yaml"
    assert plan_cli.run(args) == 2
    assert "--diff prints a table of changes" in capsys.readouterr().err
