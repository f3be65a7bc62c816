"""NeuronCores on Kubernetes 1.36 in the default stack (issue 29 item 4): off unless a claim template requests
them or coreExtendedResourceName names a resource; then `pulumi preview` warns with the predicted scheduler CPU per
claim pod at the node groups' and pools' maximum size (claim_templates/scale.py's model), and refuses past the
scheduler's 10 s DRA filter limit unless allowSlowClaimScheduling. On 1.37 they are on by default, no warning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.claim_templates import ClaimTemplate, NeuronCores
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.scale import estimate
from neuron_dra.components import core_scale
from neuron_dra.components import plan as stack_plan
from neuron_dra.components.mocks import OfflineRun
from neuron_dra.components.settings import SettingError
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.catalog import BUILTIN

IMAGE = "registry.example.com/neuron-dra-driver:1"


@pytest.fixture
def cores_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "core_claims_i29.py").write_text(
        "from neuron_dra.claim_templates import ClaimTemplate, NeuronCores\n"
        "two_cores = ClaimTemplate('two-cores', NeuronCores(2, instance_types='trn2.48xlarge'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "core_claims_i29"


def plan(caplog: pytest.LogCaptureFixture, **config: Any) -> tuple[OfflineRun[Any], list[str]]:
    raw = {"neuron-dra:driverImage": IMAGE, "neuron-dra:claimTemplatesModule": "",
           **{f"neuron-dra:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}}
    caplog.clear()
    with caplog.at_level("WARNING"):
        run = stack_plan.plan(raw)
    return run, [r.getMessage() for r in caplog.records if "NeuronCores on Kubernetes" in r.getMessage()]


def core_flag(run: OfflineRun[Any]) -> str | None:
    (ds,) = [m for m in stack_plan.kubernetes_manifests(run) if m["kind"] == "DaemonSet"
             and m["metadata"]["name"] != "neuron-monitor"]  # the driver's
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--core-partitions") + 1] if "--core-partitions" in args else None


def device_classes(run: OfflineRun[Any]) -> list[str]:
    return [m["metadata"]["name"] for m in stack_plan.kubernetes_manifests(run) if m["kind"] == "DeviceClass"]


def test_the_default_stack_on_136_publishes_whole_devices_only(caplog: pytest.LogCaptureFixture) -> None:
    run, warnings = plan(caplog)
    assert core_flag(run) == "off" and device_classes(run) == ["neuron.aws.com"]
    assert warnings == []


def test_a_neuroncores_template_turns_them_on_and_preview_says_the_cost(caplog: pytest.LogCaptureFixture,
                                                                        cores_module: str) -> None:
    groups = [{"name": "trn2", "desiredSize": 1, "maxSize": 20}, {"name": "trn1", "instanceType": "trn1.32xlarge",
                                                                  "desiredSize": 0, "maxSize": 10}]
    pools = [{"name": "p", "instanceTypes": ["trn2.48xlarge"], "maxNodes": 10}]
    run, warnings = plan(caplog, claimTemplatesModule=cores_module, nodeGroups=groups, nodePools=pools)
    assert core_flag(run) == "on" and device_classes(run) == ["neuron.aws.com", "neuroncore.aws.com"]
    # the model's figure at 20 + 10 + 10 nodes, the costliest instance type of the stack
    worst = max((estimate(ClaimTemplate("two-cores", NeuronCores(2, instance_types="trn2.48xlarge")), 40, t,
                          NodeCatalog(partitionable=True), shared_counters=True) for t in ("trn2.48xlarge",
                                                                                            "trn1.32xlarge")),
                key=lambda e: e.cpu_ms_per_pod)
    (warning,) = warnings
    assert "(for claim template default/two-cores)" in warning and "kubernetes#138917" in warning
    assert f"about {worst.cpu_ms_per_pod:.0f} ms of scheduler CPU per claim pod at 40 nodes" in warning
    assert 100 < worst.cpu_ms_per_pod < 10_000  # seconds' worth, not yet past the limit


def test_a_custom_driver_name_reads_the_templates_with_its_own_class_names(caplog: pytest.LogCaptureFixture,
                                                                           cores_module: str) -> None:
    """A template that follows its driver names the renamed NeuronCore class: the stack's choice sees it (it
    once read the default names, chose off, and the templates' own check then refused the stack)."""
    run, warnings = plan(caplog, claimTemplatesModule=cores_module, driverName="neuron.example.com")
    assert core_flag(run) == "on"
    assert sorted(device_classes(run)) == ["cores.neuron.example.com", "neuron.example.com"]
    (template,) = [m for m in stack_plan.kubernetes_manifests(run) if m["kind"] == "ResourceClaimTemplate"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "cores.neuron.example.com"
    (warning,) = warnings
    assert "(for claim template default/two-cores)" in warning


def test_a_template_is_rendered_once_and_each_caller_gets_its_own_copy() -> None:
    template = ClaimTemplate("two-cores", NeuronCores(2))
    first, second = template.to_manifest(), template.to_manifest()
    assert first == second and first is not second
    first["spec"]["spec"]["devices"]["requests"].clear()
    assert template.to_manifest() == second  # a caller's change does not reach the next one


def test_a_core_extended_resource_turns_them_on(caplog: pytest.LogCaptureFixture) -> None:
    run, warnings = plan(caplog, coreExtendedResourceName="aws.amazon.com/neuroncore")
    assert core_flag(run) == "on"
    (core,) = [m for m in stack_plan.kubernetes_manifests(run) if m["metadata"]["name"] == "neuroncore.aws.com"]
    assert core["spec"]["extendedResourceName"] == "aws.amazon.com/neuroncore"
    assert len(warnings) == 1 and "neuron-dra:coreExtendedResourceName aws.amazon.com/neuroncore" in warnings[0]


def test_past_the_filter_limit_preview_refuses_unless_allowed(caplog: pytest.LogCaptureFixture,
                                                              cores_module: str) -> None:
    pools = [{"name": "p", "instanceTypes": ["trn2.48xlarge"], "maxNodes": 400}]
    with pytest.raises(SettingError) as err:
        plan(caplog, claimTemplatesModule=cores_module, nodePools=pools)
    assert err.value.field == "neuron-dra:allowSlowClaimScheduling"
    assert "at 400 nodes" in err.value.allowed and "past the scheduler's 10 s DRA filter limit" in err.value.allowed
    assert "neuron-dra:corePartitions off" in err.value.allowed and "Kubernetes 1.37" in err.value.allowed
    run, warnings = plan(caplog, claimTemplatesModule=cores_module, nodePools=pools, allowSlowClaimScheduling="true")
    assert core_flag(run) == "on" and len(warnings) == 1 and "at 400 nodes" in warnings[0]


def test_on_137_they_are_on_by_default_without_a_warning() -> None:
    # EKS offers no 1.37 yet, so the stack refuses that minor (docs/kubernetes-versions.md §1); the rule the
    # components and the daemon share still decides a 1.37 cluster's driver.
    options = DriverDeployOptions(kubernetes_version="1.37")
    assert options.publishes_cores and deploy.core_partitions_arg(options) is None  # the daemon's own auto
    classes = [m["metadata"]["name"] for m in deploy.manifests(options) if m["kind"] == "DeviceClass"]
    assert classes == ["neuron.aws.com", "neuroncore.aws.com"]
    warnings: list[str] = []
    core_scale.assess(options, "claim template default/two-cores", 1000,
                      [ClaimTemplate("two-cores", NeuronCores(2))], ["trn2.48xlarge"], BUILTIN, allowed=False,
                      override=("x", False), instead="off", warn=warnings.append)
    assert warnings == []


def test_off_with_a_neuroncores_template_is_refused(caplog: pytest.LogCaptureFixture, cores_module: str) -> None:
    with pytest.raises(SettingError) as err:
        plan(caplog, claimTemplatesModule=cores_module, corePartitions="off")
    assert err.value.field == "neuron-dra:corePartitions" and "default/two-cores" in err.value.allowed
    with pytest.raises(SettingError) as bad:
        plan(caplog, corePartitions="yes")
    assert bad.value.field == "neuron-dra:corePartitions" and bad.value.allowed == "auto, on, off"


def test_components_claim_templates_need_a_driver_publishing_cores_and_price_them(caplog: pytest.LogCaptureFixture
                                                                                  ) -> None:
    from neuron_dra.components import ClaimTemplates, NeuronDraDriver, TrainiumCluster, TrainiumNodeGroup
    from neuron_dra.components.mocks import run_offline
    from neuron_dra.driver.deploy import DriverDeployOptions

    template = ClaimTemplate("two-cores", NeuronCores(2, instance_types="trn2.48xlarge"))

    def program(cores: str, max_size: int, allow: bool = False) -> Any:
        cluster = TrainiumCluster("c", kubernetes_version="1.36")
        group = TrainiumNodeGroup("trn2", cluster=cluster, desired_size=1, max_size=max_size,
                                  availability_zones=["us-east-2a"])
        driver = NeuronDraDriver("d", cluster=cluster, image=IMAGE,
                                 options=DriverDeployOptions(core_partitions=cores))
        return ClaimTemplates("t", templates=[template], node_groups=[group], driver=driver,
                              allow_slow_scheduling=allow)

    with pytest.raises(SettingError) as err:  # auto on 1.36: no NeuronCores, so no class for the template
        run_offline(lambda: program("auto", 4))
    assert err.value.field == "NeuronDraDriverArgs.options.core_partitions"
    assert "default/two-cores requests NeuronCores (DeviceClass neuroncore.aws.com)" in err.value.allowed
    assert "core_partitions='on'" in err.value.allowed
    with caplog.at_level("WARNING"):
        run_offline(lambda: program("on", 30))
    assert any("NeuronCores on Kubernetes 1.36 (for claim template default/two-cores)" in r.getMessage()
               and "at 30 nodes" in r.getMessage() for r in caplog.records)
    with pytest.raises(SettingError) as slow:
        run_offline(lambda: program("on", 400))
    assert slow.value.field == "ClaimTemplatesArgs.allow_slow_scheduling" and "at 400 nodes" in slow.value.allowed
    run_offline(lambda: program("on", 400, allow=True))  # overridden: deployed, with the warning
