"""Example claim templates: AWS's eight official Neuron DRA samples, each one short expression, and richer cases.

Render them with `neuron-dra claims render neuron_dra/claim_templates/examples.py`, check them with
`neuron-dra claims check ...`. The official samples are AWS's (docs/neuron-hardware.md §5), written with the typed
classes; tests/test_claims_official_samples.py shows each renders semantically equal to AWS's YAML.
"""

from __future__ import annotations

from neuron_dra.claim_templates import (
    ALL,
    AtLeast,
    ClaimTemplate,
    Connected,
    Efa,
    FirstAvailable,
    Neuron,
    NeuronCores,
    RingSegment,
    UltraServerNode,
)

TRN2 = "trn2.48xlarge"

# --- AWS's official samples ---------------------------------------------------------------------------------
# 4 connected devices (one torus row), aligned on AWS's devicegroup4 id.
neuron_1x4_connected = ClaimTemplate("neuron-1x4-connected", Neuron(4, topology=Connected(), instance_types=TRN2))
# 8 connected devices (two adjacent rows).
neuron_8_connected = ClaimTemplate("neuron-8-connected", Neuron(8, topology=Connected(), instance_types=TRN2))
# The whole node by count.
neuron_whole_node = ClaimTemplate("neuron-whole-node", Neuron(16, instance_types=TRN2))
# Every device of the node.
neuron_all_devices = ClaimTemplate("neuron-all-devices", Neuron(ALL, instance_types=TRN2))
# Every device, with one physical NeuronCore per logical core.
neuron_all_devices_lnc1 = ClaimTemplate("neuron-all-devices-lnc1", Neuron(ALL, instance_types=TRN2, lnc=1))
# Every device of a node whose Neuron kernel driver is exactly 2.25.4.0.
neuron_pinned_kernel_driver = ClaimTemplate("neuron-pinned-kernel-driver", Neuron(ALL, kernel_driver="2.25.4.0"))
# A trn2u node as part of a 4-node UltraServer.
neuron_ultraserver_4 = ClaimTemplate("neuron-ultraserver-4", UltraServerNode(4))
# 4 Neuron devices and the 4 EFAs of the same devicegroup.
neuron_efa_aligned = ClaimTemplate("neuron-efa-aligned", Neuron(4), Efa(4))

OFFICIAL_SAMPLES = (
    neuron_1x4_connected, neuron_8_connected, neuron_whole_node, neuron_all_devices, neuron_all_devices_lnc1,
    neuron_pinned_kernel_driver, neuron_ultraserver_4, neuron_efa_aligned,
)

# --- richer cases -------------------------------------------------------------------------------------------
# A contiguous segment of 4 devices of the inf2.48xlarge ring (segments 0-3, 4-7, 8-11).
inf2_ring_segment_4 = ClaimTemplate("inf2-ring-segment-4",
                                    Neuron(4, topology=RingSegment(), instance_types="inf2.48xlarge"))
# A 3-device ring segment on any inf2 size whose ring length 3 divides (inf2.24xlarge, inf2.48xlarge).
inf2_ring_segment_3 = ClaimTemplate("inf2-ring-segment-3", Neuron(3, topology=RingSegment(), families="inf2"))
# 8 connected trn2 devices with their 8 EFAs in the same devicegroup (one constraint covers both requests).
trn2_8_connected_efa = ClaimTemplate("trn2-8-connected-efa", Neuron(8, topology=Connected(), instance_types=TRN2),
                                     Efa(8))
# 8 connected devices on trn2, else the 16 devices of a trn1.32xlarge.
trn2_8_else_trn1_16 = ClaimTemplate("trn2-8-else-trn1-16", FirstAvailable(
    Neuron(8, topology=Connected(), instance_types=TRN2, name="trn2"),
    Neuron(16, instance_types="trn1.32xlarge", name="trn1")))
# A torus row of Trainium2 at LNC=1 (8 logical cores per device).
trn2_row_lnc1 = ClaimTemplate("trn2-row-lnc1", Neuron(4, topology=Connected(), families="trn2", lnc=1))
# A whole trn2u node in a 4-node UltraServer, every device at LNC=1.
ultraserver_4_whole_node = ClaimTemplate("ultraserver-4-whole-node", UltraServerNode(4, lnc=1),
                                         Neuron(ALL, families="trn2u", lnc=1))
# One device anywhere.
one_neuron_device = ClaimTemplate("one-neuron-device", Neuron(1))
# Two devices with at least 64 GiB HBM each on a node whose kernel driver is 2.25 or newer.
two_big_hbm_devices = ClaimTemplate("two-big-hbm-devices", Neuron(2, min_memory="64Gi", kernel_driver=AtLeast("2.25")))

# Trainium3: the 16 devices of a trn3.48xlarge are all connected through its switch (no constraint needed).
trn3_16_connected = ClaimTemplate("trn3-16-connected", Neuron(16, topology=Connected(), instance_types="trn3.48xlarge"))
# Any 4 Trainium3 devices, 8 logical cores each (LNC=1).
trn3_4_connected_lnc1 = ClaimTemplate("trn3-4-connected-lnc1", Neuron(4, topology=Connected(), families="trn3", lnc=1))

RICHER_CASES = (
    inf2_ring_segment_4, inf2_ring_segment_3, trn2_8_connected_efa, trn2_8_else_trn1_16, trn2_row_lnc1,
    ultraserver_4_whole_node, one_neuron_device, two_big_hbm_devices, trn3_16_connected, trn3_4_connected_lnc1,
)

# --- the templates docs/workloads.md's manifests use (besides one-neuron-device, inf2-ring-segment-4) ------------
# Two NeuronCores of one trn2 device (logical cores at the node's LNC; Kubernetes 1.36+): a small vLLM server.
trn2_two_cores = ClaimTemplate("trn2-two-cores", NeuronCores(2, instance_types=TRN2))
# A whole trn2.48xlarge with all 16 of its EFAs (devicegroup16): one worker of a multi-node training job.
trn2_whole_node_all_efa = ClaimTemplate("trn2-whole-node-all-efa", Neuron(16, instance_types=TRN2), Efa(16))

