"""End-to-end with real containers: `cluster up --runtime containerd` (containerd + runc under the real kubelet,
the driver as the DaemonSet of `deploy.manifests()` from the image built from neuron_dra/driver/Dockerfile, workloads in
the busybox workload image). Two nodes; the tests run in file order and the last one stops the cluster and
checks that nothing outside the cluster directory changed."""

from __future__ import annotations

import io
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane import pki
from neuron_dra.localcluster.demo.run import DemoOptions, DemoRun, Narrator
from neuron_dra.localcluster.nodes.nodens import host_listening
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.podlogs import api_container_log, container_log, workload_report
from tests.support import hoststate
from tests.support.e2e import (
    NEURON_TOLERATION,
    allocated_devices,
    claim_template,
    create_namespace,
    eventually,
    pod_claim,
    raw,
)

pytestmark = [pytest.mark.cluster, pytest.mark.containerd, pytest.mark.slow]

DRIVER = "neuron.aws.com"
NODES = ("trn2.48xlarge:1", "trn1.32xlarge:1")
TRN2, TRN1 = "trn2-48xlarge-1", "trn1-32xlarge-1"
DRIVER_NS = "neuron-dra-driver"
DRIVER_SELECTOR = "app.kubernetes.io/name=neuron-dra-driver,app.kubernetes.io/component=kubelet-plugin"
DAEMONSET = "neuron-dra-driver-kubelet-plugin"


@pytest.fixture(scope="module")
def host_before() -> dict[str, Any]:
    return hoststate.snapshot()


@pytest.fixture(scope="module")
def ctrd(host_before: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from neuron_dra.localcluster.cluster import up

    cluster = up(tmp_path_factory.mktemp("ctrd"), list(NODES), ttl=3600, timeout=1800, runtime="containerd")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def kapi(ctrd: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(ctrd.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def wns(kapi: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    name = f"ctrd-{request.node.name.replace('_', '-')[5:40].strip('-').lower()}"
    create_namespace(core, name)
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(name).items, 90, what=f"pods of {name} gone")
    eventually(lambda: not res.list_namespaced_resource_claim(name).items, 60, what=f"claims of {name} gone")
    core.delete_namespace(name)


def images(cluster: LocalCluster) -> dict[str, str]:
    data: dict[str, str] = json.loads((cluster.dir / "images.json").read_text())
    return data


def workload_pod(name: str, image: str, node: str, template: str | None = "one-device",
                 init_sleep: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
    spec: dict[str, Any] = {"tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": node},
                            "containers": [container]}
    if template:
        spec["resourceClaims"] = [{"name": "neuron", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "neuron"}]}
    if init_sleep:
        spec["initContainers"] = [{"name": "wait", "image": image, "imagePullPolicy": "Never",
                                   "command": ["sleep", str(init_sleep)]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def report_of(core: client.CoreV1Api, ns: str, pod: str) -> dict[str, str]:
    """The workload's `key=value` report from its container log as `kubectl logs` reads it, once complete."""

    def complete() -> dict[str, str] | None:
        report = workload_report(api_container_log(core, ns, pod, "main"))
        return report if report.get("ready") == "yes" else None

    return eventually(complete, 60, what=f"the report of {ns}/{pod}")


def wait_running(core: client.CoreV1Api, ns: str, pod: str, timeout: float = 120) -> dict[str, Any]:
    return eventually(lambda: p if (p := raw(core.read_namespaced_pod(pod, ns, _preload_content=False)))[
        "status"].get("phase") == "Running" else None, timeout, what=f"{ns}/{pod} Running")


def driver_pods(core: client.CoreV1Api) -> dict[str, dict[str, Any]]:
    """The driver pods bound to a node, by node (a replacement the scheduler has not bound yet has no nodeName);
    a pod still terminating gives way to its node's other pod."""
    items = raw(core.list_namespaced_pod(DRIVER_NS, label_selector=DRIVER_SELECTOR, _preload_content=False))["items"]
    items.sort(key=lambda p: p["metadata"].get("deletionTimestamp") is None)
    return {node: p for p in items if (node := p["spec"].get("nodeName"))}


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def test_driver_is_the_daemonset_from_the_built_image_ready_on_both_nodes(ctrd: LocalCluster,
                                                                          kapi: client.ApiClient) -> None:
    refs = images(ctrd)
    assert set(refs) == {"driver", "workload"}
    assert refs["driver"].startswith("localhost/neuron-dra-driver:")
    apps = client.AppsV1Api(kapi)

    def ds_ready() -> Any:  # the DaemonSet controller reports the pods' readiness a moment after they are Ready
        ds: Any = apps.read_namespaced_daemon_set("neuron-dra-driver-kubelet-plugin", DRIVER_NS)
        return ds if ds.status.number_ready == 2 else None

    assert eventually(ds_ready, 60, what="DaemonSet numberReady 2").status.desired_number_scheduled == 2
    pods = driver_pods(client.CoreV1Api(kapi))
    assert set(pods) == {TRN2, TRN1}
    for node, pod in pods.items():
        assert ready(pod)
        (container,) = pod["spec"]["containers"]
        assert container["image"] == refs["driver"] and "livenessProbe" in container
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, f"the driver on {node} restarted (liveness probe failing?)"
        log = ctrd.node_paths(node).kubelet.log.read_text(errors="replace")
        assert f'Registered DRA plugin" driverName="{DRIVER}"' in log or \
            ("Registered DRA plugin" in log and DRIVER in log)


def test_a_claim_pods_container_sees_exactly_its_devices_and_cores(ctrd: LocalCluster, kapi: client.ApiClient,
                                                                  wns: str) -> None:
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    res.create_namespaced_resource_claim_template(wns, claim_template(  # type: ignore[arg-type]
        "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
    core.create_namespaced_pod(wns, workload_pod("w", images(ctrd)["workload"], TRN2))  # type: ignore[arg-type]
    wait_running(core, wns, "w")
    report = report_of(core, wns, "w")
    claim = pod_claim(core, res, wns, "w")
    (device,) = allocated_devices(claim, DRIVER)
    index = int(device.rsplit("-", 1)[-1])
    assert report["devices"] == f"neuron{index}"
    cdi_dir = ctrd.node_paths(TRN2).base / "run" / "cdi"
    uid = claim["metadata"]["uid"]
    specs = [json.loads(f.read_text()) for f in cdi_dir.iterdir() if uid in f.read_text()]
    env = {e.split("=", 1)[0]: e.split("=", 1)[1] for s in specs for d in s.get("devices", [])
           for e in d.get("containerEdits", {}).get("env", [])}
    env.update({e.split("=", 1)[0]: e.split("=", 1)[1] for s in specs
                for e in s.get("containerEdits", {}).get("env", [])})
    assert env["NEURON_RT_VISIBLE_CORES"], specs
    assert report["NEURON_RT_VISIBLE_CORES"] == env["NEURON_RT_VISIBLE_CORES"]
    # The demo's table reads the same report through the API (`kubectl logs`), not from the node's files.
    demo = DemoRun(ctrd, kapi, Narrator(io.StringIO()), DemoOptions(runtime="containerd"))
    demo.namespace = wns
    seen = demo.record("w")["containers"]["main"]
    assert seen["deviceNodes"] == [f"/dev/neuron{index}"]
    assert seen["env"]["NEURON_RT_VISIBLE_CORES"] == env["NEURON_RT_VISIBLE_CORES"]


def test_kubectl_logs_exec_and_port_forward_reach_the_kubelet_inside_the_node(
        ctrd: LocalCluster, kapi: client.ApiClient, wns: str) -> None:
    """The API server's pod log, exec and portforward endpoints (what `kubectl logs/exec/port-forward` call) go to
    the pod's kubelet in its node's network namespace: the log is the one kubelet wrote on the node."""
    from kubernetes.stream import stream

    core = client.CoreV1Api(kapi)
    core.create_namespaced_pod(wns, workload_pod("l", images(ctrd)["workload"], TRN1,  # type: ignore[arg-type]
                                                 template=None))
    uid = wait_running(core, wns, "l")["metadata"]["uid"]
    report = report_of(core, wns, "l")
    assert report["devices"] == "" and report["ready"] == "yes"
    on_node = container_log(ctrd.node_paths(TRN1).kubelet.pod_logs, wns, "l", "main", uid)
    assert api_container_log(core, wns, "l", "main").startswith(on_node.rstrip("\n"))
    serve = "mkdir -p /tmp/w && echo forwarded-from-$(hostname) > /tmp/w/i && busybox httpd -p 127.0.0.1:8080 -h /tmp/w"
    out = stream(core.connect_get_namespaced_pod_exec, "l", wns, container="main",
                 command=["sh", "-c", f"echo exec-in-$(hostname) && {serve}"], stderr=True, stdin=False,
                 stdout=True, tty=False)
    assert out.strip() == "exec-in-l"
    assert http_through_port_forward(core, wns, "l", 8080, "/i").endswith(b"\r\n\r\nforwarded-from-l\n")


def http_through_port_forward(core: client.CoreV1Api, ns: str, pod: str, port: int, path: str) -> bytes:
    """An HTTP/1.0 GET of `path` to the pod's `port` through the API server's portforward subresource."""
    from kubernetes.stream import portforward

    forward = portforward(core.connect_get_namespaced_pod_portforward, pod, ns, ports=str(port))
    try:
        sock = forward.socket(port)
        sock.setblocking(True)
        sock.settimeout(20)
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        sock.close()
        assert forward.error(port) is None, forward.error(port)
        return data
    finally:
        forward.close()


def test_kubelet_api_refuses_unauthenticated_and_unauthorized_clients(ctrd: LocalCluster,
                                                                      kapi: client.ApiClient) -> None:
    """As on a real cluster: no client certificate -> 401; a certificate of a user RBAC grants nothing -> 403
    (Webhook authorization); the API server's own kubelet client identity -> 200."""
    node: Any = client.CoreV1Api(kapi).read_node(TRN2)
    port = node.status.daemon_endpoints.kubelet_endpoint.port
    pki_dir = ctrd.dir / "controlplane" / "pki"
    ca = pki.CertPair(pki_dir / "ca.crt", pki_dir / "ca.key")
    nobody = pki.issue(ca, ctrd.dir / "test-pki", "nobody", common_name="nobody", client=True)
    kubelet_client = pki.CertPair(pki_dir / "apiserver-kubelet-client.crt", pki_dir / "apiserver-kubelet-client.key")

    def status(cert: pki.CertPair | None) -> int:
        ctx = ssl.create_default_context(cafile=str(ca.cert))  # kubelet serves a certificate of the cluster CA
        if cert is not None:
            ctx.load_cert_chain(str(cert.cert), str(cert.key))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
        try:
            with opener.open(f"https://127.0.0.1:{port}/pods", timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    assert status(None) == 401
    assert status(nobody) == 403
    assert status(kubelet_client) == 200


def test_default_grace_delete_of_a_term_handling_workload_is_quick(ctrd: LocalCluster, kapi: client.ApiClient,
                                                                   wns: str) -> None:
    core = client.CoreV1Api(kapi)
    core.create_namespaced_pod(wns, workload_pod("t", images(ctrd)["workload"], TRN1,  # type: ignore[arg-type]
                                                 template=None))
    wait_running(core, wns, "t")
    report_of(core, wns, "t")
    began = time.monotonic()
    core.delete_namespaced_pod("t", wns)  # the default grace period: 30 s
    eventually(lambda: not core.list_namespaced_pod(wns).items or None, 40, what="pod t gone")
    took = time.monotonic() - began
    assert took < 15, f"deletion took {took:.1f} s: the workload did not exit on TERM"


def test_a_container_whose_cdi_id_does_not_resolve_fails_to_start(ctrd: LocalCluster, kapi: client.ApiClient,
                                                                  wns: str) -> None:
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    res.create_namespaced_resource_claim_template(wns, claim_template(  # type: ignore[arg-type]
        "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
    core.create_namespaced_pod(wns, workload_pod("c", images(ctrd)["workload"], TRN1,  # type: ignore[arg-type]
                                                 init_sleep=8))
    cdi_dir = ctrd.node_paths(TRN1).base / "run" / "cdi"

    def prepared() -> list[Path] | None:
        pod = raw(core.read_namespaced_pod("c", wns, _preload_content=False))
        statuses = pod["status"].get("resourceClaimStatuses") or []
        if not statuses:
            return None
        claim = raw(res.read_namespaced_resource_claim(statuses[0]["resourceClaimName"], wns,
                                                       _preload_content=False))
        files = [f for f in cdi_dir.iterdir() if claim["metadata"]["uid"] in f.read_text()]
        return files or None

    for spec in eventually(prepared, 60, what="the claim's CDI spec"):
        spec.unlink()  # while the init container sleeps: the main container's CDI ids no longer resolve

    def waiting_reason() -> str | None:
        pod = raw(core.read_namespaced_pod("c", wns, _preload_content=False))
        for s in pod["status"].get("containerStatuses") or []:
            waiting = s.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerError":
                return str(waiting.get("message", ""))
        return None

    message = eventually(waiting_reason, 90, what="CreateContainerError of c/main")
    assert "CDI" in message or "cdi" in message, message


def test_driver_pod_deleted_is_recreated_and_registered_again_with_no_claim_lost(
        ctrd: LocalCluster, kapi: client.ApiClient, wns: str) -> None:
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    res.create_namespaced_resource_claim_template(wns, claim_template(  # type: ignore[arg-type]
        "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
    core.create_namespaced_pod(wns, workload_pod("k", images(ctrd)["workload"], TRN2))  # type: ignore[arg-type]
    before = wait_running(core, wns, "k")["status"]["containerStatuses"][0]["containerID"]
    old = driver_pods(core)[TRN2]
    core.delete_namespaced_pod(old["metadata"]["name"], DRIVER_NS)
    new = eventually(lambda: p if (p := driver_pods(core).get(TRN2)) and p["metadata"]["uid"] != old["metadata"][
        "uid"] and ready(p) else None, 120, what="a new driver pod Ready on the trn2 node")
    assert new["spec"]["containers"][0]["image"] == images(ctrd)["driver"]
    log = ctrd.node_paths(TRN2).kubelet.log
    eventually(lambda: log.read_text(errors="replace").count("Registered DRA plugin") >= 2 or None, 60,
               what="a second plugin registration")
    # kubelet restarted, then containerd restarted: the workload's container is never replaced.
    for pid_file in (ctrd.node_paths(TRN2).kubelet.pid_file, ctrd.node_paths(TRN2).pids / "containerd.pid"):
        assert procs.stop_pid_file(pid_file, grace_s=10)
        eventually(lambda f=pid_file: procs.running(f), 60, what=f"{pid_file.name} restarted")  # type: ignore[misc]
        time.sleep(3)
        status = wait_running(core, wns, "k")["status"]["containerStatuses"][0]
        assert status["containerID"] == before and status["restartCount"] == 0
    # Still prepared: deleting the pod unprepares through the new driver pod and frees the device.
    core.delete_namespaced_pod("k", wns, grace_period_seconds=1)
    eventually(lambda: not core.list_namespaced_pod(wns).items or None, 60, what="pod k gone")
    eventually(lambda: rolled_out(client.AppsV1Api(kapi), core), 120, what="the DaemonSet settled")


class Stream:
    """Claim pods created and deleted continuously on both nodes, `per_node` at a time, until `stop` is set and
    at least `total` have run. Each pod must reach Running within its deadline; what each took is kept."""

    def __init__(self, kapi: client.ApiClient, ns: str, image: str, total: int, per_node: int) -> None:
        self.core = client.CoreV1Api(kapi)
        self.ns, self.image, self.total, self.per_node = ns, image, total, per_node
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.started = 0
        self.running: list[tuple[float, float]] = []  # (when created, seconds to Running)
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._slot, args=(node,), daemon=True)
                        for node in (TRN2, TRN1) for _ in range(per_node)]

    def _next(self) -> int | None:
        with self.lock:
            if (self.stop.is_set() and self.started >= self.total) or self.failures:
                return None
            self.started += 1
            return self.started

    def _slot(self, node: str) -> None:
        while (i := self._next()) is not None:
            name = f"s{i}"
            try:
                created = time.monotonic()
                self.core.create_namespaced_pod(self.ns, workload_pod(name, self.image, node))  # type: ignore[arg-type]
                wait_running(self.core, self.ns, name, timeout=120)
                with self.lock:
                    self.running.append((created, time.monotonic() - created))
                self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=1)
                eventually(lambda n=name: not self.core.list_namespaced_pod(  # type: ignore[misc]
                    self.ns, field_selector=f"metadata.name={n}").items or None, 120, what=f"pod {name} gone")
            except Exception as e:  # the test fails on the first one, with its reason
                with self.lock:
                    self.failures.append(f"{name} on {node}: {type(e).__name__}: {str(e)[:400]}")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "the stream did not finish"


class SliceWatch:
    """Samples each node's ResourceSlices of the driver every 0.2 s: a node without any is a gap."""

    def __init__(self, kapi: client.ApiClient) -> None:
        self.res = client.ResourceV1Api(kapi)
        self.stop = threading.Event()
        self.samples = 0
        self.gaps: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            items = raw(self.res.list_resource_slice(field_selector=f"spec.driver={DRIVER}",
                                                     _preload_content=False))["items"]
            nodes = {s["spec"].get("nodeName") for s in items}
            self.samples += 1
            for node in (TRN2, TRN1):
                if node not in nodes:
                    self.gaps.append(f"{time.strftime('%H:%M:%S')}: no ResourceSlice of {node}")


def rolled_out(apps: client.AppsV1Api, core: client.CoreV1Api) -> bool:
    """The DaemonSet's update is complete: every node runs one updated, ready driver pod, and only that one."""
    ds = raw(apps.read_namespaced_daemon_set(DAEMONSET, DRIVER_NS, _preload_content=False))
    st = ds["status"]
    done = (st.get("observedGeneration") == ds["metadata"]["generation"] and st.get("updatedNumberScheduled") == 2
            and st.get("numberAvailable") == 2 and st.get("numberUnavailable", 0) == 0)
    pods = raw(core.list_namespaced_pod(DRIVER_NS, label_selector=DRIVER_SELECTOR, _preload_content=False))["items"]
    return done and len(pods) == 2 and all(ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)


def surge_registrations(cluster: LocalCluster, node: str) -> int:
    """kubelet's log lines of a registration while another instance of the driver was registered already."""
    log = cluster.node_paths(node).kubelet.log.read_text(errors="replace")
    return sum(1 for line in log.splitlines()
               if "Registered DRA plugin" in line and f'driverName="{DRIVER}"' in line and "numPlugins=2" in line)


def test_a_rollout_and_a_rollback_under_a_stream_of_claim_pods_lose_nothing(ctrd: LocalCluster,
                                                                             kapi: client.ApiClient,
                                                                             wns: str) -> None:
    """The issue's judgement (docs/upgrades.md): a stream of claim pods on both nodes across a rollout (a setting
    changed through DriverDeployOptions) and a rollback: every pod reaches Running, no
    FailedPrepareDynamicResources event, every node's slices present throughout, and kubelet registers the new
    instance beside the old one (two registrations at once) on each node, each time."""
    from neuron_dra.driver import deploy
    from neuron_dra.localcluster.supervisor import daemonset_options

    core, res, apps = client.CoreV1Api(kapi), client.ResourceV1Api(kapi), client.AppsV1Api(kapi)
    res.create_namespaced_resource_claim_template(wns, claim_template(  # type: ignore[arg-type]
        "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
    # Begin from a settled DaemonSet, every node's driver registered (an earlier test may have replaced a pod).
    eventually(lambda: rolled_out(apps, core), 120, what="the DaemonSet settled before the stream")
    original = raw(apps.read_namespaced_daemon_set(DAEMONSET, DRIVER_NS, _preload_content=False))
    assert original["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    changed = deploy.daemonset(daemonset_options(DRIVER, images(ctrd)["driver"]).replace(kube_api_qps=6.0))
    assert changed["spec"]["template"] != original["spec"]["template"]
    before = {node: surge_registrations(ctrd, node) for node in (TRN2, TRN1)}
    stream, slices = Stream(kapi, wns, images(ctrd)["workload"], total=200, per_node=5), SliceWatch(kapi)
    slices.thread.start()
    stream.start()
    phases: dict[str, float] = {}
    try:
        eventually(lambda: len(stream.running) >= 30 or stream.failures, 300, what="30 pods Running before the rollout")
        for phase, template in (("rollout", changed["spec"]["template"]), ("rollback", original["spec"]["template"])):
            began = time.monotonic()
            apps.patch_namespaced_daemon_set(DAEMONSET, DRIVER_NS, {"spec": {"template": template}})
            time.sleep(2)  # the controller's first step
            eventually(lambda: rolled_out(apps, core) or stream.failures, 240, 0.5, what=f"the {phase} complete")
            phases[phase] = time.monotonic() - began
            mark = len(stream.running)
            eventually(lambda m=mark: len(stream.running) >= m + 20 or stream.failures, 300,  # type: ignore[misc]
                       what=f"20 pods Running after the {phase}")
        stream.join(600)
    finally:
        stream.stop.set()
        slices.stop.set()
        slices.thread.join(10)
    assert not stream.failures, stream.failures[:5]
    assert stream.started >= 200 and len(stream.running) == stream.started
    failed = [f"{e['involvedObject']['name']}: {e.get('message', '')[:300]}"
              for e in raw(core.list_namespaced_event(wns, _preload_content=False))["items"]
              if e.get("reason") == "FailedPrepareDynamicResources"]
    assert not failed, failed[:5]
    assert slices.samples > 100 and not slices.gaps, slices.gaps[:5]
    for node in (TRN2, TRN1):  # the new instance registered beside the old one, in the rollout and the rollback
        assert surge_registrations(ctrd, node) - before[node] >= 2, node
    for node, pod in driver_pods(core).items():
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, f"the driver on {node} restarted"
    took = sorted(t for _, t in stream.running)
    print(f"\nrollout {phases['rollout']:.1f} s, rollback {phases['rollback']:.1f} s; {len(took)} claim pods, "
          f"create to Running p50 {took[len(took) // 2]:.2f} s, p99 {took[int(len(took) * 0.99)]:.2f} s")


def test_zz_cluster_down_leaves_the_host_as_it_was(ctrd: LocalCluster, kapi: client.ApiClient,
                                                   host_before: dict[str, Any]) -> None:
    nodes: Any = client.CoreV1Api(kapi).list_node().items
    kubelet_ports = [n.status.daemon_endpoints.kubelet_endpoint.port for n in nodes]
    assert all(host_listening(port) for port in kubelet_ports)  # the API server's forwarders to the kubelets
    ctrd.down()
    assert hoststate.differences(host_before, hoststate.snapshot()) == {}
    assert not any(host_listening(port) for port in kubelet_ports)
