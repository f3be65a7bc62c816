"""Seeded allocator cases on nodes with NeuronCores and counters (partitionable devices, Kubernetes 1.36+).

Claims: typed `NeuronCores(n)` (aligned groups by matchAttribute), raw core-class requests as the scheduler
makes them for `resources.limits: {aws.amazon.com/neuroncore: k}` (count k, no selectors), whole devices
(`Neuron(k)` and as for `aws.amazon.com/neuron: k`), and several claims at once mixing them. Already allocated:
nothing, random cores, random whole devices, both, or a device together with some of its own cores (an
inconsistent state the counters must still answer the same way in both allocators).
"""

from __future__ import annotations

import random
from typing import Any

from neuron_dra.claim_templates import ClaimTemplate, Neuron, NeuronCores
from neuron_dra.claim_templates.allocator import DeviceId
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from neuron_dra.driver.model.catalog import get_instance_spec
from neuron_dra.driver.model.partitions import CoreLayout, parse_core_device
from tests.support.allocator_cases import Case

CORE_TYPES = ("trn2.48xlarge", "trn2.3xlarge", "trn1.32xlarge", "inf2.48xlarge", "inf2.xlarge", "trn2u.48xlarge")


def _claim(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def _raw(klass: str, count: int) -> dict[str, Any]:
    """What kube-scheduler creates for an extended-resource limit: one request of the class, count, nothing else."""
    return {"devices": {"requests": [{"name": "container-0-request-0",
                                      "exactly": {"deviceClassName": klass, "allocationMode": "ExactCount",
                                                  "count": count}}]}}


class CoreCaseGenerator:
    def __init__(self, seed: int, catalog: NodeCatalog) -> None:
        self.rng = random.Random(seed)
        self.catalog = catalog

    def _devices(self, node: NodeModel) -> tuple[list[DeviceId], list[DeviceId]]:
        cores, whole = [], []
        for s in node.slices:
            for d in s["spec"].get("devices") or ():
                if s["spec"]["driver"] != self.catalog.drivers.neuron_driver:
                    continue
                ref = DeviceId(s["spec"]["driver"], node.node_name, d["name"])
                if parse_core_device(d["name"]):
                    cores.append(ref)
                elif d["attributes"]["resourceType"]["string"] == "neuron_device":
                    whole.append(ref)
        return cores, whole

    def _allocated(self, node: NodeModel) -> tuple[str, tuple[DeviceId, ...]]:
        cores, whole = self._devices(node)
        rng = self.rng
        pick = rng.random()
        if pick < 0.25:
            return "none", ()
        if pick < 0.5:
            p = rng.choice((0.1, 0.3, 0.6, 0.9))
            return f"random cores {int(p * 100)}%", tuple(c for c in cores if rng.random() < p)
        if pick < 0.65:
            k = rng.randint(1, len(whole))
            return f"{k} random devices", tuple(sorted(rng.sample(whole, k)))
        if pick < 0.9:
            devices = rng.sample(whole, rng.randint(0, max(0, len(whole) // 2)))
            taken = {parse_core_device(c.device) for c in cores if rng.random() < 0.4}
            mine = {int(d.device.rsplit("-", 1)[1]) for d in devices}
            keep = [c for c in cores if parse_core_device(c.device) in taken
                    and (parse_core_device(c.device) or (-1, 0))[0] not in mine]
            return "devices and other devices' cores", tuple(sorted([*devices, *keep]))
        device = rng.choice(whole)
        index = int(device.device.rsplit("-", 1)[1])
        own = [c for c in cores if (parse_core_device(c.device) or (-1, 0))[0] == index]
        return "a device and its own cores", (device, *own[: rng.randint(1, len(own))])

    def _request(self, instance_type: str, name: str) -> dict[str, Any]:
        rng = self.rng
        spec = get_instance_spec(instance_type)
        layout = CoreLayout.for_spec(spec)
        kind = rng.random()
        if kind < 0.35:
            n = rng.choice(layout.claim_sizes())
            return _claim(name, ClaimTemplate("t", NeuronCores(n, instance_types=instance_type)).claim_spec())
        if kind < 0.6:
            return _claim(name, _raw(self.catalog.drivers.neuron_core_class, rng.randint(1, min(4, layout.lnc * 2))))
        if kind < 0.8:
            return _claim(name, _raw(self.catalog.drivers.neuron_class, rng.randint(1, min(3, spec.device_count))))
        k = rng.choice([n for n in (1, 2, 4) if n <= spec.device_count])
        return _claim(name, ClaimTemplate("t", Neuron(k, instance_types=instance_type)).claim_spec())

    def generate(self, total: int) -> list[Case]:
        cases = []
        for i in range(total):
            instance_type = self.rng.choice(CORE_TYPES)
            node = self.catalog.node(instance_type)
            claims = tuple(self._request(instance_type, f"c{j}") for j in range(1 if self.rng.random() < 0.7 else
                                                                                self.rng.randint(2, 3)))
            label, allocated = self._allocated(node)
            cases.append(Case(f"cores-{i}", "cores" if len(claims) == 1 else "cores-multi", instance_type, claims,
                              allocated, label))
        return cases
