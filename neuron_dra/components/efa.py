"""EFA network interfaces of a launch template, from the hardware catalog. Pure Python.

Rules (docs/eks-trainium.md §2): one EFA per network card; network card 0 carries the primary interface
at device index 0 with interface type `efa` (an EFA-only interface cannot be primary); every other card i
carries one interface at device index 1, `efa` or `efa-only` (EFA-only interfaces take no IP address and need
VPC CNI 1.18.4+).

Karpenter's EC2NodeClass (`karpenter_interfaces`) takes only `interface` (ENA) and `efa-only`, and requires the
primary (card 0, device 0) to be `interface`; so, as EC2 recommends for EFA instances with several network cards
(docs/karpenter.md §3): card 0 carries the ENA primary at device 0 and an EFA-only interface at device 1, and every
other card one EFA-only interface at device 0. The EFA count per instance is the same as in a launch template.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_dra.driver.model.catalog import InstanceSpec

INTERFACE_TYPES = ("efa-only", "efa")


@dataclass(frozen=True)
class EfaInterface:
    network_card_index: int
    device_index: int
    interface_type: str  # efa | efa-only


def efa_interfaces(spec: InstanceSpec, secondary_type: str = "efa-only") -> tuple[EfaInterface, ...]:
    """The interfaces a launch template declares for `spec`; empty for instance types without EFA."""
    if secondary_type not in INTERFACE_TYPES:
        raise ValueError(f"EFA interface type {secondary_type!r} is not allowed; allowed: {', '.join(INTERFACE_TYPES)}")
    if spec.efa_count == 0:
        return ()
    primary = EfaInterface(network_card_index=0, device_index=0, interface_type="efa")
    secondary = (
        EfaInterface(network_card_index=card, device_index=1, interface_type=secondary_type)
        for card in range(1, spec.efa_count)
    )
    return (primary, *secondary)


def karpenter_interfaces(spec: InstanceSpec) -> tuple[EfaInterface, ...]:
    """The `networkInterfaces` of a Karpenter EC2NodeClass for `spec`; empty for instance types without EFA
    (Karpenter then attaches its default single interface)."""
    if spec.efa_count == 0:
        return ()
    primary = EfaInterface(network_card_index=0, device_index=0, interface_type="interface")
    efa = (EfaInterface(network_card_index=card, device_index=1 if card == 0 else 0, interface_type="efa-only")
           for card in range(spec.efa_count))
    return (primary, *efa)
