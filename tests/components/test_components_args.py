"""Issue 39 finding 8: the components' Args refuse an unknown keyword naming the closest field (as the claim
classes do), still a TypeError; EfaDraDriver(cluster=...) refuses a node group or pool the cluster does not have."""

from __future__ import annotations

from typing import Any

import pytest

from neuron_dra.components import (
    ClaimTemplatesArgs,
    EfaDraDriver,
    EfaDraDriverArgs,
    NeuronDraDriver,
    NeuronDraDriverArgs,
    TrainiumCluster,
    TrainiumClusterArgs,
    TrainiumKarpenter,
    TrainiumKarpenterArgs,
    TrainiumNodeGroup,
    TrainiumNodePool,
)
from neuron_dra.components.inputs import UnknownKeywordError
from neuron_dra.components.mocks import run_offline
from neuron_dra.components.settings import SettingError


@pytest.mark.parametrize(("args", "typo", "meant"), [
    (TrainiumClusterArgs, "kubernetes_versoin", "kubernetes_version"),
    (NeuronDraDriverArgs, "imag", "image"),
    (EfaDraDriverArgs, "node_group", "node_groups"),
    (TrainiumKarpenterArgs, "chart_verison", "chart_version"),
    (ClaimTemplatesArgs, "template", "templates"),
])
def test_an_unknown_keyword_names_the_closest_field(args: Any, typo: str, meant: str) -> None:
    with pytest.raises(UnknownKeywordError) as err:
        args(**{typo: "1"})
    assert isinstance(err.value, TypeError) and err.value.value == typo
    assert err.value.field == f"{args.__name__}() keyword" and f"did you mean {meant!r}?" in err.value.allowed


@pytest.mark.parametrize(("component", "typo"), [
    (TrainiumCluster, "vpcid"), (NeuronDraDriver, "imge"), (TrainiumKarpenter, "clster")])
def test_the_component_keywords_say_the_same(component: Any, typo: str) -> None:
    with pytest.raises(UnknownKeywordError, match="did you mean"):
        run_offline(lambda: component("x", **{typo: "1"}))


def test_efa_driver_refuses_a_group_or_pool_the_cluster_does_not_have() -> None:
    def program(groups: list[str], pools: list[str]) -> Any:
        cluster = TrainiumCluster("training", kubernetes_version="1.36")
        TrainiumNodeGroup("trn2", cluster=cluster, instance_type="trn2.48xlarge", desired_size=1,
                          availability_zones=["us-east-2a"])
        karpenter = TrainiumKarpenter("karpenter", cluster=cluster)
        TrainiumNodePool("trn1", cluster=cluster, karpenter=karpenter, instance_types=["trn1.32xlarge"])
        return EfaDraDriver("efa", cluster=cluster, node_groups=groups, node_pools=pools)

    assert run_offline(lambda: program(["trn2"], ["trn1"])).result.node_groups
    with pytest.raises(SettingError) as err:
        run_offline(lambda: program(["tr2"], []))
    assert err.value.field == "EfaDraDriverArgs.node_groups" and err.value.value == "tr2"
    assert "(trn2:" in err.value.allowed and "did you mean 'trn2'?" in err.value.allowed
    with pytest.raises(SettingError) as pools:
        run_offline(lambda: program([], ["trn3"]))
    assert pools.value.field == "EfaDraDriverArgs.node_pools" and "(trn1:" in pools.value.allowed
