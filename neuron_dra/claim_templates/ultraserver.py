"""`UltraServerJob`: "N pods, one per node of one UltraServer, each with all of its node's devices (and its EFAs)"
in one call (docs/ultraserver.md §4).

It renders two objects: the shared ResourceClaim of the group DeviceClass (one group device whose `nodeCount` is
N: the scheduler copies the device's node selector into the allocation, so every pod naming the claim lands on a
member), and the per-pod ResourceClaimTemplate taking all of a node's Neuron devices (and, where each device has
its own EFA, all of those, aligned), so at most one job pod fits a node. `pod_claims()` gives the pod spec's
`resourceClaims` naming both. A job larger than every UltraServer of the target types is refused here.

The pod side: `pod_labels()` (the job's group key) and `affinity()`, the pod affinity and anti-affinity that
LeaderWorkerSet's exclusive topology injects, on the Node label the group controller sets on the members of a set of
the job's size (k8s_names.ultraserver_topology_key). It costs nothing in correctness (the shared claim already keeps
the pods together) and prunes the scheduler's work: its later pods reach the DRA allocator on their UltraServer's
nodes only, and a job's first pod skips UltraServers holding another job (docs/ultraserver.md §8).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.keywords import keyword_hints
from neuron_dra.claim_templates.names import check_dns_label, check_dns_subdomain
from neuron_dra.claim_templates.requests import ALL, Efa, Neuron
from neuron_dra.claim_templates.template import API_VERSION, ClaimTemplate
from neuron_dra.driver.model import ultraserver as membership
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.k8s_names import (
    ultraserver_class_name,
    ultraserver_job_label_key,
    ultraserver_topology_key,
)

GROUP_REQUEST = "ultraserver"
GROUP_CLAIM_REF = "ultraserver"  # the pod's resourceClaims entry of the shared claim
NODE_CLAIM_REF = "node"  # ... and of its node's devices
MAX_SHARED_PODS = 256  # status.reservedFor of one claim (docs/ultraserver.md §5)


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@keyword_hints
@dataclass(frozen=True)
class UltraServerJob:
    """`UltraServerJob("train", nodes=4)`: a 4-pod job on the 4 nodes of one trn2u UltraServer."""

    name: str
    nodes: int
    instance_types: Sequence[str] | str = ()  # UltraServer types; empty: every UltraServer type of the catalog
    namespace: str = "default"
    efa: bool | None = None  # all the node's EFAs beside its Neuron devices; None: where every target has them
    lnc: int | None = None
    drivers: Drivers = DEFAULT_DRIVERS
    group_class: str = ""  # "": ultraserver.<driver name> (k8s_names.ultraserver_class_name)
    catalog: Catalog = field(default=BUILTIN, repr=False)

    def __post_init__(self) -> None:
        check_dns_subdomain("UltraServerJob.name", self.name)
        check_dns_subdomain("UltraServerJob.name", self.template_name)
        check_dns_label("UltraServerJob.namespace", self.namespace)
        if isinstance(self.instance_types, str):
            object.__setattr__(self, "instance_types", (self.instance_types,))
        object.__setattr__(self, "instance_types", tuple(self.instance_types))
        if not isinstance(self.drivers, Drivers):
            raise TemplateError("UltraServerJob.drivers", self.drivers, "a Drivers(...) value")
        if not isinstance(self.catalog, Catalog):
            raise TemplateError("UltraServerJob.catalog", self.catalog, "a Catalog")
        object.__setattr__(self, "group_class", self.group_class or ultraserver_class_name(self.drivers.neuron_driver))
        check_dns_subdomain("UltraServerJob.group_class", self.group_class)
        types = self.catalog.types
        ultra = sorted(t for t, s in types.items() if s.ultraserver is not None)
        for t in self.instance_types:
            if t not in ultra:
                raise TemplateError("UltraServerJob.instance_types", t,
                                    f"an UltraServer instance type of the catalog: {', '.join(ultra) or 'none'}")
        targets = self.target_types
        if not targets:
            raise TemplateError("UltraServerJob.instance_types", self.instance_types,
                                "UltraServer instance types (the catalog has none)")
        sizes = {t: types[t].ultraserver.servers for t in targets}  # type: ignore[union-attr]
        most = max(sizes.values())
        modes = sorted({m for t in targets for m in types[t].ultraserver.modes})  # type: ignore[union-attr]
        have = ", ".join(f"{t}: {n} nodes" for t, n in sizes.items())
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= most:
            raise TemplateError("UltraServerJob.nodes", self.nodes,
                                f"1 to {most}: no UltraServer of the target types is larger ({have})")
        if self.nodes not in modes:
            raise TemplateError("UltraServerJob.nodes", self.nodes,
                                f"an UltraServer set size: {', '.join(map(str, modes))} ({have})")
        efa_counts = {t: len(set(types[t].device_efa_bdfs)) for t in targets}
        if self.efa is None:
            object.__setattr__(self, "efa", all(efa_counts.values()))
        if self.efa and not all(efa_counts.values()):
            raise TemplateError("UltraServerJob.efa", self.efa, "False: "
                                + ", ".join(t for t, n in efa_counts.items() if not n)
                                + " publish no per-device EFA (docs/trainium3.md §4)")
        if self.efa and len(set(efa_counts.values())) > 1:
            raise TemplateError("UltraServerJob.instance_types", targets,
                                "types with the same number of EFA devices, or efa=False")
        self.node_template()  # checks lnc and the device counts through the typed requests

    @property
    def target_types(self) -> tuple[str, ...]:
        types = self.catalog.types
        return tuple(self.instance_types) or tuple(sorted(t for t, s in types.items() if s.ultraserver is not None))

    @property
    def claim_name(self) -> str:
        return self.name

    @property
    def template_name(self) -> str:
        return f"{self.name}-node"

    def group_selector(self) -> str:
        d = f'device.attributes["{self.drivers.neuron_driver}"]'
        types = self.target_types
        type_test = (f"{d}.instanceType == {_cel_string(types[0])}" if len(types) == 1
                     else f"{d}.instanceType in [{', '.join(map(_cel_string, types))}]")
        return f"{d}.nodeCount == {self.nodes} && {type_test}"

    def group_claim(self) -> dict[str, Any]:
        """The shared ResourceClaim: one group device of `nodes` nodes of the target types."""
        request = {"name": GROUP_REQUEST, "exactly": {
            "deviceClassName": self.group_class, "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": self.group_selector()}}]}}
        return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
                "metadata": {"name": self.claim_name, "namespace": self.namespace},
                "spec": {"devices": {"requests": [request]}}}

    def node_template(self) -> ClaimTemplate:
        """Each pod's own claim: all of its node's Neuron devices (and EFAs, aligned on the 16-device group)."""
        requests: list[Neuron | Efa] = [Neuron(ALL, instance_types=self.target_types, lnc=self.lnc,
                                               catalog=self.catalog)]
        if self.efa:
            count = len(set(self.catalog.types[self.target_types[0]].device_efa_bdfs))
            requests.append(Efa(count, aligned_to="neurons", group=16))
        return ClaimTemplate(self.template_name, *requests, namespace=self.namespace, drivers=self.drivers)

    def manifests(self) -> list[dict[str, Any]]:
        """The shared claim, then the per-pod template (create both before the pods)."""
        return [self.group_claim(), self.node_template().to_manifest()]

    def pod_claims(self) -> list[dict[str, str]]:
        """The pod spec's `resourceClaims`; containers list both names under `resources.claims`."""
        return [{"name": GROUP_CLAIM_REF, "resourceClaimName": self.claim_name},
                {"name": NODE_CLAIM_REF, "resourceClaimTemplateName": self.template_name}]

    @property
    def group_key(self) -> str:
        """The job's group key, a label value: the job's name where it is one, else a cut of it and a hash (two
        jobs of one namespace never share a key): the controller's rule for server ids in labels."""
        return membership.label_value(self.name)

    @property
    def job_label(self) -> str:
        """The pod label key naming the job's group: `<driver>/ultraserver-job`."""
        return ultraserver_job_label_key(self.drivers.neuron_driver)

    @property
    def topology_key(self) -> str:
        """The Node label the group controller sets whose value is shared by exactly the nodes a job of this size
        may span: `<driver>/ultraserver-pair` for 2 nodes, `<driver>/ultraserver` otherwise."""
        return ultraserver_topology_key(self.drivers.neuron_driver, self.nodes)

    def pod_labels(self) -> dict[str, str]:
        """The labels every pod of the job carries (what `affinity()` selects on)."""
        return {self.job_label: self.group_key}

    def affinity(self) -> dict[str, Any]:
        """The pod spec's `affinity`: LeaderWorkerSet's exclusive topology (its pods together on one value of
        `topology_key`, no other job's pods there), as LeaderWorkerSet injects it
        (leaderworkerset.sigs.k8s.io/exclusive-topology; docs/ultraserver.md §3a). Pod affinity looks at pods of
        the pod's own namespace: across namespaces the shared claim alone keeps jobs apart."""
        key = self.job_label
        return {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {key: self.group_key}}, "topologyKey": self.topology_key}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": key, "operator": "Exists"},
                                                        {"key": key, "operator": "NotIn", "values": [self.group_key]}]},
                 "topologyKey": self.topology_key}]}}


# --- placement: the group devices a cluster's UltraServers publish, and which of them a job's claim takes ----------

MAX_ULTRASERVERS = 100_000  # UltraServers one `--ultraservers` description may count


@dataclass(frozen=True)
class UltraServerSet:
    """`count` UltraServer sets of `nodes` nodes of `instance_type` (each node's `ultraserver_mode` is `nodes`), as
    `neuron-dra cluster up --node trn2u.48xlarge:4` makes one."""

    instance_type: str
    nodes: int
    count: int = 1

    @property
    def label(self) -> str:
        return f"{self.instance_type}:{self.nodes}" + (f"x{self.count}" if self.count != 1 else "")


def parse_ultraservers(text: str, catalog: Catalog = BUILTIN, field_name: str = "--ultraservers"
                       ) -> tuple[UltraServerSet, ...]:
    """`trn2u.48xlarge:4,trn2u.48xlarge:2x3`: one 4-node UltraServer and three 2-node ones (comma-separated
    `TYPE:NODES[xCOUNT]`; NODES a set size the type has: 1, 2 or 4 up to its servers)."""
    ultra = sorted(t for t, s in catalog.types.items() if s.ultraserver is not None)
    rule = (f"TYPE:NODES[xCOUNT], comma-separated: TYPE an UltraServer type of the catalog ({', '.join(ultra)}), "
            "NODES a set size it has (1, 2 or 4, at most its servers), COUNT how many such UltraServers (default 1)")
    out: list[UltraServerSet] = []
    for item in (part.strip() for part in text.split(",")):
        instance_type, _, rest = item.partition(":")
        nodes_text, _, count_text = rest.partition("x")
        spec = catalog.types.get(instance_type)
        if spec is None or spec.ultraserver is None or not nodes_text.isdigit() or \
                (count_text and not count_text.isdigit()):
            raise TemplateError(field_name, item, rule)
        nodes, count = int(nodes_text), int(count_text or 1)
        if nodes not in spec.ultraserver.modes:
            sizes = ", ".join(map(str, spec.ultraserver.modes))
            raise TemplateError(field_name, item, f"{instance_type} sets of {sizes} nodes")
        if not 1 <= count <= MAX_ULTRASERVERS:
            raise TemplateError(field_name, item, f"a COUNT of 1 to {MAX_ULTRASERVERS}")
        out.append(UltraServerSet(instance_type, nodes, count))
    if sum(s.count for s in out) > MAX_ULTRASERVERS:
        raise TemplateError(field_name, text, f"at most {MAX_ULTRASERVERS} UltraServers in all")
    return tuple(out)


@functools.lru_cache(maxsize=64)
def group_devices(instance_type: str, nodes: int, driver: str, catalog: Catalog = BUILTIN
                  ) -> tuple[dict[str, Any], ...]:
    """The group devices the controller publishes for one UltraServer set of `nodes` nodes, grouped and rendered by
    the controller's own model (driver/model/ultraserver.py) from the facts its members' slices carry (class-file
    ids, mode; read from real slices by `member_facts`, tested there). Each device's members are disjoint from
    those of the others of the same `nodeCount` (a whole set, or the two halves of a 4-node set)."""
    members = {}
    for position in range(nodes):
        name = f"{instance_type.replace('.', '-')}-{position}"
        members[name] = membership.MemberFacts(
            name, instance_type, server_id_4="us4", server_id_2=f"us4-{position // 2}", node_id_4=position,
            node_id_2=position % 2, mode=nodes, ultraserver_id="us4")
    grouped = membership.group_ultraservers(members, catalog=catalog)
    if grouped.problems:  # a set size the catalog allows that the model refuses: a bug, not the user's input
        raise AssertionError(f"{instance_type} UltraServer of {nodes}: " + "; ".join(map(str, grouped.problems)))
    return tuple(d for s in membership.desired_slices(grouped, driver) for d in s["spec"]["devices"])
