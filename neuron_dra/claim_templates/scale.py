"""What a template's claims cost kube-scheduler at a cluster size: `neuron-dra claims check --nodes N`.

kube-scheduler filters a pod on nodes until it has found `feasible_nodes_to_find(N)` that fit
(schedule_one.go numFeasibleNodesToFind); on each, the DRA plugin evaluates the class and request selectors on
candidate devices, then searches. The estimate counts that work on an empty node of the template's instance type
(the checks' node model) and prices it with costs calibrated with bench/bench_scale.py (docs/scale.md §4). A
per-node estimate near the DRA filter's 10 s timeout is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_dra.claim_templates.allocator import Simulator
from neuron_dra.claim_templates.cel_env import CelEnvironment, CelEvaluationError
from neuron_dra.claim_templates.node_model import NodeCatalog, NodeModel
from neuron_dra.claim_templates.template import ClaimTemplate

DRA_FILTER_TIMEOUT_MS = 10_000.0
WARN_SHARE = 0.5  # warn when the estimate per node reaches this share of the filter timeout
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5
MAX_NODES = 100_000  # beyond Kubernetes' documented 5,000-node limit, far enough for any question

# Calibrated on bench/bench_scale.py (trn2.48xlarge nodes, kube-scheduler 1.36, tuned profile).
POD_MS = 3.0  # per pod, whatever the cluster size: queueing, binding, the claim's status write
NODE_MS = 0.10  # per filtered node: the DRA plugin's per-node setup (pools gathered and converted)
SELECTOR_MS = 0.028  # per CEL selector evaluation on a device (attribute maps built, cost tracker set up)
# Kubernetes 1.36's allocator treats every slice with sharedCounters as shared by all nodes (1.37 keeps a slice with
# a nodeName to its node): each node's filter converts every other node's counter slices and, their pools being
# incomplete there, scans all slices for each (docs/scale.md §2).
COUNTER_POOL_MS = 0.28  # per other node with counters, per filtered node


# The other control-plane processes per claim pod, (ms per pod, ms per allocated device): the claim created from
# the template, its allocation written and watched, the pod bound. A linear fit of bench_scale --together at 1,000
# nodes over the three shapes (1, 4 and 16 devices). See CALIBRATION.
CONTROL_PLANE_MS: Mapping[str, tuple[float, float]] = {
    "kube-apiserver": (36.5, 0.45),
    "etcd": (7.5, 0.35),
    "kube-controller-manager": (8.5, 0.4),
}
CALIBRATION = ("calibrated with bench/bench_scale.py --together at 1,000 trn2.48xlarge nodes, Kubernetes 1.36.5, "
               "tuned profile, on a 2-core machine (a quiet run and one at load 19-23; measured scheduler CPU "
               "came within 0.7-1.4x of this model, docs/scale.md §4-5): a cost model, not a promise")


@dataclass(frozen=True)
class ScaleEstimate:
    template: str
    nodes: int
    instance_type: str
    filtered_nodes: int
    selector_evaluations: int  # per node: candidate devices x selectors, over the claim's requests
    per_node_ms: float
    cpu_ms_per_pod: float  # kube-scheduler's
    others_ms_per_pod: Mapping[str, float] = field(default_factory=dict)  # the other processes (control_plane_ms)

    @property
    def control_plane_s_per_pod(self) -> float:
        """CPU seconds one claim pod costs the whole control plane."""
        return (self.cpu_ms_per_pod + sum(self.others_ms_per_pod.values())) / 1e3

    def cores_for(self, pods_per_s: float) -> float:
        """Control-plane cores a steady rate of these claim pods keeps busy (no headroom)."""
        return pods_per_s * self.control_plane_s_per_pod

    def to_json(self) -> dict[str, Any]:
        return {"instanceType": self.instance_type, "nodes": self.nodes, "filteredNodes": self.filtered_nodes,
                "selectorEvaluations": self.selector_evaluations, "perNodeMs": round(self.per_node_ms, 3),
                "cpuMsPerPod": round(self.cpu_ms_per_pod, 1),
                "controlPlaneCpuMsPerPod": {"kube-scheduler": round(self.cpu_ms_per_pod, 1),
                                            **{k: round(v, 1) for k, v in self.others_ms_per_pod.items()}},
                "controlPlaneCpuSPerPod": round(self.control_plane_s_per_pod, 4), "warning": self.warning}

    @property
    def warning(self) -> str | None:
        if self.per_node_ms >= WARN_SHARE * DRA_FILTER_TIMEOUT_MS:
            return (f"{self.template} at {self.nodes} nodes: about {self.per_node_ms:.0f} ms of DRA filter work per "
                    f"{self.instance_type} node, near the scheduler's {DRA_FILTER_TIMEOUT_MS / 1e3:.0f} s limit per "
                    "node")
        if self.cpu_ms_per_pod >= DRA_FILTER_TIMEOUT_MS:
            return (f"{self.template} at {self.nodes} nodes: about {self.cpu_ms_per_pod / 1e3:.0f} s of scheduler CPU "
                    "per pod: pods wait in line behind each other")
        return None


def feasible_nodes_to_find(nodes: int, percentage: int | None = None) -> int:
    """How many nodes kube-scheduler filters a pod on when all fit (`percentage`: percentageOfNodesToScore,
    None: its adaptive default)."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    percent = percentage if percentage else max(MIN_FEASIBLE_PERCENT, 50 - nodes // 125)
    return min(nodes, max(MIN_FEASIBLE_NODES, nodes * percent // 100))


def check_nodes(nodes: int) -> int:
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"--nodes {nodes}: give a cluster size from 1 to {MAX_NODES} nodes")
    return nodes


def selector_evaluations(template: ClaimTemplate | Mapping[str, Any], node: NodeModel) -> int:
    """CEL selector evaluations that allocating one claim from `template` (or a ResourceClaimSpec) on the empty
    `node` takes, as Go's first-fit search makes them: per request (a firstAvailable one by its first subrequest),
    devices in search order (pools by driver and name, as the claim checks' allocator simulation orders them), each
    device's class selectors then the request's until one is false, until the request's count of devices matched.
    Constraints are not searched: on an empty node the first devices matched fit them (the id-aligned groups)."""
    return _first_fit(template, node)[0]


def _first_fit(template: ClaimTemplate | Mapping[str, Any], node: NodeModel) -> tuple[int, int]:
    """(selector evaluations, devices matched) of selector_evaluations' search."""
    cel = CelEnvironment()
    sim = Simulator(node.slices, node.device_classes, node.node_name, cel=cel)
    classes = {c["metadata"]["name"]: [_expression(s) for s in c["spec"].get("selectors") or ()]
               for c in node.device_classes}
    # Go visits pools sorted by driver and pool name (GatherPools' sortPoolsByID), slices by name within each.
    order = sorted(sim.searched, key=lambda d: (d.id.driver, d.id.pool))
    spec = template.claim_spec() if isinstance(template, ClaimTemplate) else template
    total = devices = 0
    for request in (spec.get("devices") or {}).get("requests") or ():
        body = request.get("exactly") or (request.get("firstAvailable") or [{}])[0]
        expressions = [*classes.get(body.get("deviceClassName", ""), ()),
                       *(_expression(s) for s in body.get("selectors") or ())]
        wanted = len(order) if body.get("allocationMode") == "All" else int(body.get("count", 1))
        matched = 0
        for device in order:
            if matched >= wanted:
                break
            for expression in expressions:
                total += 1
                try:
                    if not cel.evaluate(expression, device.cel):
                        break
                except CelEvaluationError:
                    break
            else:
                matched += 1
        devices += matched
    return total, devices


def _expression(selector: Mapping[str, Any]) -> str:
    return str((selector.get("cel") or {}).get("expression", ""))


def estimate(template: ClaimTemplate, nodes: int, instance_type: str = "trn2.48xlarge",
             catalog: NodeCatalog | None = None, percentage_of_nodes_to_score: int | None = None,
             shared_counters: bool = False) -> ScaleEstimate:
    """The control plane's work for one pod with one claim from `template` in a cluster of `nodes` empty nodes of
    `instance_type` as `catalog` models them (default: whole devices only; `NodeCatalog(partitionable=True)` for
    NeuronCores and counters). `percentage_of_nodes_to_score`: the scheduler's setting, None its adaptive default.
    `shared_counters`: the nodes publish counters to a Kubernetes 1.36 scheduler, which reads every node's counter
    slices on each node."""
    return estimate_spec(template.name, template.claim_spec(), nodes, instance_type, catalog,
                         percentage_of_nodes_to_score, shared_counters)


def estimate_spec(name: str, spec: Mapping[str, Any], nodes: int, instance_type: str = "trn2.48xlarge",
                  catalog: NodeCatalog | None = None, percentage_of_nodes_to_score: int | None = None,
                  shared_counters: bool = False) -> ScaleEstimate:
    """`estimate` for a ResourceClaimSpec written by hand (AWS's sample claims in bench_scale)."""
    check_nodes(nodes)
    node = (catalog or NodeCatalog(partitionable=False)).node(instance_type)
    evaluations, devices = _first_fit(spec, node)
    per_node = NODE_MS + evaluations * SELECTOR_MS
    counters = any(s["spec"].get("sharedCounters") for s in node.slices)
    if shared_counters and counters:
        per_node += (nodes - 1) * COUNTER_POOL_MS
    filtered = feasible_nodes_to_find(nodes, percentage_of_nodes_to_score)
    return ScaleEstimate(name, nodes, instance_type, filtered, evaluations, per_node,
                         POD_MS + filtered * per_node, control_plane_ms(devices))


def control_plane_ms(devices: int) -> Mapping[str, float]:
    """CPU ms per claim pod of the control plane's other processes, by claim size (CONTROL_PLANE_MS)."""
    return {k: base + per_device * devices for k, (base, per_device) in CONTROL_PLANE_MS.items()}
