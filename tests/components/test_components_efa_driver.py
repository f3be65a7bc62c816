"""EfaDraDriver under Pulumi mocks: EKS's aws-dranet Helm release, pinned, on EFA nodes only; the stack installs it
for EFA node groups, and claim templates that request EFA devices without it fail naming the fix."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml

from neuron_dra.claim_templates import ClaimTemplate, Efa, Neuron
from neuron_dra.components import plan
from neuron_dra.components.claims import ClaimTemplates, ClaimTemplatesArgs
from neuron_dra.components.efa_driver import (
    EFA_CHART_VERSION,
    EFA_IMAGE_REPOSITORY,
    EFA_IMAGE_TAG,
    EfaDraDriver,
    EfaDraDriverArgs,
)
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.settings import SettingError
from neuron_dra.driver.deploy import NODE_GROUP_LABEL
from neuron_dra.driver.model.efa import efa_device_class
from neuron_dra.driver.model.k8s_names import neuron_taint, neuron_toleration
from tests.components.test_components_stack import KUBECONFIG, project_defaults, run_stack
from tests.support import kubeschema

RELEASE = "kubernetes:helm.sh/v3:Release"
TEMPLATE = "kubernetes:resource.k8s.io/v1:ResourceClaimTemplate"
IMAGE = "example.com/neuron-dra-driver:0.1.0"


def run_efa(args: EfaDraDriverArgs) -> OfflineRun[EfaDraDriver]:
    def program() -> EfaDraDriver:
        provider = k8s.Provider("target", kubeconfig="{}")
        return EfaDraDriver("efa", args, opts=pulumi.ResourceOptions(provider=provider))

    return run_offline(program)


def test_installs_the_eks_chart_pinned_on_the_given_node_groups() -> None:
    run = run_efa(EfaDraDriverArgs(node_groups=["trn2", "trn1"]))
    release = run.one(RELEASE)
    i = release.plain_inputs
    assert (i["chart"], i["version"], i["name"], i["namespace"]) == ("aws-dranet", "1.0.0", "aws-dranet",
                                                                      "kube-system")
    assert i["repositoryOpts"] == {"repo": "https://aws.github.io/eks-charts"}
    assert i["values"]["image"] == {"repository": "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/dranet",
                                    "tag": "v1.2.0-eksbuild.2"}
    assert i["values"]["supportedInstanceLabels"] == {"keys": [NODE_GROUP_LABEL], "values": ["trn2", "trn1"]}
    assert i["values"]["tolerations"] == [neuron_toleration()]
    assert i["values"]["deviceClass"] == {"create": True, "name": "efa.networking.k8s.aws"}
    assert i["timeout"] == 600
    provider = run.one("pulumi:providers:kubernetes", "target")
    assert release.provider.startswith(provider.urn + "::")


def test_on_an_existing_cluster_it_selects_instance_types_and_takes_more_values() -> None:
    run = run_efa(EfaDraDriverArgs(instance_types=["trn1.32xlarge"], extra_values={"verbosity": 2},
                                   image_tag="v1.2.0-eksbuild.39"))
    values = run.one(RELEASE).plain_inputs["values"]
    assert values["supportedInstanceLabels"] == {"keys": ["node.kubernetes.io/instance-type"],
                                                 "values": ["trn1.32xlarge"]}
    assert values["verbosity"] == 2 and values["image"]["tag"] == "v1.2.0-eksbuild.39"


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    ({}, "EfaDraDriverArgs.node_groups", "not both, not neither"),
    ({"node_groups": ["a"], "instance_types": ["trn2.48xlarge"]}, "EfaDraDriverArgs.node_groups", "not both"),
    ({"instance_types": ["inf2.48xlarge"]}, "EfaDraDriverArgs.instance_types", "trn2.48xlarge"),
    ({"node_groups": ["a"], "chart_version": "^1.0"}, "EfaDraDriverArgs.chart_version", "exact chart version"),
    ({"node_groups": ["a"], "image_tag": "latest"}, "EfaDraDriverArgs.image_tag", "pinned image tag"),
    ({"node_groups": ["a"], "extra_values": {"tolerations": []}}, "EfaDraDriverArgs.extra_values",
     "their own fields"),
    ({"node_groups": ["a b"]}, "EfaDraDriverArgs.node_groups", "label value"),
    ({"node_groups": ["a"], "timeout_seconds": 0}, "EfaDraDriverArgs.timeout_seconds", "1-3600"),
])
def test_bad_arguments_are_refused_naming_the_field(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(SettingError) as err:
        EfaDraDriverArgs(**kwargs)
    assert err.value.field == field and allowed in err.value.allowed


@pytest.mark.parametrize("version", ["1.34", "1.36"])
def test_the_device_class_and_the_tolerations_are_valid_objects(version: str) -> None:
    kubeschema.validate(efa_device_class(), version, strict=True)
    values = EfaDraDriverArgs(node_groups=["trn2"]).values()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dranet"},
           "spec": {"containers": [{"name": "dranet", "image": f"{EFA_IMAGE_REPOSITORY}:{EFA_IMAGE_TAG}"}],
                    "tolerations": values["tolerations"]}}
    kubeschema.validate(pod, version, strict=True)
    taint = neuron_taint()
    (toleration,) = values["tolerations"]
    assert (toleration["key"], toleration["effect"]) == (taint["key"], taint["effect"])
    assert EFA_CHART_VERSION.count(".") == 2


def _templates_program(efa_driver: Any, template: ClaimTemplate) -> OfflineRun[ClaimTemplates]:
    def program() -> ClaimTemplates:
        ref = EfaDraDriver("efa", EfaDraDriverArgs(node_groups=["trn2"])) if efa_driver == "component" else efa_driver
        return ClaimTemplates("t", ClaimTemplatesArgs(templates=[template], instance_types=["trn2.48xlarge"],
                                                      efa_driver=ref))

    return run_offline(program)


def test_an_efa_template_without_an_efa_driver_fails_naming_the_fix() -> None:
    with pytest.raises(SettingError) as err:
        _templates_program(None, ClaimTemplate("aligned", Neuron(4), Efa(4)))
    text = str(err.value)
    assert err.value.field == "ClaimTemplatesArgs.efa_driver"
    assert "default/aligned" in text and "efa.networking.k8s.aws" in text
    assert "EfaDraDriver" in text and "'external'" in text and "neuron-dra:efaDriver" in text


def test_an_efa_template_waits_for_the_efa_driver_or_trusts_an_external_one() -> None:
    run = _templates_program("component", ClaimTemplate("aligned", Neuron(4), Efa(4)))
    assert run.one(RELEASE).urn in run.one(TEMPLATE).dependencies
    run = _templates_program("external", ClaimTemplate("aligned", Neuron(4), Efa(4)))
    assert run.of_type(TEMPLATE) and not run.of_type(RELEASE)
    run = _templates_program(None, ClaimTemplate("plain", Neuron(4)))  # no EFA: nothing needed
    assert run.of_type(TEMPLATE)
    with pytest.raises(SettingError) as err:
        _templates_program("extrenal", ClaimTemplate("aligned", Neuron(4), Efa(4)))
    assert err.value.field == "ClaimTemplatesArgs.efa_driver" and err.value.value == "extrenal"


def test_the_default_stack_installs_it_on_its_efa_node_group_only() -> None:
    groups = [{"name": "trn2", "instanceType": "trn2.48xlarge", "desiredSize": 1},
              {"name": "inf2", "instanceType": "inf2.48xlarge", "desiredSize": 1}]
    run = run_stack({**project_defaults(), "driverImage": IMAGE, "nodeGroups": groups})
    values = run.one(RELEASE).plain_inputs["values"]
    assert values["supportedInstanceLabels"] == {"keys": [NODE_GROUP_LABEL], "values": ["trn2"]}
    ng = {g.plain_inputs["nodeGroupName"]: g.plain_inputs for g in run.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert ng["trn2"]["labels"][NODE_GROUP_LABEL] == "trn2"  # the label the chart's affinity selects
    efa_templates = [t for t in run.of_type(TEMPLATE) if "efa" in json.dumps(t.plain_inputs["spec"])]
    assert efa_templates and all(run.one(RELEASE).urn in t.dependencies for t in efa_templates)
    assert "kube-system/aws-dranet chart=aws-dranet 1.0.0" in plan.render_table(run)
    # A Helm release, not a manifest: -o yaml names it in its closing comment block only.
    assert "aws-dranet" not in yaml.safe_dump_all(plan.kubernetes_manifests(run))
    assert [r["release"] for r in plan.helm_releases(run)] == ["aws-dranet"]


def test_a_stack_without_efa_nodes_installs_none() -> None:
    run = run_stack({**project_defaults(), "driverImage": IMAGE, "claimTemplatesModule": "",
                     "nodeGroups": [{"name": "inf2", "instanceType": "inf2.48xlarge", "desiredSize": 1}]})
    assert not run.of_type(RELEASE)
    with pytest.raises(SettingError) as err:
        run_stack({**project_defaults(), "driverImage": IMAGE, "claimTemplatesModule": "", "efaDriver": "install",
                   "nodeGroups": [{"name": "inf2", "instanceType": "inf2.48xlarge", "desiredSize": 1}]})
    assert err.value.field == "neuron-dra:efaDriver" and "no node group or node pool has EFA" in err.value.allowed


def test_an_existing_cluster_needs_efa_driver_set_for_efa_templates() -> None:
    base = {**project_defaults(), "kubeconfig": KUBECONFIG, "clusterInstanceTypes": ["trn2.48xlarge"],
            "driverImage": IMAGE}
    with pytest.raises(SettingError) as err:
        run_stack(base)
    assert "neuron-dra:efaDriver" in str(err.value) and "default/neuron-efa-aligned" in str(err.value)
    run = run_stack({**base, "efaDriver": "install"})
    assert run.one(RELEASE).plain_inputs["values"]["supportedInstanceLabels"]["values"] == ["trn2.48xlarge"]
    with pytest.raises(SettingError) as err:
        run_stack({**base, "efaDriver": "always"})
    assert err.value.field == "neuron-dra:efaDriver" and err.value.allowed == "auto or install or external"


def test_an_efa_driver_with_another_device_class_is_refused_for_templates_of_the_default_one() -> None:
    def program() -> ClaimTemplates:
        efa = EfaDraDriver("efa", EfaDraDriverArgs(node_groups=["trn2"], device_class_name="efa.example.com"))
        return ClaimTemplates("t", ClaimTemplatesArgs(templates=[ClaimTemplate("aligned", Neuron(4), Efa(4))],
                                                      instance_types=["trn2.48xlarge"], efa_driver=efa))

    with pytest.raises(SettingError) as err:
        run_offline(program)
    assert err.value.value == "efa.networking.k8s.aws" and "DeviceClass efa.example.com" in err.value.allowed
