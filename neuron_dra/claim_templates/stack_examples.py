"""The examples that fit a trn2.48xlarge node group: what a default stack (one trn2.48xlarge group) can deploy.

`examples` also holds UltraServer (trn2u) and inf2 templates, whose checks rightly fail a stack without such
nodes; point a stack's claim templates module here when its node groups are trn2.48xlarge only.
"""

from __future__ import annotations

from neuron_dra.claim_templates.examples import (
    neuron_1x4_connected,
    neuron_8_connected,
    neuron_all_devices,
    neuron_all_devices_lnc1,
    neuron_efa_aligned,
    neuron_pinned_kernel_driver,
    neuron_whole_node,
    one_neuron_device,
    trn2_8_connected_efa,
    trn2_8_else_trn1_16,
    trn2_row_lnc1,
    two_big_hbm_devices,
)

__all__ = [
    "neuron_1x4_connected", "neuron_8_connected", "neuron_all_devices", "neuron_all_devices_lnc1",
    "neuron_efa_aligned", "neuron_pinned_kernel_driver", "neuron_whole_node", "one_neuron_device",
    "trn2_8_connected_efa", "trn2_8_else_trn1_16", "trn2_row_lnc1", "two_big_hbm_devices",
]
