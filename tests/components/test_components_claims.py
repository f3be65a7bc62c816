"""ClaimTemplates under Pulumi mocks: templates become ResourceClaimTemplates, and a template the node groups
cannot satisfy fails the program with the check's message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron, RingSegment
from neuron_dra.components.claims import (
    ClaimTemplateCheckError,
    ClaimTemplateLike,
    ClaimTemplates,
    ClaimTemplatesArgs,
    module_templates,
)
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.settings import SettingError
from tests.support import kubeschema


def run_templates(args: ClaimTemplatesArgs) -> OfflineRun[ClaimTemplates]:
    return run_offline(lambda: ClaimTemplates("tpl", args))


def recorded_templates(run: OfflineRun[Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for r in run.of_type("kubernetes:resource.k8s.io/v1:ResourceClaimTemplate"):
        meta = r.plain_inputs["metadata"]
        found[f"{meta['namespace']}/{meta['name']}"] = r.plain_inputs
    return found


def test_stack_examples_become_resource_claim_templates_equal_to_their_manifests() -> None:
    templates = module_templates("neuron_dra.claim_templates.stack_examples")
    assert len(templates) >= 8
    run = run_templates(ClaimTemplatesArgs(templates=templates, instance_types=["trn2.48xlarge"],
                                           efa_driver="external"))
    sent = recorded_templates(run)
    assert run.result.names == [f"{t.namespace}/{t.name}" for t in templates]
    assert set(sent) == set(run.result.names) and len(sent) == len(templates)
    for template in templates:
        manifest = sent[f"{template.namespace}/{template.name}"]
        assert manifest == dict(template.to_manifest())
        kubeschema.validate(manifest, "1.34", strict=True)


def test_a_template_the_node_groups_cannot_satisfy_fails_with_the_checks_message() -> None:
    ring = ClaimTemplate("inf2-ring", Neuron(4, topology=RingSegment(), instance_types=["inf2.48xlarge"]))
    fits = ClaimTemplate("row", Neuron(4, topology=Connected()))
    with pytest.raises(ClaimTemplateCheckError) as err:
        run_templates(ClaimTemplatesArgs(templates=[fits, ring], instance_types=["trn2.48xlarge"]))
    message = str(err.value)
    assert err.value.template == "default/inf2-ring"
    assert message.startswith("claim template default/inf2-ring cannot be satisfied by the cluster's node groups "
                              "(trn2.48xlarge): ")
    assert "its selectors pick other instance types" in message  # the check's own reason
    # The same template is fine once the cluster has such nodes.
    run = run_templates(ClaimTemplatesArgs(templates=[fits, ring], instance_types=["trn2.48xlarge", "inf2.48xlarge"]))
    assert set(recorded_templates(run)) == {"default/row", "default/inf2-ring"}


def test_the_project_examples_fail_a_trn2_only_cluster() -> None:
    # `examples` holds UltraServer and inf2 templates: the check must catch them on a trn2-only cluster.
    with pytest.raises(ClaimTemplateCheckError) as err:
        run_templates(ClaimTemplatesArgs(templates=module_templates("neuron_dra.claim_templates.examples"),
                                         instance_types=["trn2.48xlarge"]))
    assert "trn2.48xlarge" in str(err.value)


@dataclass(frozen=True)
class HandWritten:
    """A template that is not a ClaimTemplate: anything with name, namespace and to_manifest()."""

    name: str
    namespace: str
    body: Mapping[str, Any]

    def to_manifest(self) -> Mapping[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self.body}


def test_protocol_templates_and_a_custom_check() -> None:
    spec = {"spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "neuron.aws.com"}}]}}}
    template = HandWritten("hand", "ml", spec)
    assert isinstance(template, ClaimTemplateLike)
    seen: list[tuple[str, tuple[str, ...]]] = []

    def check(t: ClaimTemplateLike, types: Sequence[str]) -> None:
        seen.append((t.name, tuple(types)))

    run = run_templates(ClaimTemplatesArgs(templates=[template], instance_types=["trn1.32xlarge"], check=check))
    assert seen == [("hand", ("trn1.32xlarge",))]
    assert recorded_templates(run)["ml/hand"]["spec"] == spec

    def refuse(t: ClaimTemplateLike, types: Sequence[str]) -> None:
        raise ValueError("needs 17 devices")

    with pytest.raises(ClaimTemplateCheckError, match=r"ml/hand .*needs 17 devices"):
        run_templates(ClaimTemplatesArgs(templates=[template], instance_types=["trn1.32xlarge"], check=refuse))
    # The default check reads hand-written templates through their manifest.
    run = run_templates(ClaimTemplatesArgs(templates=[template], instance_types=["trn1.32xlarge"]))
    assert "ml/hand" in recorded_templates(run)


def test_duplicate_and_mismatched_templates_are_refused() -> None:
    t = ClaimTemplate("row", Neuron(4, topology=Connected()))
    with pytest.raises(SettingError, match="distinct namespace/name"):
        run_templates(ClaimTemplatesArgs(templates=[t, t], instance_types=["trn2.48xlarge"]))
    # A template whose manifest names another object than the template says.
    with pytest.raises(SettingError, match="own namespace and name"):
        run_templates(ClaimTemplatesArgs(templates=[_Renamed(HandWritten("a", "ml", {}), "other")],
                                         instance_types=["trn2.48xlarge"], check=lambda t, types: None))
    with pytest.raises(SettingError, match="instance types"):
        run_templates(ClaimTemplatesArgs(templates=[t], instance_types=[]))


@dataclass(frozen=True)
class _Renamed:
    inner: HandWritten
    name: str

    @property
    def namespace(self) -> str:
        return self.inner.namespace

    def to_manifest(self) -> Mapping[str, Any]:
        return self.inner.to_manifest()


def test_an_unimportable_module_names_the_setting() -> None:
    with pytest.raises(SettingError) as err:
        module_templates("neuron_dra.claim_templates.no_such_module")
    assert err.value.setting == "neuron-dra:claimTemplatesModule"


def test_a_check_warning_reaches_the_preview_output(caplog: pytest.LogCaptureFixture) -> None:
    from neuron_dra.claim_templates import FirstAvailable

    template = ClaimTemplate("fallback", FirstAvailable(Neuron(16), Neuron(1)))
    with caplog.at_level("WARNING"):
        run = run_templates(ClaimTemplatesArgs(templates=[template], instance_types=["inf2.48xlarge"]))
    assert list(recorded_templates(run)) == ["default/fallback"]  # a warning, not a refusal
    assert any("claim template default/fallback: request 'neurons/option1': this alternative can never be "
               "satisfied" in r.getMessage() for r in caplog.records)
