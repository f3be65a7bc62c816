"""`neuron-dra demo`: the local cluster with emulated Trainium nodes, the driver, the example claim templates and
example workloads, and where the real scheduler put them.

Steps: check the workloads' templates against the demo's instance types (the prediction); build the Kubernetes
binaries if they are not cached; bring up the local cluster (the supervisor applies the driver's objects); wait
for every node's ResourceSlices; install every example template in the demo namespace (the apiserver compiles
their CEL); create the workloads stage by stage (see workloads.py; the UltraServer job once its group device is
published, its shared claim before its pods); wait until they run; show the table, each node's topology and an
SVG (an UltraServer's nodes framed together), checking that the job's pods share one UltraServer; on 1.36+ fault
two devices and show the taints, the pod's health and a new claim avoiding them, then clear the fault
(health.py); tear down unless asked to keep the cluster. Every wait is bounded, and the cluster is stopped on any
failure or interrupt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from neuron_dra.claim_templates import Checker, CheckReport, ClaimTemplate
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.catalog import get_instance_spec
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.localcluster import build
from neuron_dra.localcluster.build import (
    DEFAULT_MINOR,
    cache_root,
    check_minor,
    kube_version,
)
from neuron_dra.localcluster.cluster import LocalCluster, build_all, down, up
from neuron_dra.localcluster.controlplane.prometheus import attribution
from neuron_dra.localcluster.demo.health import (
    HEALTH_INSTANCE_TYPE,
    HealthOutcome,
    HealthStage,
    plan_faults,
    pod_claims,
)
from neuron_dra.localcluster.demo.health import raw_json as _raw
from neuron_dra.localcluster.demo.report import (
    PodOutcome,
    ReportError,
    format_table,
    job_summary,
    node_usage,
    node_views,
    outcome_from_record,
    prediction,
)
from neuron_dra.localcluster.demo.topology_view import legend_letters, render_legend, render_svg, render_text
from neuron_dra.localcluster.demo.workloads import (
    DEMO_NAMESPACE,
    DEMO_NODE_ARGS,
    Stage,
    Workload,
    demo_instance_types,
    demo_jobs,
    demo_stages,
    demo_templates,
    pod_manifest,
    runs_health_stage,
)
from neuron_dra.localcluster.nodes.efa_emulator import EFA_DRIVER
from neuron_dra.localcluster.nodes.fakeruntime import created_containers
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.podlogs import api_container_log, container_log, workload_report
from neuron_dra.localcluster.supervisor import PID_FILE, wait_for_service_account

SVG_NAME = "topology.svg"
REPORT_NAME = "report.txt"
DEMO_TTL_S = 1800.0  # without --keep the demo stops the cluster itself; this bounds a demo killed with -9


class DemoError(RuntimeError):
    """The demo could not complete; the message says which step and why."""


@dataclass(frozen=True)
class DemoOptions:
    dir: Path | None = None  # None: a fresh temporary directory
    keep: bool = False
    timeout: float = 180.0  # for the workloads to be scheduled and to run
    start_timeout: float = 300.0  # for the cluster to be ready (binaries cached)
    ttl: float | None = None  # the cluster's own lifetime; default DEMO_TTL_S, or 2 h with keep
    driver_name: str = DEFAULT_DRIVER_NAME
    node_args: tuple[str, ...] = DEMO_NODE_ARGS
    kubernetes_version: str = DEFAULT_MINOR
    runtime: str = "containerd"  # cluster.DEFAULT_RUNTIME; fake: the fake CRI runtime
    prometheus: bool = False  # a Prometheus scraping the drivers; the demo shows what it attributes


@dataclass
class DemoResult:
    dir: Path
    outcomes: list[PodOutcome] = field(default_factory=list)
    svg: Path | None = None
    kubeconfig: Path | None = None
    health: HealthOutcome | None = None  # the device-health stage (1.36+)
    jobs: list[str] = field(default_factory=list)  # what each UltraServer job got (report.job_summary)


class Narrator:
    """Progress lines with the elapsed time, flushed at once (the demo is watched live)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.out.write(f"[{time.monotonic() - self.started:6.1f}s] {message}\n")
        self.out.flush()

    def block(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()


def predictions(checker: Checker, instance_types: Sequence[str], minor: str = DEFAULT_MINOR
                ) -> dict[str, CheckReport]:
    """The check report of each workload's template against the demo's instance types; a template that fits none
    of them stops the demo before anything starts."""
    reports: dict[str, CheckReport] = {}
    for stage in demo_stages(minor, instance_types):
        for w in stage.workloads:
            if w.template.name in reports:
                continue
            report = checker.check(w.template, instance_types)
            if not report.ok:
                raise DemoError(f"claim template {w.template.name} does not fit the demo's nodes: {report.summary()}")
            reports[w.template.name] = report
    return reports


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, explain: Callable[[], str] = lambda: "",
               interval: float = 0.3) -> None:
    if procs.wait_for(predicate, timeout, interval):
        return
    detail = explain()
    raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}" + (f": {detail}" if detail else ""))


class DemoRun:
    """One demo against a running local cluster."""

    def __init__(self, cluster: LocalCluster, api: client.ApiClient, say: Narrator, options: DemoOptions) -> None:
        self.cluster = cluster
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.say = say
        self.options = options
        self.namespace = DEMO_NAMESPACE
        images = cluster.dir / "images.json"
        self.workload_image: str | None = (json.loads(images.read_text())["workload"]
                                           if options.runtime == "containerd" else None)
        self.stages = demo_stages(options.kubernetes_version, [n.instance_type for n in cluster.nodes])

    # --- slices ----------------------------------------------------------------------------------------------

    def _slice_drivers(self) -> dict[str, set[str]]:
        items = _raw(self.resource.list_resource_slice(_preload_content=False)).get("items", [])
        out: dict[str, set[str]] = {}
        for s in items:
            out.setdefault(s["spec"].get("nodeName", ""), set()).add(s["spec"]["driver"])
        return out

    def _missing_slices(self) -> list[str]:
        have = self._slice_drivers()
        missing = []
        for node in self.cluster.nodes:
            wanted = {self.cluster.driver_name}
            if get_instance_spec(node.instance_type).has_device_efa:
                wanted.add(EFA_DRIVER)
            missing += [f"{node.name}/{d}" for d in sorted(wanted - have.get(node.name, set()))]
        return missing

    def wait_for_slices(self) -> None:
        wait_until("every node's ResourceSlices", lambda: not self._missing_slices(), 90,
                   lambda: "missing " + ", ".join(self._missing_slices()) + f" (see {self.cluster.dir}/nodes/*/"
                   "driver.log)")
        total = sum(len(s["spec"].get("devices") or ()) for s in
                    _raw(self.resource.list_resource_slice(_preload_content=False)).get("items", []))
        self.say(f"every node publishes its devices: {total} devices in ResourceSlices")

    # --- UltraServer groups -----------------------------------------------------------------------------------

    def _group_devices(self, job: UltraServerJob) -> list[tuple[str, list[str]]]:
        """The untainted group devices the job's claim can take: (pool, selected nodes)."""
        items = _raw(self.resource.list_resource_slice(_preload_content=False)).get("items", [])
        driver = self.cluster.driver_name
        out = []
        for s in items:
            if not us.is_group_slice(s, driver):
                continue
            for d in s["spec"].get("devices") or ():
                attrs = d.get("attributes") or {}
                if (not d.get("taints") and attrs.get("nodeCount") == {"int": job.nodes}
                        and attrs.get("instanceType", {}).get("string") in job.target_types):
                    out.append((s["spec"]["pool"]["name"], us.selected_nodes(s["spec"].get("nodeSelector") or {})))
        return sorted(out)

    def start_job(self, job: UltraServerJob) -> None:
        """Wait for the group controller to publish a group device the job fits (docs/ultraserver.md §3), then
        create the job's shared claim (its per-pod template is installed with the others)."""
        wait_until(f"a {job.nodes}-node UltraServer group device for job {job.name}",
                   lambda: bool(self._group_devices(job)), 90,
                   lambda: f"see {self.cluster.dir}/ultraserver/controller.log")
        groups = self._group_devices(job)
        self.say(f"the UltraServer group controller publishes {len(groups)} {job.nodes}-node group device(s): "
                 + "; ".join(f"{pool} selects {', '.join(nodes)}" for pool, nodes in groups))
        try:
            self.resource.create_namespaced_resource_claim(self.namespace, job.group_claim())  # type: ignore[arg-type]
        except ApiException as e:
            raise DemoError(f"the apiserver rejected the shared claim {job.claim_name}: {_message(e)}") from e
        self.say(f"created the shared claim {job.claim_name} (one device of class {job.group_class}: "
                 f"{job.group_selector()}); each job pod names it and its own {job.template_name} claim")

    # --- templates -------------------------------------------------------------------------------------------

    def install_templates(self, templates: Sequence[ClaimTemplate]) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": self.namespace}})  # type: ignore[arg-type]
        except ApiException as e:
            if e.status != 409:
                raise DemoError(f"creating namespace {self.namespace}: {e.reason}: {e.body}") from e
        try:
            wait_for_service_account(self.core.api_client, self.namespace, "default", 60.0)
        except RuntimeError as e:
            raise DemoError(str(e)) from e
        for t in templates:
            try:
                self.resource.create_namespaced_resource_claim_template(self.namespace, t.to_manifest())  # type: ignore[arg-type]
            except ApiException as e:
                raise DemoError(f"the apiserver rejected claim template {t.name}: {_message(e)}") from e
        self.say(f"installed {len(templates)} example claim templates in namespace {self.namespace} "
                 "(the apiserver compiled their CEL)")

    # --- pods ------------------------------------------------------------------------------------------------

    def _pod(self, name: str) -> dict[str, Any]:
        return _raw(self.core.read_namespaced_pod(name, self.namespace, _preload_content=False))

    def _pods(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        items = _raw(self.core.list_namespaced_pod(self.namespace, _preload_content=False)).get("items", [])
        return {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in names}

    def _explain(self, names: Sequence[str]) -> str:
        """Why pods are not there yet: scheduling conditions and the kubelet's failure events."""
        pods = self._pods(names)
        notes = []
        for name in names:
            p = pods.get(name)
            if p is None:
                notes.append(f"{name}: gone")
                continue
            node = p["spec"].get("nodeName")
            phase = p.get("status", {}).get("phase")
            conds = [f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".strip()
                     for c in p.get("status", {}).get("conditions", []) if c["status"] != "True"]
            notes.append(f"{name} ({phase}{', on ' + node if node else ''}): {'; '.join(conds) or 'no condition'}")
        for e in self.core.list_namespaced_event(self.namespace).items:
            if e.type == "Warning" and e.involved_object.name in names:
                notes.append(f"event {e.involved_object.name}: {e.reason}: {e.message}")
        return " | ".join(notes[-12:])

    def run_stages(self) -> list[Workload]:
        started: list[Workload] = []
        for number, stage in enumerate(self.stages, start=1):
            names = [w.pod for w in stage.workloads]
            for job in demo_jobs((stage,)):
                self.start_job(job)
            for w in stage.workloads:
                try:
                    manifest = pod_manifest(w, self.namespace, self.workload_image)
                    self.core.create_namespaced_pod(self.namespace, manifest)  # type: ignore[arg-type]
                except ApiException as e:
                    raise DemoError(f"creating pod {w.pod}: {_message(e)}") from e
            started += stage.workloads
            wait_until(f"stage {number} ({', '.join(names)}) to be scheduled",
                       lambda names=names: all(p["spec"].get("nodeName") for p in self._pods(names).values()),  # type: ignore[misc]
                       self.options.timeout, lambda names=names: self._explain(names))  # type: ignore[misc]
            placed = self._pods(names)
            for w in stage.workloads:
                self.say(f"  {w.pod:<16} -> {placed[w.pod]['spec']['nodeName']:<16} {w.shows}")
        names = [w.pod for w in started]

        def running() -> bool:
            pods = self._pods(names)
            return len(pods) == len(names) and all(p.get("status", {}).get("phase") == "Running"
                                                   for p in pods.values())

        wait_until("every workload to run", running, self.options.timeout, lambda: self._explain(names))
        self.say(f"all {len(names)} pods are Running: the driver prepared their claims (CDI specs resolved)")
        return started

    def health_stage(self, outcomes: Sequence[PodOutcome]) -> HealthOutcome:
        """Fault two inf2 devices (one in use, one free), watch the taints, the pod's status and a new claim, then
        clear them (health.py)."""
        inf2 = [n.name for n in self.cluster.nodes if n.instance_type == HEALTH_INSTANCE_TYPE]
        count = get_instance_spec(HEALTH_INSTANCE_TYPE).device_count
        plan = next((p for p in (plan_faults(outcomes, n, count) for n in inf2) if p is not None), None)
        if plan is None:
            raise DemoError(f"the device-health stage needs an {HEALTH_INSTANCE_TYPE} node with a pod and a free "
                            f"device; nodes: {', '.join(n.name for n in self.cluster.nodes)}")
        stage = HealthStage(self.cluster, self.core.api_client, self.namespace, self.say,
                            lambda what, predicate, timeout: wait_until(what, predicate, timeout),
                            self.options.timeout, self.workload_image)
        return stage.run(plan)

    def _allocated_requests(self, pod: str) -> tuple[str, ...]:
        requests: list[str] = []
        p = self._pod(pod)
        for _, claim in pod_claims(self.resource, self.namespace, p):
            for r in claim["status"]["allocation"]["devices"]["results"]:
                # the node's own devices (a shared group claim's result is in a group pool)
                if r["driver"] == self.cluster.driver_name and r["pool"] == p["spec"]["nodeName"] \
                        and r["request"] not in requests:
                    requests.append(r["request"])
        return tuple(requests)

    def record(self, pod_name: str) -> dict[str, Any]:
        """What the node ran for a pod: the devices kubelet had the driver prepare (the claims' allocation on the
        pod's node) and each container's environment as the fake runtime recorded it at CreateContainer (with
        the CDI edits of the ids kubelet passed, resolved against the node's CDI specs)."""
        pod = self._pod(pod_name)
        node = pod["spec"]["nodeName"]
        if self.workload_image is not None:
            containers = self._reported(pod_name, node, pod["metadata"]["uid"])
        else:
            records = self.cluster.node_paths(node).cri_records
            containers = created_containers(records, self.namespace, pod_name, pod["metadata"]["uid"])
            if not containers:
                raise DemoError(f"pod {pod_name} is Running but the fake runtime of {node} recorded no container of "
                                f"it in {records}")
        claims = {name: {"name": claim["metadata"]["name"], "uid": claim["metadata"]["uid"], "devices": [
            {"requestNames": [r["request"].split("/")[0]], "pool": r["pool"], "device": r["device"]}
            for r in claim["status"]["allocation"]["devices"]["results"] if r["pool"] == node]}
            for name, claim in pod_claims(self.resource, self.namespace, pod)}
        # a shared claim is named in the pod's spec (resourceClaimStatuses lists only claims made from templates)
        shared = [_raw(self.resource.read_namespaced_resource_claim(c["resourceClaimName"], self.namespace,
                                                                    _preload_content=False))
                  for c in pod["spec"].get("resourceClaims") or () if c.get("resourceClaimName")]
        groups = [{"claim": claim["metadata"]["name"], "pool": r["pool"], "device": r["device"],
                   "nodes": us.selected_nodes(claim["status"]["allocation"].get("nodeSelector") or {})}
                  for claim in shared for r in claim["status"]["allocation"]["devices"]["results"]
                  if r["driver"] == self.cluster.driver_name and r["pool"].startswith(us.POOL_PREFIX)
                  and "/" in r["pool"]]
        return {"namespace": self.namespace, "pod": pod_name, "uid": pod["metadata"]["uid"], "node": node,
                "claims": claims, "groups": groups, "containers": containers}

    def _reported(self, pod_name: str, node: str, uid: str) -> dict[str, Any]:
        """What the workload container printed about itself, read as `kubectl logs` does (processes/podlogs.py):
        its `/dev/neuron*` nodes and NEURON_* variables, as containerd applied the CDI specs."""
        report: dict[str, str] = {}
        failures: list[str] = []

        def complete() -> bool:
            try:
                text = api_container_log(self.core, self.namespace, pod_name, "main")
            except client.exceptions.ApiException as e:
                failures[:] = [f"the API server answered {e.status} {e.reason}: {str(e.body)[:300]}"]
                return False
            report.update(workload_report(text))
            return report.get("ready") == "yes"

        def explain() -> str:
            on_node = container_log(self.cluster.node_paths(node).kubelet.pod_logs, self.namespace, pod_name, "main",
                                    uid)
            return (f"`kubectl logs {pod_name} -n {self.namespace} -c main` has no complete report"
                    + (f" ({failures[0]})" if failures else "")
                    + f"; the log file on {node} has {len(on_node.splitlines())} lines")

        wait_until(f"the log of {pod_name} to show its devices", complete, 60.0, explain)
        devices = [d for d in report.get("devices", "").split() if d]
        env = {k: v for k, v in report.items() if k.startswith("NEURON_") and v}
        return {"main": {"env": env, "deviceNodes": [f"/dev/{d}" for d in devices],
                         "efa": report.get("efa", "").split()}}

    def outcomes(self, workloads: Sequence[Workload], reports: dict[str, CheckReport]) -> list[PodOutcome]:
        types = {n.name: n.instance_type for n in self.cluster.nodes}
        out = []
        for w in workloads:
            record = self.record(w.pod)
            node = record["node"]
            o = outcome_from_record(record, w.template.name, types[node],
                                    where=str(self.cluster.node_paths(node).cri_records))
            if self.workload_image is not None:
                seen = tuple(int(d.removeprefix("/dev/neuron")) for d in record["containers"]["main"]["deviceNodes"])
                if tuple(sorted(seen)) != o.neuron_devices:
                    raise DemoError(f"pod {w.pod}'s container sees /dev/neuron{list(seen)} but its claims hold "
                                    f"devices {list(o.neuron_devices)}")
            # the request names as allocated (`req/subreq` for firstAvailable); drivers get only `req`
            out.append(dataclasses.replace(o, requests=self._allocated_requests(w.pod),
                                           prediction=prediction(reports[w.template.name], types[node])))
        return out


def _message(e: ApiException) -> str:
    try:
        body = json.loads(e.body or "")
        return str(body.get("message", e.body))
    except (TypeError, ValueError, AttributeError):
        return f"{e.status} {e.reason}"


def show(result: DemoResult, cluster: LocalCluster, say: Narrator) -> str:
    """The table, the node usage and the topology pictures; writes the SVG. Returns the text shown."""
    outcomes = result.outcomes
    counts = {n.instance_type: get_instance_spec(n.instance_type).device_count for n in cluster.nodes}
    views = node_views(cluster.nodes, outcomes)
    letters = legend_letters(views)
    seen = ("what each container printed to its own log (containerd applied the CDI specs)"
            if (cluster.dir / "images.json").exists() else "the container environment the fake runtime recorded at "
            "CreateContainer")
    parts = ["", f"Where the scheduler put each pod (devices: the claims' allocation; cores: {seen}; CHECK PREDICTED: "
                 "claims per empty node and the first claim's devices, from `neuron-dra claims check`):", "",
             format_table(outcomes), *result.jobs, *([""] if result.jobs else []),
             "Devices in use:", node_usage(cluster.nodes, outcomes, counts),
             "Topology (letters: pods; '.': free):", render_legend(letters), ""]
    for view in views:
        parts += [render_text(view, letters), ""]
    text = "\n".join(parts)
    say.block(text)
    svg = result.dir / SVG_NAME
    svg.write_text(render_svg(views), encoding="utf-8")
    (result.dir / REPORT_NAME).write_text(text, encoding="utf-8")
    result.svg = svg
    say(f"topology picture: {svg}")
    return text


def running_in(cluster_dir: Path) -> bool:
    """Whether a supervisor of a local cluster is alive for `cluster_dir` (the demo must not take it over)."""
    return procs.running(cluster_dir / PID_FILE) is not None


def supervisor_children(cluster_dir: Path) -> list[int]:
    """Live supervisors of `cluster_dir` that this process started."""
    me, wanted = os.getpid(), str(cluster_dir).encode()

    return procs.matching(lambda pid, argv: b"neuron_dra.localcluster.supervisor" in argv and wanted in argv
                          and procs.parent(pid) == me)


def stop_early_supervisors(cluster_dir: Path, wait_s: float = 10.0) -> None:
    """An interrupt right after `up` spawned the supervisor, before it wrote its pid file, leaves it unknown to
    `down`: wait for the pid file and stop it through `down`, else terminate it (it has no children yet)."""
    for pid in supervisor_children(cluster_dir):
        if procs.wait_for((cluster_dir / PID_FILE).exists, wait_s, 0.1):
            down(cluster_dir)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def binaries_cached(minor: str = DEFAULT_MINOR) -> bool:
    """Whether every binary of a `minor` cluster is in the cache (else `ensure_binaries` builds them: minutes)."""
    wanted = [build.kube_target(minor) / n for n in build.KUBE_BINARIES]
    wanted += [build.cache_root() / "etcd" / build.etcd_version() / n for n in build.ETCD_BINARIES]
    return all(os.access(p, os.X_OK) for p in wanted)


def show_attribution(url: str, say: Narrator) -> None:
    """Who holds which device, as the drivers' metrics tell Prometheus (docs/metrics.md)."""
    rows = attribution(url)
    say(f"Prometheus at {url} attributes {len(rows)} prepared devices (neuron_dra_claim_device_info):")
    say.block("\n".join(f"  {node:<18} {device:<24} {pod:<40} cores {cores}" for node, device, pod, cores in rows))


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> DemoResult:
    """Run the demo; raises DemoError (or ClusterError, BuildError) on failure, after stopping the cluster."""
    minor = check_minor(options.kubernetes_version)
    say = Narrator(out)
    made_temp = options.dir is None
    cluster_dir = Path(tempfile.mkdtemp(prefix="neuron-dra-demo-")) if options.dir is None else options.dir
    cluster_dir = cluster_dir.resolve()
    if running_in(cluster_dir):
        raise DemoError(f"a local cluster is already running in {cluster_dir}; stop it with `neuron-dra cluster down "
                        f"--dir {cluster_dir}` or give another --dir")
    result = DemoResult(cluster_dir)
    types = demo_instance_types(options.node_args)
    say(f"checking the workloads' claim templates against {', '.join(types)}")
    reports = predictions(Checker(), types, minor)

    if binaries_cached(minor):
        say(f"Kubernetes {kube_version(minor)} binaries: cached in {cache_root()}")
    else:
        say(f"Kubernetes {kube_version(minor)} binaries (kube-apiserver, kube-controller-manager, kube-scheduler, "
            "kubelet, etcd) are not built yet: building them from the Go module proxy now, once (about 6-12 minutes "
            f"on 2 cores; cached in {cache_root()} afterwards)")
    if options.runtime == "containerd":
        say("containerd (Go module proxy) and the images (pause, workload, the driver from "
            "neuron_dra/driver/Dockerfile; buildah, no registry): built once, cached by content")
    build_all(minor, options.runtime, prometheus=options.prometheus, log=lambda m: say(f"  {m}"))
    ttl = options.ttl if options.ttl is not None else (2 * 3600.0 if options.keep else DEMO_TTL_S)
    say(f"starting the local cluster in {cluster_dir}: " + ", ".join(options.node_args))
    cluster: LocalCluster | None = None
    ok = False
    try:
        cluster = up(cluster_dir, list(options.node_args), ttl=ttl, driver_name=options.driver_name,
                     kubernetes_version=minor, timeout=options.start_timeout, log=say, runtime=options.runtime,
                     prometheus=options.prometheus)
        result.kubeconfig = cluster.kubeconfig
        per_node = ("the real kubelet with containerd and runc, the driver as its DaemonSet pod (image from "
                    "neuron_dra/driver/Dockerfile), an emulated EFA driver" if options.runtime == "containerd" else
                    "the real kubelet against a fake container runtime, the driver daemon, an emulated EFA driver")
        say(f"Kubernetes {kube_version(minor)} control plane ready (etcd, kube-apiserver, "
            f"kube-controller-manager, kube-scheduler); per node: {per_node}")
        run_workloads(cluster, options, say, reports, result)
        ok = True
        return result
    finally:
        if options.keep and ok and cluster is not None:
            say(f"the cluster keeps running (it stops by itself after {ttl / 3600:.1f} h):")
            say.block(f"  export KUBECONFIG={cluster.kubeconfig}\n"
                      f"  kubectl get pods -n {DEMO_NAMESPACE} -o wide\n"
                      f"  neuron-dra cluster down --dir {cluster_dir}")
        else:
            stop_demo_cluster(cluster_dir, say, ok=ok, made_temp=made_temp)


def run_workloads(cluster: LocalCluster, options: DemoOptions, say: Narrator, reports: dict[str, CheckReport],
                  result: DemoResult) -> None:
    """On the ready cluster: slices, templates, the workloads stage by stage, the table checked against the
    prediction, and on 1.36+ the device-health stage; fills `result`."""
    api = config.new_client_from_config(str(cluster.kubeconfig))
    try:
        run = DemoRun(cluster, api, say, options)
        run.wait_for_slices()
        run.install_templates(demo_templates(DEMO_NAMESPACE))
        say("creating the workloads stage by stage (each stage scheduled before the next):")
        workloads = run.run_stages()
        result.outcomes = run.outcomes(workloads, reports)
        result.jobs = job_summaries(run.stages, result.outcomes)
        show(result, cluster, say)
        if cluster.prometheus:
            show_attribution(cluster.prometheus, say)
        wrong = [o.pod for o in result.outcomes if not o.matches_prediction]
        if wrong:
            raise DemoError(f"the allocation of {', '.join(wrong)} differs from what the claim check predicted "
                            "(see AS PREDICTED)")
        if runs_health_stage(options.kubernetes_version):
            result.health = run.health_stage(result.outcomes)
    finally:
        api.close()


def job_summaries(stages: Sequence[Stage], outcomes: Sequence[PodOutcome]) -> list[str]:
    """Each UltraServer job's line, checked (report.job_summary): a job whose pods do not share one UltraServer
    fails the demo."""
    lines = []
    for job in demo_jobs(stages):
        pods = {w.pod for stage in stages for w in stage.workloads if w.job == job}
        try:
            lines.append(job_summary(job.name, job.nodes, [o for o in outcomes if o.pod in pods]))
        except ReportError as e:
            raise DemoError(str(e)) from e
    return lines


def stop_demo_cluster(cluster_dir: Path, say: Narrator, *, ok: bool, made_temp: bool) -> None:
    """Stop the cluster with Ctrl-C and SIGTERM held; after a passed demo in a temporary directory keep only the
    picture, the report and the supervisor log."""
    say("stopping the local cluster")
    # Ctrl-C or SIGTERM now would leave processes behind: hold them until the cluster is down
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        down(cluster_dir)
        stop_early_supervisors(cluster_dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    say("local cluster stopped")
    if ok and made_temp:
        # etcd's data, the node trees, the PKI and the admin kubeconfig of the stopped cluster go
        for heavy in ("controlplane", "nodes"):
            shutil.rmtree(cluster_dir / heavy, ignore_errors=True)
        for name in ("kubeconfig", "status.json"):
            (cluster_dir / name).unlink(missing_ok=True)
    elif not ok:
        say(f"logs kept in {cluster_dir} (supervisor.log, controlplane/, nodes/*/driver.log)")
