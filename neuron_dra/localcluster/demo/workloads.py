"""What `neuron-dra demo` installs and runs: the example claim templates in a demo namespace, and workloads
in stages that always fit the demo's nodes (two trn2.48xlarge, one trn1.32xlarge, one inf2.48xlarge and one
trn2u.48xlarge UltraServer of four nodes).

The scheduler spreads pods over nodes, so the order matters. First, where the nodes form a 4-node UltraServer, a
4-pod `UltraServerJob` (docs/ultraserver.md §4): one shared claim of the UltraServer group class and a per-pod
template taking all of its node's devices and EFAs, so its pods take every trn2u node, one each, before anything
else could land there (the trn2 templates of `families="trn2"` or no type fit trn2u too). Then the whole-node pod
is scheduled before anything else of trn2 (it needs an empty trn2 node); the 8-connected pod then takes two
aligned rows of the other trn2, leaving two rows for a row at LNC=1 and a row with its aligned EFAs; only when both
trn2 nodes are full does the firstAvailable pod come, so it lands on trn1 through its second alternative. Last,
on Kubernetes 1.36+ (NeuronCores), two pods with one-core claims share one of the four inf2 devices the ring
segments leave free, on disjoint cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.claim_templates import ClaimTemplate, Neuron, NeuronCores
from neuron_dra.claim_templates.examples import (
    OFFICIAL_SAMPLES,
    RICHER_CASES,
    inf2_ring_segment_4,
    neuron_8_connected,
    neuron_efa_aligned,
    neuron_whole_node,
    trn2_8_else_trn1_16,
    trn2_row_lnc1,
)
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.driver.model.k8s_names import neuron_toleration
from neuron_dra.localcluster.nodes.topology import DEMO_NODES

DEMO_NAMESPACE = "neuron-demo"
DEMO_LABEL = "neuron-dra.aws.com/demo"
TEMPLATE_ANNOTATION = "neuron-dra.aws.com/claim-template"
IMAGE = "public.ecr.aws/neuron/pytorch-training-neuronx:emulated"  # never pulled: the fake runtime runs no containers
ULTRASERVER_TYPE = "trn2u.48xlarge"
# The demo's cluster: `cluster up`'s default nodes and one trn2u UltraServer of four nodes (its own flag).
DEMO_NODE_ARGS = (*DEMO_NODES, f"{ULTRASERVER_TYPE}:4")


@dataclass(frozen=True)
class Workload:
    """One pod of the demo: its name, the claim template it uses and what it shows; `job`: the UltraServer job
    whose shared claim it also names (its template is then the job's per-pod template)."""

    pod: str
    template: ClaimTemplate
    shows: str
    job: UltraServerJob | None = None


@dataclass(frozen=True)
class Stage:
    """Pods created together; the demo waits until all of them are scheduled before the next stage."""

    workloads: tuple[Workload, ...]


# Core sharing (docs/neuron-cores.md): one NeuronCore each, on the inf2 node (2 cores per device).
inf2_one_core = ClaimTemplate("inf2-one-core", NeuronCores(1, instance_types="inf2.48xlarge"))
CORE_STAGE = Stage((
    Workload("core-a", inf2_one_core, "one NeuronCore of an inf2 device"),
    Workload("core-b", inf2_one_core, "the other NeuronCore of the same inf2 device"),
))

# The device-health stage (health.py): a one-device pod created while two inf2 devices are faulted.
inf2_one_device = ClaimTemplate("inf2-one-device", Neuron(1, instance_types="inf2.48xlarge"))
SPARE = Workload("spare", inf2_one_device, "one inf2 device while two are faulted")

# One training job on one UltraServer: 4 pods sharing the claim of one 4-node group device, each with all of its
# node's devices (docs/ultraserver.md §4).
ULTRASERVER_JOB = UltraServerJob("ultra", nodes=4, instance_types=ULTRASERVER_TYPE, namespace=DEMO_NAMESPACE)
ULTRASERVER_STAGE = Stage(tuple(
    Workload(f"ultra-{i}", ULTRASERVER_JOB.node_template(), f"job pod {i + 1} of 4 on one UltraServer: all 16 devices "
             "and EFAs of its node", ULTRASERVER_JOB) for i in range(ULTRASERVER_JOB.nodes)))

DEMO_STAGES: tuple[Stage, ...] = (
    ULTRASERVER_STAGE,
    Stage((Workload("whole-node", neuron_whole_node, "a whole trn2 node (16 devices)"),)),
    Stage((Workload("connected-8", neuron_8_connected, "8 connected trn2 devices (two adjacent torus rows)"),)),
    Stage((
        Workload("row-lnc1", trn2_row_lnc1, "a trn2 torus row at LNC=1 (8 logical cores per device)"),
        Workload("efa-aligned", neuron_efa_aligned, "4 Neuron devices with the 4 EFAs of their devicegroup"),
        Workload("ring-a", inf2_ring_segment_4, "a 4-device segment of the inf2 ring"),
        Workload("ring-b", inf2_ring_segment_4, "another 4-device segment of the inf2 ring"),
    )),
    Stage((Workload("first-available", trn2_8_else_trn1_16,
                    "8 connected trn2 devices, else 16 trn1 devices (trn2 is full by now)"),)),
    CORE_STAGE,
)


def _at_least_1_36(minor: str) -> bool:
    major, _, rest = minor.partition(".")
    return (int(major), int(rest.split(".")[0])) >= (1, 36)


def demo_stages(minor: str, instance_types: Sequence[str] | None = None) -> tuple[Stage, ...]:
    """The stages a cluster of Kubernetes `minor` with nodes of `instance_types` (None: the demo's) runs: core
    sharing needs partitionable devices (1.36+); the UltraServer job needs an UltraServer of trn2u nodes."""
    types = demo_instance_types() if instance_types is None else instance_types
    return tuple(s for s in DEMO_STAGES if (s is not CORE_STAGE or _at_least_1_36(minor))
                 and (s is not ULTRASERVER_STAGE or ULTRASERVER_TYPE in types))


def runs_health_stage(minor: str) -> bool:
    """Device taints are on by default from 1.36 (beta; docs/kubernetes-versions.md), and kubelet 1.36 reports
    device health in pod status."""
    return _at_least_1_36(minor)


def demo_instance_types(node_args: Sequence[str] = DEMO_NODE_ARGS) -> list[str]:
    return list(dict.fromkeys(arg.partition(":")[0] for arg in node_args))


def in_namespace(template: ClaimTemplate, namespace: str) -> ClaimTemplate:
    return template.in_namespace(namespace)


def demo_templates(namespace: str = DEMO_NAMESPACE) -> list[ClaimTemplate]:
    """Every example template (official samples and richer cases) and the UltraServer job's per-pod template, in
    `namespace`."""
    return [in_namespace(t, namespace) for t in (*OFFICIAL_SAMPLES, *RICHER_CASES, inf2_one_core, inf2_one_device,
                                                  ULTRASERVER_JOB.node_template())]


def demo_jobs(stages: Sequence[Stage]) -> list[UltraServerJob]:
    """The UltraServer jobs of `stages`, once each: their shared claims are made before their pods."""
    return list(dict.fromkeys(w.job for stage in stages for w in stage.workloads if w.job is not None))


def workloads() -> list[Workload]:
    return [w for stage in DEMO_STAGES for w in stage.workloads]


def pod_manifest(workload: Workload, namespace: str = DEMO_NAMESPACE, image: str | None = None) -> dict[str, Any]:
    """A pod whose one container gets every device of a claim made from the workload's template. With `image`
    (the workload image of a containerd cluster) the container runs that image's own command, which prints what
    it sees; without, a placeholder the fake runtime never runs."""
    claims: list[dict[str, str]] = [{"name": "neuron", "resourceClaimTemplateName": workload.template.name}]
    if workload.job is not None:  # the job's shared group claim and its per-pod template
        claims = workload.job.pod_claims()
    container: dict[str, Any] = {"name": "main", "image": image or IMAGE,
                                 "resources": {"claims": [{"name": c["name"]} for c in claims]}}
    if image is None:
        container["command"] = ["sleep", "infinity"]
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": workload.pod, "namespace": namespace, "labels": {DEMO_LABEL: "true"},
                     "annotations": {TEMPLATE_ANNOTATION: workload.template.name}},
        "spec": {
            "tolerations": [neuron_toleration()],
            "resourceClaims": claims,
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
        },
    }
    if workload.job is not None:  # and its pod side: the job's label and exclusive-topology affinity (§4)
        pod["metadata"]["labels"].update(workload.job.pod_labels())
        pod["spec"]["affinity"] = workload.job.affinity()
    return pod
