"""Karpenter pools and the EFA DRA driver agree (issue 29 item 5): DRANET runs on the nodes of the node groups and
the pools with EFA interfaces (labels neuron-dra/node-group, neuron-dra/node-pool), pools give ClaimTemplates their
check targets (instance types at the nodes' LNC), templates that request EFA devices must fit where DRANET runs,
and TrainiumKarpenter, TrainiumNodePool and EfaDraDriver take `cluster=` (docs/components.md's example, verbatim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.claim_templates import ClaimTemplate, Efa, Neuron
from neuron_dra.components import EfaDraDriver, EfaDraDriverArgs, plan
from neuron_dra.components.claims import ClaimTemplateCheckError
from neuron_dra.components.mocks import OfflineRun, PlanMocks, run_offline
from neuron_dra.components.settings import NodePoolSettings, SettingError
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.driver.deploy import NODE_GROUP_LABEL, NODE_POOL_LABEL
from tests.components.test_components_composition import python_block

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "kubernetes:helm.sh/v3:Release"
IMAGE = "registry.example.com/neuron-dra-driver:1"


@pytest.fixture(scope="module")
def example() -> OfflineRun[dict[str, Any]]:
    code = python_block(ROOT / "docs" / "components.md", "## EfaDraDriver")

    def program() -> dict[str, Any]:
        scope: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(code, "components.md", "exec"), scope)  # the documented example, verbatim
        return scope

    return run_offline(program, mocks=PlanMocks())


def test_the_example_runs_dranet_on_the_group_and_the_pools(example: OfflineRun[dict[str, Any]]) -> None:
    release = example.one(RELEASE, "efa-release")
    labels = release.plain_inputs["values"]["supportedInstanceLabels"]
    assert labels == {"keys": [NODE_GROUP_LABEL, NODE_POOL_LABEL], "values": ["trn2", "trn2-block", "trn1"]}
    # ... and each pool's nodes carry the label the chart's affinity selects
    pools = {r.name: r.plain_inputs for r in example.of_type("kubernetes:karpenter.sh/v1:NodePool")}
    assert {name: p["spec"]["template"]["metadata"]["labels"][NODE_POOL_LABEL] for name, p in pools.items()} == {
        "trn2-block-nodepool": "trn2-block", "trn1-nodepool": "trn1"}
    cluster_provider = example.one("pulumi:providers:kubernetes", "training-k8s").urn
    for r in (release, *example.of_type("kubernetes:karpenter.sh/v1:NodePool"),
              example.one("kubernetes:helm.sh/v3:Release", "karpenter-chart")):
        assert r.provider.startswith(cluster_provider + "::")  # cluster= gives the cluster's provider
    chart = example.one("kubernetes:helm.sh/v3:Release", "karpenter-chart")
    for pool in example.of_type("kubernetes:karpenter.sh/v1:NodePool"):
        assert chart.urn in pool.dependencies  # karpenter= waits for the CRDs


def test_the_example_checks_templates_against_the_pools_at_their_lnc(example: OfflineRun[dict[str, Any]]) -> None:
    templates = example.result["templates"]
    assert templates.checked_against == ("trn2.48xlarge", "trn2.48xlarge:lnc=1", "trn1.32xlarge")
    karpenter = example.result["karpenter"]
    assert example.one("aws:eks/accessEntry:AccessEntry").plain_inputs["clusterName"] == "training"
    assert karpenter.cluster is example.result["cluster"]


def test_pool_check_targets_name_a_non_default_lnc() -> None:
    pool = NodePoolSettings(name="p", instance_types=("trn2.48xlarge", "trn2.3xlarge"), lnc=1)
    assert pool.check_targets == ("trn2.48xlarge:lnc=1", "trn2.3xlarge:lnc=1")
    assert NodePoolSettings(name="p", instance_types=("trn2.48xlarge",), lnc=2).check_targets == ("trn2.48xlarge",)
    settings = decode_settings({"neuron-dra:nodePools": json.dumps([{"name": "b", "instanceTypes": ["trn2.48xlarge"],
                                                                     "maxNodes": 2, "lnc": 1}])})
    assert settings.check_targets == ("trn2.48xlarge:lnc=1",)


def test_efa_driver_args_take_groups_and_pools() -> None:
    values = EfaDraDriverArgs(node_pools=["block"]).values()["supportedInstanceLabels"]
    assert values == {"keys": [NODE_POOL_LABEL], "values": ["block"]}
    with pytest.raises(SettingError) as err:
        EfaDraDriverArgs(node_pools=["block"], instance_types=["trn2.48xlarge"])
    assert err.value.field == "EfaDraDriverArgs.node_groups" and "not both" in err.value.allowed
    with pytest.raises(SettingError, match="a list of names, not one string"):
        EfaDraDriverArgs(node_pools="block")
    with pytest.raises(SettingError, match=r"EfaDraDriverArgs\.node_pools"):
        EfaDraDriverArgs(node_pools=["a b"])
    assert EfaDraDriver.__module__ == "neuron_dra.components.efa_driver"  # exported from neuron_dra.components


def _stack(pools: list[dict[str, Any]], module: str = "") -> dict[str, Any]:
    return {"neuron-dra:driverImage": IMAGE, "neuron-dra:claimTemplatesModule": module,
            "neuron-dra:nodeGroups": json.dumps([{"name": "trn2"}]), "neuron-dra:nodePools": json.dumps(pools)}


def test_the_stack_runs_dranet_on_efa_pools_by_their_label() -> None:
    run = plan.plan(_stack([{"name": "trn1", "instanceTypes": ["trn1.32xlarge"], "maxNodes": 4},
                                {"name": "inf2", "instanceTypes": ["inf2.48xlarge"], "maxNodes": 2}]))
    (release,) = [r for r in run.of_type(RELEASE) if r.plain_inputs["chart"] == "aws-dranet"]
    assert release.plain_inputs["values"]["supportedInstanceLabels"] == {
        "keys": [NODE_GROUP_LABEL, NODE_POOL_LABEL], "values": ["trn2", "trn1"]}  # inf2 has no EFA


def test_an_efa_template_that_fits_only_a_pool_without_efa_interfaces_is_refused(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    (tmp_path / "efa_claims.py").write_text(
        "from neuron_dra.claim_templates import ClaimTemplate, Efa, Neuron\n"
        "trn1_efa = ClaimTemplate('trn1-efa', Neuron(1, instance_types='trn1.32xlarge'), Efa(1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # trn1.32xlarge (8 EFAs) and trn1.2xlarge (none) in one pool: no interface list, so no EFA interfaces
    mixed = [{"name": "trn1", "instanceFamilies": ["trn1"], "maxNodes": 4}]
    with pytest.raises(ClaimTemplateCheckError) as err:
        plan.plan(_stack(mixed, "efa_claims"))
    message = str(err.value)
    assert "default/trn1-efa" in message and "which the EFA DRA driver publishes only on trn2.48xlarge" in message
    # the same template on a pool whose nodes get EFA interfaces passes
    run = plan.plan(_stack([{"name": "trn1", "instanceTypes": ["trn1.32xlarge"], "maxNodes": 4}], "efa_claims"))
    assert [m["metadata"]["name"] for m in plan.kubernetes_manifests(run)
            if m["kind"] == "ResourceClaimTemplate"] == ["trn1-efa", "neuron-monitor"]  # and neuron-monitor's


def test_templates_check_against_node_pools_given_as_components() -> None:
    template = ClaimTemplate("trn1-one", Neuron(1, instance_types="trn1.32xlarge"))

    def program() -> Any:
        from neuron_dra.components import ClaimTemplates, TrainiumCluster, TrainiumKarpenter, TrainiumNodePool

        cluster = TrainiumCluster("c", kubernetes_version="1.36")
        karpenter = TrainiumKarpenter("k", cluster=cluster)
        pool = TrainiumNodePool("trn1", cluster=cluster, karpenter=karpenter, instance_types=["trn1.32xlarge"])
        return ClaimTemplates("t", templates=[template], node_pools=[pool], opts=None)

    run = run_offline(program, mocks=PlanMocks())
    assert run.result.checked_against == ("trn1.32xlarge",)
    with pytest.raises(SettingError, match=r"TrainiumNodePoolArgs.node_role_name: None is not allowed; allowed: a "
                                           r"value, or karpenter=<TrainiumKarpenter>"):
        run_offline(lambda: __import__("neuron_dra.components", fromlist=["x"]).TrainiumNodePool(
            "p", instance_types=["trn1.32xlarge"], subnet_ids=["subnet-0123456789abcdef0"],
            security_group_ids=["sg-0123456789abcdef0"]))
    _ = Efa  # the example's other request kind is covered by the stack tests above
