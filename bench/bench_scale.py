"""Benchmark: what claim pods cost the real kube-scheduler at 100 to 1,000+ trn2.48xlarge nodes.

Per cell (node count x variant) a fresh control plane of the default Kubernetes version
(localcluster/controlplane/plane.py: etcd, kube-apiserver, kube-controller-manager, kube-scheduler; the profile of
--profile, `tuned` by default) gets N Node objects and their ResourceSlices through the API (no kubelets). A variant
(VARIANTS) names the slice model (scale_cluster.SLICE_MODELS: "ours", driver/model/slices.py as the daemon
publishes it with --core-partitions off; "ours-cores", with NeuronCores and counters; "aws", the same devices with
AWS's attribute set only; plus the EFA driver's slice per node) and whose claims the pods carry: our typed
templates (SHAPES) or the claims AWS's documentation gives (AWS_CLAIMS). The default compares our templates on our
slices, AWS's claims on our slices and AWS's claims on AWS-shaped slices. The variants' control planes of one
node count run side by side; per pod shape each gets one burst of pods (created 8 at a time as fast as its API
server takes them; the order alternating from shape to shape; with --together all at once). Pods never run: a pod
is scheduled when the scheduler has bound it (spec.nodeName, seen by a watch). After a burst its pods are deleted
and the controller-manager deletes their claims (waited for).

Figures per burst: pods/s (pods / first create -> last bound), p50/p99 time to scheduled (create -> bound),
scheduler CPU per pod (its user+system time from /proc over the burst; robust to other load on the machine,
unlike the wall-clock figures: the load average is printed next to them), and the claim check's prediction
(`neuron-dra claims check --nodes N`, claim_templates/scale.py) next to the measured CPU per pod, and the CPU per pod
of the other control-plane processes (what a claim pod costs the machine besides the scheduler). Per cell: RSS
of etcd, kube-apiserver, kube-controller-manager and kube-scheduler once the objects are loaded.

With --pprof DIR the schedulers serve /debug/pprof and each burst's CPU profile (the first --pprof-seconds of the
burst) is written to DIR/<nodes>-<slices>-<shape>-<HHMMSS>.pprof (read it with `go tool pprof -top FILE`).

With --ultraserver the nodes are trn2u.48xlarge in UltraServers of 4 (label neuron-dra/ultraserver, AWS's way's) and
the pods 4-pod jobs, one pod per node of one UltraServer, each pod with all of its node's devices and EFAs (issue 41,
docs/ultraserver.md). Two variants: "ultra-ours", what the defaults deploy and render: the controller's group
slices as its model renders them with shared counters off (whole and halves, one pool each, next to the nodes'
slices), the nodes labelled as the controller labels its members, and per job UltraServerJob's shared claim, pod
labels and exclusive-topology affinity (on the controller's label); "ultra-aws", AWS's documented way, a
claim of the node's neuron_node pseudo-device per pod beside the same devices-and-EFAs claim (its UltraServerConfig
left out: the scheduler does not read configs) and the pod affinity LeaderWorkerSet's exclusive topology injects
(affinity to the own group's key, anti-affinity to other groups' keys, topology the UltraServer label). The figure
is scheduler CPU per job pod.

Run: python bench/bench_scale.py [--nodes 100,500,1000] [--slices ours,ours-aws-claims,aws] [--shapes ...]
                                 [--pods 100] [--profile tuned] [--dir DIR] [--json FILE] [--pprof DIR]
                                 [--together] [--rate 50] [--cores 16] [--ultraserver]
                                 | --from-json FILE
Quick: python bench/bench_scale.py --nodes 50 --pods 20
UltraServer jobs: python bench/bench_scale.py --ultraserver --nodes 100,500,1000 --pods 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale_cluster, beside this file

from scale_cluster import (
    Api,
    ApiError,
    ScheduledWatch,
    cpu_seconds,
    node_object,
    node_slices,
    pod_object,
    program_pid,
    rss_bytes,
)

from neuron_dra.claim_templates import ClaimTemplate, Connected, Efa, Neuron
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS
from neuron_dra.claim_templates.examples import neuron_1x4_connected, one_neuron_device, trn2_two_cores
from neuron_dra.claim_templates.node_model import NodeCatalog
from neuron_dra.claim_templates.scale import ScaleEstimate, estimate_spec
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.driver.deploy import ultraserver as group_controller
from neuron_dra.driver.model import ultraserver as membership
from neuron_dra.driver.model.emulate import EmulationOptions
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.driver.model.slices import NEURON_NODE
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from neuron_dra.localcluster.controlplane.profiles import PROFILES

NAMESPACE = "bench"
# Pod shape -> its claim template (None: a pod without a claim). 8 connected + 8 EFAs is AWS's aligned-EFA sample
# at 8 (no instance type, like AWS's); the example trn2_8_connected_efa pins trn2.48xlarge, one more test per device.
SHAPES: Mapping[str, ClaimTemplate | None] = {
    "no-claim": None,
    "1-device": one_neuron_device,
    "4-connected": neuron_1x4_connected,
    "8-connected-efa": ClaimTemplate("neuron-8-efa-aligned", Neuron(8, topology=Connected()), Efa(8)),
    "cores": trn2_two_cores,
}
AWS_CLASS = DEFAULT_DRIVER_NAME  # AWS's driver name is also its DeviceClass's
_TRN2 = f'device.attributes["{DEFAULT_DRIVER_NAME}"].instanceType == "trn2.48xlarge"'


def _aws_request(name: str, count: int, selector: str | None, cls: str = AWS_CLASS) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}  # AWS omits allocationMode (ExactCount)
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


# The claims AWS's documentation gives for each shape, as users copy them (docs/neuron-hardware.md §5: the 1x4
# sample; the aligned-EFA sample with 8 and devicegroup8_id; AWS has no one-device sample, so its samples' only
# selector, the instance type). AWS's driver publishes no NeuronCores: no "cores" claim.
AWS_CLAIMS: Mapping[str, Mapping[str, Any]] = {
    "1-device": {"devices": {"requests": [_aws_request("neurons", 1, _TRN2)]}},
    "4-connected": {"devices": {"requests": [_aws_request("neurons", 4, _TRN2)],
                                "constraints": [{"matchAttribute": "resource.aws.com/devicegroup4_id"}]}},
    "8-connected-efa": {"devices": {
        "requests": [_aws_request("neuron", 8, None), _aws_request("efa", 8, None, cls="efa.networking.k8s.aws")],
        "constraints": [{"requests": ["neuron", "efa"], "matchAttribute": "resource.aws.com/devicegroup8_id"}]}},
}
# Variant -> (slice model, claims): whose slices the nodes publish and whose claims the pods carry.
VARIANTS: Mapping[str, tuple[str, str]] = {
    "ours": ("ours", "ours"),  # our templates on our slices
    "ours-aws-claims": ("ours", "aws"),  # AWS's claims on our slices
    "aws": ("aws", "aws"),  # AWS's claims on AWS-shaped slices
    "aws-our-claims": ("aws", "ours"),  # our templates on AWS-shaped slices
    "ours-cores": ("ours-cores", "ours"),
}
COMPONENTS = ("kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager")
DEVICE_SHAPES = ("no-claim", "1-device", "4-connected", "8-connected-efa")
CORE_SHAPES = ("cores",)  # only where NeuronCores are published (ours-cores)
MAX_NODES = 5000  # what the machine's memory could hold at most; a larger --nodes is refused
MAX_PODS = 2000
BURST_TIMEOUT_S = 300.0
MAX_PPROF_S = 600
SHORT = {"kube-apiserver": "apiserver", "kube-controller-manager": "kcm"}
CLEANUP_TIMEOUT_S = 180.0
NODE_PREFIX = "trn2-"  # the emulated nodes: trn2-00000, ...
CATALOGS = {False: NodeCatalog(partitionable=False), True: NodeCatalog(partitionable=True)}  # by NeuronCores


# --- the UltraServer job shape (--ultraserver) ---------------------------------------------------------------------
ULTRA_TYPE = "trn2u.48xlarge"
ULTRA_SIZE = 4
ULTRA_LABEL = "neuron-dra/ultraserver"  # the node label naming the UltraServer (AWS's way needs one)
ULTRA_VARIANTS = ("ultra-ours", "ultra-aws")
# opt-in (--slices with --ultraserver), shapes tried (docs/benchmarks.md "UltraServer jobs"): "-no-affinity",
# ultra-ours's slices without the pods' affinity (UltraServerJob before it rendered one; "ultra-ours-no-counters" in
# earlier runs); "-counters", the same with shared counters (the controller's --shared-counters=auto on 1.36: each
# UltraServer one pool of counters, whole and halves; "ultra-ours" in earlier runs); and without counters or
# affinity: "-whole", no halves published; "-per-device", the groups of one size in few slices with
# perDeviceNodeSelection and a selector per device; "-whole-affinity", no halves, with the affinity.
ULTRA_EXTRA = ("ultra-ours-no-affinity", "ultra-ours-counters", "ultra-ours-whole", "ultra-ours-per-device",
               "ultra-ours-whole-affinity")
ULTRA_AFFINITY = ("ultra-ours", "ultra-ours-whole-affinity")  # pods with UltraServerJob's pod side
PER_DEVICE_SLICE_MAX = 64  # a slice's devices with per-device node selection (MaxDevicesWithAdvancedFeatures)
ULTRA_SHAPE = "ultraserver-job"
ULTRA_NODE_PREFIX = "us-"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
ULTRA_JOB = UltraServerJob("us-job", nodes=ULTRA_SIZE, instance_types=ULTRA_TYPE, namespace=NAMESPACE)
AWS_ULTRA_TEMPLATE = "aws-us-node"


def aws_ultra_claim() -> Mapping[str, Any]:
    """AWS's way per pod: a claim of the node's neuron_node pseudo-device, beside the same devices-and-EFAs claim as
    ours (one claim cannot hold all three: 16 + 16 + 1 passes the 32 devices of one allocation)."""
    node = _aws_request("node", 1, f'device.attributes["{DEFAULT_DRIVER_NAME}"].resourceType == "{NEURON_NODE}"')
    return {"devices": {"requests": [node]}}


@dataclass(frozen=True)
class Burst:
    nodes: int
    slices: str
    shape: str
    pods: int
    scheduled: int
    pods_per_s: float
    p50_ms: float
    p99_ms: float
    scheduler_cpu_ms_per_pod: float
    load_average: float
    predicted_cpu_ms_per_pod: float | None
    predicted_per_node_ms: float | None
    # Every control-plane process's CPU per pod over the burst (etcd, kube-apiserver, kube-controller-manager,
    # kube-scheduler): what one claim pod costs the machine. Empty in runs from before it was recorded.
    component_cpu_ms_per_pod: Mapping[str, float] = field(default_factory=dict)
    # For a burst that did not bind every pod: each unbound pod's PodScheduled condition ("reason: message", or
    # "no condition" when the scheduler never reported on it), so a shortfall says why.
    unscheduled: Mapping[str, str] = field(default_factory=dict)
    # What interrupted the watch that times the bindings (it lists and watches again; empty when nothing did).
    watch_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cell:
    nodes: int
    slices: str
    objects: int  # Nodes + ResourceSlices created
    load_s: float
    rss_mib: Mapping[str, float]
    bursts: tuple[Burst, ...]


def parse_list(text: str, allowed: Sequence[str] | None, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise SystemExit(f"bench_scale: --{what} is empty")
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise SystemExit(f"bench_scale: --{what} {','.join(bad)}: not known; choose from {', '.join(allowed)}")
    return items


def parse_nodes(text: str) -> list[int]:
    out = []
    for t in parse_list(text, None, "nodes"):
        if not t.isdigit() or not 1 <= int(t) <= MAX_NODES:
            raise SystemExit(f"bench_scale: --nodes {t!r}: give whole numbers from 1 to {MAX_NODES}")
        out.append(int(t))
    return out


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_ultraserver_objects(api: Api, n: int, variant: str) -> int:
    """n trn2u.48xlarge Nodes in UltraServers of 4 (the label names each), their slices (one UltraServer's four
    members emulated once, renamed per node) and, for ultra-ours, the controller's group slices."""
    if n % ULTRA_SIZE:
        raise SystemExit(f"bench_scale: --ultraserver --nodes {n}: give a multiple of {ULTRA_SIZE}")
    templates = [node_slices(emulated_host(ULTRA_TYPE, EmulationOptions(host_id="bench-us", ultraserver_node=p,
                                                                          ultraserver_mode=ULTRA_SIZE)),
                             f"template-{p}", "ours") for p in range(ULTRA_SIZE)]
    names = [f"{ULTRA_NODE_PREFIX}{i:05d}" for i in range(n)]
    ours = variant.startswith("ultra-ours")
    facts = {name: membership.MemberFacts(
        name, ULTRA_TYPE, f"us4-{i // 4}", f"us4-{i // 4}-{i % 4 // 2}", i % 4, i % 2, ULTRA_SIZE,
        f"us4-{i // 4}") for i, name in enumerate(names)}
    grouped = membership.group_ultraservers(facts)
    controller_labels = membership.node_labels(grouped, DEFAULT_DRIVER_NAME) if ours else {}
    nodes = []
    for i, name in enumerate(names):
        node = node_object(name)
        node["metadata"]["labels"].update({"node.kubernetes.io/instance-type": ULTRA_TYPE,
                                           ULTRA_LABEL: f"us-{i // ULTRA_SIZE:04d}", **controller_labels.get(name, {})})
        nodes.append(node)
    api.create_all(("/api/v1/nodes", node) for node in nodes)
    slices = [s for i, name in enumerate(names) for s in renamed(templates[i % ULTRA_SIZE], name)]
    if ours:
        groups = membership.desired_slices(grouped, DEFAULT_DRIVER_NAME, counters=variant == "ultra-ours-counters")
        if variant in ("ultra-ours-whole", "ultra-ours-per-device", "ultra-ours-whole-affinity"):
            groups = [g for g in groups if g["spec"]["devices"][0]["name"] == membership.WHOLE_DEVICE]
        slices += per_device_slices(groups) if variant == "ultra-ours-per-device" else groups
    api.create_all(("/apis/resource.k8s.io/v1/resourceslices", s) for s in slices)
    return n + len(slices)


def per_device_slices(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The group slices' devices in one pool of few slices (PER_DEVICE_SLICE_MAX devices each): the slice with
    perDeviceNodeSelection, each device with its group's nodeSelector and a unique name."""
    devices: list[dict[str, Any]] = []
    for g in groups:
        device = dict(g["spec"]["devices"][0])
        device["name"] = f"us-{len(devices):04d}"
        device["nodeSelector"] = g["spec"]["nodeSelector"]
        devices.append(device)
    chunks = [devices[i:i + PER_DEVICE_SLICE_MAX] for i in range(0, len(devices), PER_DEVICE_SLICE_MAX)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"ultraserver-4.all.{k}.{DEFAULT_DRIVER_NAME}",
                          "labels": {membership.MANAGED_BY_LABEL: membership.MANAGED_BY}},
             "spec": {"driver": DEFAULT_DRIVER_NAME, "pool": {"name": f"{membership.POOL_PREFIX}4/all", "generation": 0,
                                                             "resourceSliceCount": len(chunks)},
                      "perDeviceNodeSelection": True, "devices": chunk}} for k, chunk in enumerate(chunks)]


def lws_affinity(key: str) -> dict[str, Any]:
    """The pod affinity LeaderWorkerSet's exclusive topology injects: the own group's pods on the same UltraServer
    label, no other group's pods there."""
    return {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {LWS_GROUP_KEY: key}}, "topologyKey": ULTRA_LABEL}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [{"key": LWS_GROUP_KEY, "operator": "Exists"},
                                                    {"key": LWS_GROUP_KEY, "operator": "NotIn", "values": [key]}]},
             "topologyKey": ULTRA_LABEL}]}}


def ultra_job(job: int) -> UltraServerJob:
    """Job `job` as UltraServerJob renders it: its shared claim `us-job-<job>`; the per-pod template is one for all
    (`us-job-node`, ULTRA_JOB's), created with the namespace."""
    return UltraServerJob(f"{ULTRA_JOB.name}-{job}", nodes=ULTRA_SIZE, instance_types=ULTRA_TYPE, namespace=NAMESPACE)


def ultra_pod(name: str, job: UltraServerJob, variant: str) -> dict[str, Any]:
    """One pod of `job`: ours names the job's shared claim and the per-pod template and, by default, carries the
    job's pod labels and affinity (UltraServerJob's); AWS's way carries its per-pod claim and LeaderWorkerSet's
    exclusive-topology affinity on its own node label."""
    pod = pod_object(name, None)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    if variant.startswith("ultra-ours"):
        spec["resourceClaims"] = [{"name": "ultraserver", "resourceClaimName": job.claim_name},
                                  {"name": "node", "resourceClaimTemplateName": ULTRA_JOB.template_name}]
        container["resources"] = {"claims": [{"name": "ultraserver"}, {"name": "node"}]}
        if variant in ULTRA_AFFINITY:
            pod["metadata"]["labels"] = job.pod_labels()
            spec["affinity"] = job.affinity()
        return pod
    key = job.group_key
    pod["metadata"]["labels"] = {LWS_GROUP_KEY: key}
    spec["resourceClaims"] = [{"name": "ultraserver", "resourceClaimTemplateName": AWS_ULTRA_TEMPLATE},
                              {"name": "node", "resourceClaimTemplateName": ULTRA_JOB.template_name}]
    container["resources"] = {"claims": [{"name": "ultraserver"}, {"name": "node"}]}
    spec["affinity"] = lws_affinity(key)
    return pod


def check_placement(api: Api, n: int) -> None:
    """Every job's bound pods are on distinct nodes of one UltraServer (else the figures measure something else)."""
    by_job: dict[str, list[str]] = {}
    for pod in api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit={n + 1}")["items"]:
        node = pod["spec"].get("nodeName")
        if node:
            by_job.setdefault(pod["metadata"]["name"].rsplit("-", 1)[0], []).append(node)
    for job, nodes in sorted(by_job.items()):
        servers = {int(name[len(ULTRA_NODE_PREFIX):]) // ULTRA_SIZE for name in nodes}
        if len(set(nodes)) != len(nodes) or len(servers) != 1:
            raise ApiError(f"{job}: pods on nodes {sorted(nodes)}: not one per node of one UltraServer")


def ultra_burst(api: Api, api_client: Any, pids: Mapping[str, int], n: int, variant: str, pods: int,
                pprof: Pprof | None = None) -> Burst:
    """pods // 4 jobs (at most one per UltraServer), created job by job; scheduler CPU per bound pod."""
    jobs = min(pods // ULTRA_SIZE, n // ULTRA_SIZE)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    per_job = [ultra_job(j) for j in range(jobs)]
    if variant.startswith("ultra-ours"):
        for job in per_job:
            api.request("POST", claims, job.group_claim())
    watch = ScheduledWatch(api_client, NAMESPACE, BURST_TIMEOUT_S + 60)
    names = [(f"{ULTRA_SHAPE}-{j:04d}-{k}", per_job[j]) for j in range(jobs) for k in range(ULTRA_SIZE)]
    started: dict[str, float] = {}
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    profiling = pprof.start(f"{n}-{variant}-{ULTRA_SHAPE}-{time.strftime('%H%M%S')}") if pprof is not None else None

    def create(name: str, job: UltraServerJob) -> tuple[str, Mapping[str, Any]]:
        started[name] = time.monotonic()
        return f"/api/v1/namespaces/{NAMESPACE}/pods", ultra_pod(name, job, variant)

    api.create_all(create(name, job) for name, job in names)
    deadline = time.monotonic() + BURST_TIMEOUT_S
    while watch.count() < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    load = os.getloadavg()[0]
    times = watch.times()
    watch.stop()
    watch_errors = tuple(watch.errors)
    waits = [times[p] - started[p] for p, _ in names if p in times]
    last = max(times.values()) if times else time.monotonic()
    bound = max(len(times), 1)
    if profiling is not None:
        profiling.join()  # the profile ends before the cleanup's work starts
    missing = unscheduled(api, [p for p, _ in names], times)
    check_placement(api, n)
    api.request("DELETE", f"{claims}?gracePeriodSeconds=0")  # the shared claims: no pod owns them
    cleanup(api)
    return Burst(n, variant, ULTRA_SHAPE, len(names), len(times), len(times) / max(last - t0, 1e-9),
                 1e3 * quantile(waits, 0.5) if waits else float("nan"),
                 1e3 * quantile(waits, 0.99) if waits else float("nan"),
                 1e3 * cpu["kube-scheduler"] / bound, load, None, None,
                 {name: 1e3 * seconds / bound for name, seconds in cpu.items()}, missing, watch_errors)


def load_objects(api: Api, n: int, model: str) -> int:
    host = emulated_host("trn2.48xlarge")
    template = node_slices(host, NODE_PREFIX + "template", model)  # one node's slices; the others differ by name
    names = [f"{NODE_PREFIX}{i:05d}" for i in range(n)]
    api.create_all(("/api/v1/nodes", node_object(name)) for name in names)
    slices = [s for name in names for s in renamed(template, name)] if names else []
    api.create_all(("/apis/resource.k8s.io/v1/resourceslices", s) for s in slices)
    return n + len(slices)


def renamed(slices: Sequence[Mapping[str, Any]], node: str) -> list[dict[str, Any]]:
    out = []
    for s in slices:
        copy = json.loads(json.dumps(s))
        copy["metadata"]["generateName"] = f"{node}-{copy['spec']['driver']}-"
        copy["spec"]["nodeName"] = copy["spec"]["pool"]["name"] = node
        out.append(copy)
    return out


def claim_template(shape: str, claims: str) -> tuple[str, Mapping[str, Any]] | None:
    """(name, ResourceClaimSpec) of the shape's claim under `claims` ("ours": the typed template; "aws": AWS's
    documented claim); None for a pod without a claim or a shape the claims do not have."""
    if claims == "aws":
        spec = AWS_CLAIMS.get(shape)
        return None if spec is None else (f"aws-{shape}", spec)
    template = SHAPES[shape]
    return None if template is None else (template.name, template.claim_spec())


def setup_namespace(api: Api) -> None:
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for dc in (*DEFAULT_DRIVERS.device_classes(),
               group_controller.group_device_class(group_controller.UltraServerControllerOptions())):
        api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", dc)
    ultra_templates = {ULTRA_JOB.template_name: ULTRA_JOB.node_template().claim_spec(),
                       AWS_ULTRA_TEMPLATE: aws_ultra_claim()}
    for name, spec in ultra_templates.items():
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"spec": spec}}
        api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", body)
    for shape in SHAPES:
        for claims in ("ours", "aws"):
            found = claim_template(shape, claims)
            if found is None:
                continue
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": found[0], "namespace": NAMESPACE}, "spec": {"spec": found[1]}}
            api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", body)
    # The scheduler's informers see the objects (and the default service account exists) before the first burst.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
            break
        except ApiError:
            time.sleep(0.5)
    time.sleep(3)


def predict(shape: str, n: int, variant: str, profile: str) -> ScaleEstimate | None:
    """`claims check --nodes n`'s estimate for the variant's claim of the shape on the cell's slices (ours: the
    model the checks use; AWS-shaped slices are not modelled, so their prediction is that of ours) and scheduler
    settings; None for a pod without a claim."""
    model, claims = VARIANTS.get(variant, (variant, "ours"))  # runs from before variants: the slice model
    found = claim_template(shape, claims)
    if found is None:
        return None
    cores = model == "ours-cores"
    return estimate_spec(found[0], found[1], n, catalog=CATALOGS[cores], shared_counters=cores,
                         percentage_of_nodes_to_score=PROFILES[profile].percentage_of_nodes_to_score)


@dataclass(frozen=True)
class Pprof:
    """Where a burst's scheduler CPU profile comes from and goes."""

    api: Api  # its client certificate is the cluster's admin
    scheduler_port: int
    seconds: int
    out_dir: Path

    def start(self, name: str) -> threading.Thread:
        """Fetch a CPU profile of the next `seconds` in the background into out_dir/name.pprof."""
        def fetch() -> None:
            url = f"https://127.0.0.1:{self.scheduler_port}/debug/pprof/profile?seconds={self.seconds}"
            resp = self.api.http.request("GET", url, timeout=urllib3.Timeout(connect=5, read=self.seconds + 60))
            if resp.status != 200:
                raise ApiError(f"GET {url}: HTTP {resp.status}: {resp.data[:300]!r}")
            (self.out_dir / f"{name}.pprof").write_bytes(resp.data)

        thread = threading.Thread(target=fetch, daemon=True, name=f"pprof-{name}")
        thread.start()
        return thread


def burst(api: Api, api_client: Any, pids: Mapping[str, int], n: int, model: str, shape: str, pods: int,
          profile: str, pprof: Pprof | None = None) -> Burst:
    if model in (*ULTRA_VARIANTS, *ULTRA_EXTRA):
        return ultra_burst(api, api_client, pids, n, model, pods, pprof)
    found = claim_template(shape, VARIANTS[model][1])
    watch = ScheduledWatch(api_client, NAMESPACE, BURST_TIMEOUT_S + 60)
    names = [f"{shape}-{i:04d}" for i in range(pods)]
    started: dict[str, float] = {}
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    profiling = pprof.start(f"{n}-{model}-{shape}-{time.strftime('%H%M%S')}") if pprof is not None else None

    def create(name: str) -> tuple[str, Mapping[str, Any]]:
        started[name] = time.monotonic()
        return f"/api/v1/namespaces/{NAMESPACE}/pods", pod_object(name, found[0] if found else None)

    api.create_all(create(name) for name in names)
    deadline = time.monotonic() + BURST_TIMEOUT_S
    while watch.count() < pods and time.monotonic() < deadline:
        time.sleep(0.05)
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    load = os.getloadavg()[0]
    times = watch.times()
    watch.stop()
    watch_errors = tuple(watch.errors)
    waits = [times[p] - started[p] for p in names if p in times]
    last = max(times.values()) if times else time.monotonic()
    prediction = predict(shape, n, model, profile)
    bound = max(len(times), 1)
    if profiling is not None:
        profiling.join()  # the profile ends before the cleanup's work starts
    missing = unscheduled(api, names, times)
    cleanup(api)
    return Burst(n, model, shape, pods, len(times), len(times) / max(last - t0, 1e-9),
                 1e3 * quantile(waits, 0.5) if waits else float("nan"),
                 1e3 * quantile(waits, 0.99) if waits else float("nan"),
                 1e3 * cpu["kube-scheduler"] / bound, load,
                 prediction.cpu_ms_per_pod if prediction else None,
                 prediction.per_node_ms if prediction else None,
                 {name: 1e3 * seconds / bound for name, seconds in cpu.items()}, missing, watch_errors)


def unscheduled(api: Api, names: Sequence[str], bound: Mapping[str, float]) -> dict[str, str]:
    """Each of `names` not in `bound`: its PodScheduled condition as the API server has it (read before cleanup)."""
    if len(bound) == len(names):
        return {}
    found: dict[str, str] = {}
    for pod in api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit={len(names) + 1}")["items"]:
        name = pod["metadata"]["name"]
        if name in bound or name not in names:
            continue
        cond = next((c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"), None)
        found[name] = "no condition" if cond is None else f"{cond.get('reason')}: {cond.get('message')}"[:300]
    return found


def cleanup(api: Api) -> None:
    """Delete the pods at once; the controller-manager deletes their claims (waited for)."""
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    while time.monotonic() < deadline:
        if api.count(f"/api/v1/namespaces/{NAMESPACE}/pods") == 0 and api.count(claims) == 0:
            time.sleep(1)  # the scheduler's informers see the deletions
            return
        time.sleep(0.5)
    raise ApiError(f"pods or claims of namespace {NAMESPACE} still there after {CLEANUP_TIMEOUT_S:.0f} s")


@dataclass(frozen=True)
class Loaded:
    """One model's running control plane with its objects loaded."""

    model: str
    api: Api
    api_client: Any
    pids: Mapping[str, int]  # control-plane program -> pid
    pprof: Pprof | None
    objects: int
    load_s: float
    rss_mib: Mapping[str, float]


def load_plane(stack: ExitStack, base: Path, n: int, model: str, profile: str, log: Any,
               pprof: tuple[Path, int] | None = None, kubernetes: str = DEFAULT_MINOR) -> Loaded:
    plane = stack.enter_context(ControlPlane.start(
        base / f"cp-{n}-{model}", max_lifetime_s=3600, profile=profile, scheduler_profiling=pprof is not None,
        kubernetes_version=kubernetes,
        # No kubelet renews the Nodes' leases: keep them Ready for the run.
        extra_controller_manager_args=("--node-monitor-grace-period=1h", "--node-startup-grace-period=1h")))
    api = Api(plane.server, plane.dir / "pki")
    api_client = plane.api_client()
    stack.callback(api_client.close)
    pids = {p.name: program_pid(p.popen.pid) for p in plane.processes}
    started = time.monotonic()
    objects = (load_ultraserver_objects(api, n, model) if model in (*ULTRA_VARIANTS, *ULTRA_EXTRA)
               else load_objects(api, n, VARIANTS[model][0]))
    setup_namespace(api)
    load_s = time.monotonic() - started
    rss = {name: rss_bytes(pid) / 2**20 for name, pid in pids.items()}
    log(f"{n} nodes, {model} slices: {objects} objects in {load_s:.1f} s; RSS "
        + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()))
    profiler = None if pprof is None else Pprof(api, plane.ports.scheduler, pprof[1], pprof[0])
    return Loaded(model, api, api_client, pids, profiler, objects, load_s, rss)


def run_size(base: Path, n: int, models: Sequence[str], shapes: Sequence[str], pods: int, profile: str,
             log: Any, pprof: tuple[Path, int] | None = None, together: bool = False,
             kubernetes: str = DEFAULT_MINOR) -> list[Cell]:
    """Every model's control plane at once, their bursts interleaved shape by shape (the order alternating), so
    each model's figures come from the same minutes of the machine's load; with `together` the models' bursts of
    a shape run at the same time, so each scheduler works under the same load (the other's included)."""
    with ExitStack() as stack:
        planes = [load_plane(stack, base, n, model, profile, log, pprof, kubernetes) for model in models]
        bursts: dict[str, list[Burst]] = {p.model: [] for p in planes}

        def run(p: Loaded, shape: str) -> Burst:
            return burst(p.api, p.api_client, p.pids, n, p.model, shape, pods, profile, p.pprof)

        for i, shape in enumerate(shapes):
            chosen = [p for p in (planes if i % 2 == 0 else planes[::-1]) if runs_shape(p.model, shape)]
            if together:
                with ThreadPoolExecutor(len(chosen) or 1) as pool:
                    done = list(pool.map(run, chosen, [shape] * len(chosen)))
            else:
                done = [run(p, shape) for p in chosen]
            for p, b in zip(chosen, done, strict=True):
                log(format_burst(b))
                bursts[p.model].append(b)
        return [Cell(n, p.model, p.objects, p.load_s, p.rss_mib, tuple(bursts[p.model])) for p in planes]


def runs_shape(model: str, shape: str) -> bool:
    """Whether a variant's plane gets a burst of the shape (the UltraServer variants: their job shape only)."""
    if model in (*ULTRA_VARIANTS, *ULTRA_EXTRA) or shape == ULTRA_SHAPE:
        return model in (*ULTRA_VARIANTS, *ULTRA_EXTRA) and shape == ULTRA_SHAPE
    if shape in CORE_SHAPES and model != "ours-cores":
        return False
    return shape == "no-claim" or claim_template(shape, VARIANTS[model][1]) is not None


def format_burst(b: Burst) -> str:
    predicted = "" if b.predicted_cpu_ms_per_pod is None else (
        f"  predicted {b.predicted_cpu_ms_per_pod:7.1f} ms/pod ({b.predicted_per_node_ms:.3f} ms/node)")
    missing = "" if b.scheduled == b.pods else f"  ONLY {b.scheduled}/{b.pods} SCHEDULED" + "".join(
        f"\n        {pod}: {why}" for pod, why in sorted(b.unscheduled.items())[:5])
    missing += "".join(f"\n        watch interrupted: {e}" for e in b.watch_errors[:5])
    others = "".join(f" {SHORT.get(k, k)} {v:.1f}" for k, v in b.component_cpu_ms_per_pod.items()
                     if k != "kube-scheduler")
    components = f"  other CPU ms/pod:{others}" if others else ""
    return (f"{b.nodes:5d} nodes {b.slices:15s} {b.shape:16s} {b.pods:4d} pods {b.pods_per_s:7.1f} pods/s  "
            f"p50 {b.p50_ms:8.1f} ms  p99 {b.p99_ms:8.1f} ms  scheduler CPU {b.scheduler_cpu_ms_per_pod:7.2f} ms/pod"
            f"{predicted}  load {b.load_average:.1f}{components}{missing}")


def _medians(cells: Sequence[Cell]) -> dict[tuple[int, str, str], tuple[float, int]]:
    """(nodes, variant, shape) -> (median scheduler CPU ms per pod over the shape's complete bursts, bursts); a
    burst whose pods were not all seen bound is no measurement (its CPU is that of the wait)."""
    by: dict[tuple[int, str, str], list[float]] = {}
    for c in cells:
        for b in c.bursts:
            if b.scheduled == b.pods:
                by.setdefault((b.nodes, b.slices, b.shape), []).append(b.scheduler_cpu_ms_per_pod)
    return {k: (statistics.median(v), len(v)) for k, v in by.items()}


def summary(cells: Sequence[Cell], rate: float = 50.0, cores: int = 16) -> str:
    """Scheduler CPU per claim pod per shape: our templates on our slices and AWS's claims on our slices, each
    against AWS's claims on AWS-shaped slices (medians of a shape's bursts when --shapes names it more than
    once); then the control plane's CPU per claim pod per component and what it implies."""
    lines = ["", "scheduler CPU per claim pod against AWS's claims on AWS-shaped slices (same run; CPU time):"]
    med = _medians(cells)
    for n in sorted({c.nodes for c in cells}):
        for shape in DEVICE_SHAPES[1:]:
            base = med.get((n, "aws", shape))
            if base is None:
                continue
            parts = [f"aws {base[0]:7.2f} ms"]
            for variant in ("ours", "ours-aws-claims", "aws-our-claims"):
                got = med.get((n, variant, shape))
                if got is not None:
                    parts.append(f"{variant} {got[0]:7.2f} ms ({got[0] / max(base[0], 1e-9):4.2f}x)")
            counts = sorted({m[1] for k, m in med.items() if k[0] == n and k[2] == shape})
            runs = f"  (median of {'/'.join(map(str, counts))} bursts)" if counts != [1] else ""
            lines.append(f"  {n:5d} nodes {shape:16s} " + "  ".join(parts) + runs)
    for n in sorted({c.nodes for c in cells}):
        base = med.get((n, "ultra-aws", ULTRA_SHAPE))
        ultra = sorted({k[1] for k in med if k[0] == n and k[1].startswith("ultra-ours")},
                       key=lambda v: (v != "ultra-ours", v))  # every variant of the run, old names included
        for variant in ultra:
            ours = med.get((n, variant, ULTRA_SHAPE))
            if base is not None and ours is not None:
                lines.append(f"  {n:5d} nodes {ULTRA_SHAPE:16s} ultra-aws {base[0]:7.2f} ms  {variant} {ours[0]:7.2f} "
                             f"ms ({ours[0] / max(base[0], 1e-9):4.2f}x; per job pod: the group device against the "
                             "neuron_node claim plus LeaderWorkerSet's exclusive-topology affinity)")
    lines += ["", f"control-plane CPU seconds per claim pod (median over bursts), and what {rate:g} pods/s needs "
                  f"(cores) or {cores} cores sustain (pods/s; derived: CPU per pod only, no headroom):"]
    for c in cells:
        for shape in (*DEVICE_SHAPES[1:], ULTRA_SHAPE):
            bursts = [b for b in c.bursts if b.shape == shape and b.component_cpu_ms_per_pod and b.scheduled == b.pods]
            if not bursts:
                continue
            per = {k: statistics.median(b.component_cpu_ms_per_pod.get(k, 0.0) for b in bursts) / 1e3
                   for k in COMPONENTS}
            total = sum(per.values())
            loads = f"{min(b.load_average for b in bursts):.1f}-{max(b.load_average for b in bursts):.1f}"
            lines.append(f"  {c.nodes:5d} nodes {c.slices:15s} {shape:16s} "
                         + " ".join(f"{SHORT.get(k, k)} {v:.4f}" for k, v in per.items())
                         + f"  total {total:.4f} s: {total * rate:5.1f} cores for {rate:g}/s, "
                           f"{cores / max(total, 1e-9):6.1f} pods/s on {cores} cores  (load {loads})")
    return "\n".join(lines) + "\n"


def reprint(path: Path) -> int:
    """The bursts of an earlier run, predictions made again (after a calibration change)."""
    report = json.loads(path.read_text())
    cells = []
    for c in report["cells"]:
        bursts = []
        for b in c["bursts"]:
            p = predict(b["shape"], b["nodes"], b["slices"], report["profile"])
            bursts.append(Burst(**{**b, "predicted_cpu_ms_per_pod": p.cpu_ms_per_pod if p else None,
                                   "predicted_per_node_ms": p.per_node_ms if p else None}))
        cells.append(Cell(**{**c, "bursts": tuple(bursts)}))
    print(f"profile {report['profile']} (from {path})")
    for cell in cells:
        print(f"{cell.nodes} nodes, {cell.slices} slices: {cell.objects} objects in {cell.load_s:.1f} s; RSS "
              + ", ".join(f"{k} {v:.0f} MiB" for k, v in cell.rss_mib.items()))
        for b in cell.bursts:
            print(format_burst(b))
    sys.stdout.write(summary(cells))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", default="100,500,1000", help="node counts, comma-separated")
    parser.add_argument("--slices", default=None,
                        help=f"variants (slices and claims): {', '.join(VARIANTS)} (default "
                             "ours,ours-aws-claims,aws; ours-cores grows with nodes "
                             "squared on 1.36: "
                             "keep it to small clusters)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"pod shapes: {', '.join(SHAPES)} (one named again: another burst, medians reported)")
    parser.add_argument("--pods", type=int, default=100, help=f"pods per burst (1..{MAX_PODS}; at most the nodes)")
    parser.add_argument("--profile", default="tuned", choices=list(PROFILES), help="control-plane profile")
    parser.add_argument("--dir", type=Path, default=None, help="state directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON to this file")
    parser.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                        help="run nothing: print the figures of an earlier --json FILE with today's predictions")
    parser.add_argument("--together", action="store_true",
                        help="run the models' bursts of a shape at the same time (the same load for each scheduler)")
    parser.add_argument("--pprof", type=Path, default=None, metavar="DIR",
                        help="write each burst's scheduler CPU profile to DIR/<nodes>-<slices>-<shape>-<HHMMSS>.pprof")
    parser.add_argument("--rate", type=float, default=50.0,
                        help="claim pods per second to size the control plane's cores for in the summary")
    parser.add_argument("--cores", type=int, default=16,
                        help="control-plane cores to derive sustained claim pods per second for in the summary")
    parser.add_argument("--ultraserver", action="store_true",
                        help="the UltraServer job shape instead: trn2u.48xlarge nodes in UltraServers of 4, 4-pod "
                             f"jobs; variants {', '.join(ULTRA_VARIANTS)}, or those --slices names of "
                             f"{', '.join((*ULTRA_VARIANTS, *ULTRA_EXTRA))} (--shapes is ignored)")
    parser.add_argument("--kubernetes", default=DEFAULT_MINOR, metavar="MINOR",
                        help=f"the control plane's Kubernetes minor (localcluster/BUILD.md; default {DEFAULT_MINOR})")
    parser.add_argument("--pprof-seconds", type=int, default=30,
                        help=f"how long each profile runs from the burst's start (1..{MAX_PPROF_S})")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        return reprint(args.from_json)
    if not 1 <= args.pods <= MAX_PODS:
        raise SystemExit(f"bench_scale: --pods {args.pods}: give 1 to {MAX_PODS}")
    if not 1 <= args.pprof_seconds <= MAX_PPROF_S:
        raise SystemExit(f"bench_scale: --pprof-seconds {args.pprof_seconds}: give 1 to {MAX_PPROF_S}")
    pprof = None
    if args.pprof is not None:
        args.pprof.mkdir(parents=True, exist_ok=True)
        pprof = (args.pprof, args.pprof_seconds)
    nodes = parse_nodes(args.nodes)
    models = parse_list(args.slices or "ours,ours-aws-claims,aws", list(VARIANTS), "slices") \
        if not args.ultraserver else []
    shapes = parse_list(args.shapes, list(SHAPES), "shapes")
    if args.ultraserver:
        models = (parse_list(args.slices, [*ULTRA_VARIANTS, *ULTRA_EXTRA], "slices") if args.slices
                  else list(ULTRA_VARIANTS))
        shapes = [ULTRA_SHAPE]

    def log(message: str) -> None:
        print(message, flush=True)

    log(f"profile {args.profile}; {os.cpu_count()} CPUs; wall-clock figures depend on the machine's load "
        "(load average per burst), CPU per pod does not")
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    cells = [c for n in nodes
             for c in run_size(base, n, models, shapes, min(args.pods, n), args.profile, log, pprof,
                               args.together, args.kubernetes)]
    sys.stdout.write(summary(cells, args.rate, args.cores))
    if args.json is not None:
        args.json.write_text(json.dumps({"profile": args.profile, "cells": [asdict(c) for c in cells]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
