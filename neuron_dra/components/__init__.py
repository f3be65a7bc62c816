"""Pulumi components for Trainium on EKS: `TrainiumCluster`, `TrainiumNodeGroup`, `TrainiumKarpenter`,
`TrainiumNodePool`, `NeuronDraDriver`, `EfaDraDriver`, `ClaimTemplates`, the default stack (`build_stack`,
`run_program`) and the mocks to test a stack with (`run_offline`, `PlanMocks`, `OfflineRun`; docs/components.md,
docs/testing-your-stack.md).

Names are re-exported lazily: importing `neuron_dra.components` (as the CLI does for every command) does not
import Pulumi; the first access to a component does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TrainiumCluster": "neuron_dra.components.cluster",
    "TrainiumClusterArgs": "neuron_dra.components.cluster",
    "TrainiumNodeGroup": "neuron_dra.components.nodegroup",
    "TrainiumNodeGroupArgs": "neuron_dra.components.nodegroup",
    "TrainiumKarpenter": "neuron_dra.components.karpenter",
    "TrainiumKarpenterArgs": "neuron_dra.components.karpenter",
    "TrainiumNodePool": "neuron_dra.components.nodepool",
    "TrainiumNodePoolArgs": "neuron_dra.components.nodepool",
    "NodePoolSettings": "neuron_dra.components.settings",
    "NeuronDraDriver": "neuron_dra.components.driver",
    "NeuronDraDriverArgs": "neuron_dra.components.driver",
    "EfaDraDriver": "neuron_dra.components.efa_driver",
    "EfaDraDriverArgs": "neuron_dra.components.efa_driver",
    "ClaimTemplates": "neuron_dra.components.claims",
    "ClaimTemplatesArgs": "neuron_dra.components.claims",
    "ClaimTemplateLike": "neuron_dra.components.claims",
    "ClaimTemplateCheckError": "neuron_dra.components.claims",
    "NodeGroupSettings": "neuron_dra.components.settings",
    "StackSettings": "neuron_dra.components.settings",
    "SettingError": "neuron_dra.components.settings",
    "decode_settings": "neuron_dra.components.settings_schema",
    "build_stack": "neuron_dra.components.stack",
    "run_program": "neuron_dra.components.stack",
    "run_offline": "neuron_dra.components.mocks",
    "PlanMocks": "neuron_dra.components.mocks",
    "OfflineRun": "neuron_dra.components.mocks",
}

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
    "build_stack",
    "decode_settings",
    "run_offline",
    "run_program",
]

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'neuron_dra.components' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
