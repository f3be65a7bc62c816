"""Pulumi components for Trainium on EKS: `TrainiumCluster`, `TrainiumNodeGroup`, `TrainiumKarpenter`,
`TrainiumNodePool`, `NeuronDraDriver`, `EfaDraDriver`, `UltraServerGroups`, `ClaimTemplates`, the default stack
(`build_stack`, `run_program`) and the mocks to test a stack with (`run_offline`, `PlanMocks`, `OfflineRun`;
docs/components.md, docs/testing-your-stack.md).
"""

from neuron_dra.components.claims import (
    ClaimTemplateCheckError,
    ClaimTemplateLike,
    ClaimTemplates,
    ClaimTemplatesArgs,
)
from neuron_dra.components.cluster import TrainiumCluster, TrainiumClusterArgs
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.efa_driver import EfaDraDriver, EfaDraDriverArgs
from neuron_dra.components.karpenter import TrainiumKarpenter, TrainiumKarpenterArgs
from neuron_dra.components.mocks import OfflineRun, PlanMocks, run_offline
from neuron_dra.components.nodegroup import TrainiumNodeGroup, TrainiumNodeGroupArgs
from neuron_dra.components.nodepool import TrainiumNodePool, TrainiumNodePoolArgs
from neuron_dra.components.settings import NodeGroupSettings, NodePoolSettings, SettingError, StackSettings
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.stack import build_stack, run_program
from neuron_dra.components.ultraserver import UltraServerGroups, UltraServerGroupsArgs

__all__ = [
    "ClaimTemplateCheckError",
    "ClaimTemplateLike",
    "ClaimTemplates",
    "ClaimTemplatesArgs",
    "EfaDraDriver",
    "EfaDraDriverArgs",
    "NeuronDraDriver",
    "NeuronDraDriverArgs",
    "NodeGroupSettings",
    "NodePoolSettings",
    "OfflineRun",
    "PlanMocks",
    "SettingError",
    "StackSettings",
    "TrainiumCluster",
    "TrainiumClusterArgs",
    "TrainiumKarpenter",
    "TrainiumKarpenterArgs",
    "TrainiumNodeGroup",
    "TrainiumNodeGroupArgs",
    "TrainiumNodePool",
    "TrainiumNodePoolArgs",
    "UltraServerGroups",
    "UltraServerGroupsArgs",
    "build_stack",
    "decode_settings",
    "run_offline",
    "run_program",
]
