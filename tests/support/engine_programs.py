"""Inline programs for the real-engine tests (tests/components/test_components_engine.py)."""

from __future__ import annotations

import pulumi

from neuron_dra.components.stack import settings_from_pulumi_config


def settings_report() -> None:
    """Decode the stack's config as the default stack does and export what came out; creates nothing."""
    settings = settings_from_pulumi_config()
    pulumi.export("settings", repr(settings))
    pulumi.export("existingCluster", settings.existing_cluster)
    pulumi.export("kubernetesVersion", settings.kubernetes_version)
    pulumi.export("nodeGroups", [g.name for g in settings.node_groups])
