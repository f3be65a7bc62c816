"""The nodes the checks simulate: what each catalog instance type publishes, built by the driver's own code.

A node carries the Neuron pool the driver publishes for an emulated host of its type (hosts.emulated_host +
slices.build_pool, as the daemon does) and, where Neuron devices have EFAs of their own, the EFA pool of AWS's
EFA driver as the local cluster models it (efa.efa_driver_devices); its NeuronCores are those of its LNC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from neuron_dra.claim_templates.cel_analysis import RefKind
from neuron_dra.claim_templates.cel_env import CelDevice, split_qualified_name
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.config import LNC_VALUES
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.efa import efa_driver_devices
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.partitions import CoreLayout
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool, resource_slices


def _slice(driver: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 0, "resourceSliceCount": 1}, "devices": devices}}


@dataclass(frozen=True)
class NodeModel:
    """One empty node of an instance type: its ResourceSlices and the DeviceClasses."""

    instance_type: str
    node_name: str
    slices: tuple[dict[str, Any], ...]
    device_classes: tuple[dict[str, Any], ...]
    devices: tuple[CelDevice, ...] = field(repr=False)  # every device of every slice, in slice order
    lnc: int = 1  # the node's LNC its NeuronCores are published at (1 on families without LNC)

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @cached_property
    def attribute_names(self) -> frozenset[str]:
        """Every attribute some device of the node publishes, as `domain/name`."""
        return frozenset(f"{domain}/{name}" for d in self.devices for domain, attrs in d.attributes.items()
                         for name in attrs)


def build_node(host: NeuronHost, node_name: str, drivers: Drivers = DEFAULT_DRIVERS, partitionable: bool = True,
               lnc: int | None = None) -> NodeModel:
    """`partitionable`: the node as the driver publishes it on Kubernetes 1.36+ (NeuronCores and counters at the
    node's LNC, `lnc`, None: the family's default); else whole devices only."""
    cores = CoreLayout.for_spec(host.spec, lnc) if partitionable else None
    pool = build_pool(host, NodeFacts(node_name), PublishOptions(driver_name=drivers.neuron_driver, cores=cores))
    slices = []
    for i, s in enumerate(resource_slices(pool)):
        s["metadata"] = {"name": f"{node_name}-{drivers.neuron_driver}-{i:02d}"}  # visited by name, in this order
        slices.append(s)
    efa = efa_driver_devices(pool, drivers.efa_driver)
    if efa:
        slices.append(_slice(drivers.efa_driver, node_name, efa))
    devices = tuple(CelDevice.from_api(s["spec"]["driver"], d, node_name)
                    for s in slices for d in s["spec"].get("devices") or ())
    layout_lnc = cores.lnc if cores is not None else CoreLayout.for_spec(host.spec, lnc).lnc
    return NodeModel(host.instance_type, node_name, tuple(slices), tuple(drivers.device_classes()), devices,
                     layout_lnc)


class NodeCatalog:
    """Node models per instance type, built once (emulating a host is the slow part)."""

    def __init__(self, drivers: Drivers = DEFAULT_DRIVERS, hardware: Catalog = BUILTIN,
                 partitionable: bool = True) -> None:
        self.drivers = drivers
        self.hardware = hardware
        self.partitionable = partitionable  # nodes as published on 1.36+ (NeuronCores, counters); else devices only
        self._hosts: dict[str, NeuronHost] = {}
        self._nodes: dict[tuple[str, int], NodeModel] = {}
        self._published: dict[tuple[RefKind, str], frozenset[str]] | None = None

    def node(self, instance_type: str, lnc: int | None = None) -> NodeModel:
        """An empty node of the type at LNC `lnc` (None: the family's default); check `lnc` with NodeType."""
        spec = self.hardware.spec(instance_type)  # an unknown type lists the known ones
        layout_lnc = CoreLayout.for_spec(spec, lnc).lnc
        model = self._nodes.get((instance_type, layout_lnc))
        if model is None:
            host = self._hosts.get(instance_type)
            if host is None:
                host = self._hosts[instance_type] = emulated_host(instance_type, catalog=self.hardware)
            default = layout_lnc == CoreLayout.for_spec(spec).lnc
            name = f"node-{instance_type}" if default else f"node-{instance_type}-lnc{layout_lnc}"
            model = build_node(host, name, self.drivers, self.partitionable, layout_lnc)
            self._nodes[(instance_type, layout_lnc)] = model
        return model

    def nodes(self, instance_types: Sequence[str] | None = None) -> list[NodeModel]:
        return [self.node(t) for t in (instance_types or list(self.hardware.names))]

    def every_lnc(self, instance_type: str) -> list[NodeModel]:
        """The type's node at each LNC it can run at (one node on families without LNC)."""
        spec = self.hardware.spec(instance_type)
        return [self.node(instance_type, lnc) for lnc in (LNC_VALUES if spec.lnc_supported else (1,))]

    def published(self) -> Mapping[tuple[RefKind, str], frozenset[str]]:
        """Every attribute and capacity name any catalog node publishes at any LNC, by (kind, domain)."""
        if self._published is None:
            names: dict[tuple[RefKind, str], set[str]] = {}
            for node in (n for t in self.hardware.names for n in self.every_lnc(t)):
                for d in node.devices:
                    for kind, by_domain in ((RefKind.ATTRIBUTE, d.attributes), (RefKind.CAPACITY, d.capacity)):
                        for domain, published in by_domain.items():
                            names.setdefault((kind, domain), set()).update(published)
            self._published = {k: frozenset(v) for k, v in names.items()}
        return self._published

    def published_qualified(self) -> frozenset[str]:
        """Attribute names as matchAttribute takes them: `domain/name`."""
        return frozenset(f"{domain}/{name}" for (kind, domain), names in self.published().items()
                         if kind is RefKind.ATTRIBUTE for name in names)


def qualified(name: str, driver: str) -> str:
    domain, ident = split_qualified_name(name, driver)
    return f"{domain}/{ident}"
