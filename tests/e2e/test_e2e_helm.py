"""The driver's Helm chart on a containerd local cluster (issue 44's judged case; docs/helm.md).

`cluster up --runtime containerd --no-driver` (two emulated Neuron nodes, real kubelet, containerd and runc, the
driver's image imported but nothing of the driver installed), then the real Helm (built from the Go module proxy,
tests/support/helm.py) installs the chart `neuron-dra chart` generates, upgrades it to a changed value and
uninstalls it. Registration is watched the whole time, event by event: a watch of the driver's ResourceSlices (the
API server's events) and kubelet's own log of every plugin registration and deregistration."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, dynamic, watch
from kubernetes.dynamic.exceptions import NotFoundError

from neuron_dra.driver.deploy import Manifest, manifests, object_key, ultraserver
from neuron_dra.driver.deploy.chart import default_values, options_from_values, write_chart
from neuron_dra.localcluster.build import DEFAULT_MINOR
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.supervisor import LOCAL_CORE_PARTITIONS, daemonset_options
from tests.support.e2e import NEURON_TOLERATION, claim_template, create_namespace, eventually, raw

pytestmark = [pytest.mark.cluster, pytest.mark.containerd, pytest.mark.gobuild, pytest.mark.slow,
              pytest.mark.process]

DRIVER = "neuron.aws.com"
NODES = ("trn2.48xlarge:1", "trn1.32xlarge:1")
TRN2, TRN1 = "trn2-48xlarge-1", "trn1-32xlarge-1"
RELEASE = "neuron-dra"
# The chart for the cluster's minor and the local nodes' NeuronCore mode: what `cluster up` installs itself.
GENERATION = {"kubernetes_version": DEFAULT_MINOR, "core_partitions": LOCAL_CORE_PARTITIONS}


@pytest.fixture(scope="module")
def helm() -> Path:
    from tests.support.helm import build_helm

    return build_helm()


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Containerd nodes without the driver: the chart installs it."""
    from neuron_dra.localcluster.cluster import up

    cluster = up(tmp_path_factory.mktemp("helm-ctrd"), list(NODES), ttl=3600, timeout=1800, runtime="containerd",
                 kubernetes_version=DEFAULT_MINOR, driver=False)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def kapi(bare: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(bare.kubeconfig))
    yield api
    api.close()


class SliceWatch:
    """Every event of the driver's ResourceSlices from a watch (no sampling): each node's slices as the API server
    changes them, and the moments a node that had slices was left with none."""

    def __init__(self, kapi: client.ApiClient) -> None:
        self.res = client.ResourceV1Api(kapi)
        self.slices: dict[str, set[str]] = {}
        self.gaps: list[str] = []
        self.events = 0
        self.errors: list[str] = []
        self.changed = threading.Condition()
        self.watch = watch.Watch()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        listed = raw(self.res.list_resource_slice(field_selector=f"spec.driver={DRIVER}", _preload_content=False))
        for s in listed["items"]:
            self.slices.setdefault(s["spec"]["nodeName"], set()).add(s["metadata"]["name"])
        version = listed["metadata"]["resourceVersion"]
        try:
            while not self.stopped.is_set():  # a stream the API server ends (its timeout) resumes where it was
                for event in self.watch.stream(self.res.list_resource_slice, field_selector=f"spec.driver={DRIVER}",
                                               resource_version=version, timeout_seconds=60):
                    obj = event["raw_object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(str(obj)[:300])
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    node, name = obj["spec"]["nodeName"], obj["metadata"]["name"]
                    with self.changed:
                        have = self.slices.setdefault(node, set())
                        if event["type"] == "DELETED":
                            have.discard(name)
                            if not have:
                                self.gaps.append(f"{node}: its last slice {name} deleted")
                        else:
                            have.add(name)
                        self.events += 1
                        self.changed.notify_all()
        except Exception as e:  # the test asserts there is none
            with self.changed:
                self.errors.append(f"{type(e).__name__}: {e}")
                self.changed.notify_all()

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self.slices) or self.errors, timeout):
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {self.slices}")
        assert not self.errors, self.errors

    def stop(self) -> None:
        self.stopped.set()
        self.watch.stop()
        self.thread.join(30)


REGISTRATION = re.compile(r'"(Registered|Unregistered) DRA plugin".*driverName="([^"]+)"')
NUM_PLUGINS = re.compile(r"numPlugins=(\d+)")


def registrations(cluster: LocalCluster, node: str) -> list[int]:
    """kubelet's count of registered instances of the driver after each of its registrations and
    deregistrations, from its log (docs/upgrades.md: `Registered DRA plugin ... numPlugins=2`)."""
    counts: list[int] = []
    for line in cluster.node_paths(node).kubelet.log.read_text(errors="replace").splitlines():
        m = REGISTRATION.search(line)
        if not m or m.group(2) != DRIVER:
            continue
        n = NUM_PLUGINS.search(line)
        last = counts[-1] if counts else 0
        counts.append(int(n.group(1)) if n else last + (1 if m.group(1) == "Registered" else -1))
    return counts


def run_helm(helm: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *map(str, args)], capture_output=True, text=True, check=False, timeout=600)


def live(kapi: client.ApiClient, obj: Manifest) -> Manifest | None:
    resource = dynamic.DynamicClient(kapi).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    meta = obj["metadata"]
    try:
        got: Manifest = resource.get(name=meta["name"], namespace=meta.get("namespace")).to_dict()
    except NotFoundError:
        return None
    return got


def driver_pods(core: client.CoreV1Api, namespace: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/name=neuron-dra-driver,app.kubernetes.io/component=kubelet-plugin"
    return list(raw(core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))["items"])


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def every_node_runs(core: client.CoreV1Api, namespace: str, args: list[str]) -> bool:
    """One driver pod a node, Ready, running `args`, and no other (the old ones gone)."""
    pods = driver_pods(core, namespace)
    return (sorted(p["spec"].get("nodeName") or "" for p in pods) == sorted((TRN1, TRN2))
            and all(ready(p) and not p["metadata"].get("deletionTimestamp")
                    and p["spec"]["containers"][0]["args"] == args for p in pods))


def claim_pod(name: str, image: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": "one-device"}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "resources": {"claims": [{"name": "neuron"}]}}]}}


def running(core: client.CoreV1Api, ns: str, pod: str) -> dict[str, Any] | None:
    p = raw(core.read_namespaced_pod(pod, ns, _preload_content=False))
    return p if p["status"].get("phase") == "Running" else None


def controller_holds_its_lease(kapi: client.ApiClient, namespace: str) -> bool:
    """The UltraServer controller's Deployment is Available and its Lease is held by one of its Running pods."""
    apps, core = client.AppsV1Api(kapi), client.CoreV1Api(kapi)
    deployment = raw(apps.read_namespaced_deployment(ultraserver.DEFAULT_NAME, namespace, _preload_content=False))
    if not any(c["type"] == "Available" and c["status"] == "True"
               for c in deployment.get("status", {}).get("conditions", [])):
        return False
    selector = ",".join(f"{k}={v}" for k, v in ultraserver.POD_LABELS.items())
    pods = raw(core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))["items"]
    running_pods = {p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"}
    try:
        lease = raw(client.CoordinationV1Api(kapi).read_namespaced_lease(ultraserver.DEFAULT_NAME, namespace,
                                                                         _preload_content=False))
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return lease.get("spec", {}).get("holderIdentity") in running_pods


def test_helm_install_upgrade_uninstall_keeps_the_driver_registered(bare: LocalCluster, kapi: client.ApiClient,
                                                                   helm: Path, tmp_path: Path) -> None:
    """Install registers the driver on both nodes and a claim pod runs; an upgrade to a changed value rolls the
    DaemonSet with the surge hand-over (kubelet registers the new instance beside the old one, never has none
    after the first, and no node's slices are ever all gone), the claim pod keeps running and a new one runs; the
    same upgrade turns the UltraServer group controller on (ultraserverGroups), whose pod runs and takes its
    Lease; uninstall leaves none of the chart's objects (cluster-scoped ones included) and withdraws the slices."""
    core, res = client.CoreV1Api(kapi), client.ResourceV1Api(kapi)
    images = json.loads((bare.dir / "images.json").read_text())
    chart = write_chart(tmp_path / "chart", GENERATION)
    # The values that give the DaemonSet `cluster up` would have installed: its image and the emulated host tree.
    options = daemonset_options(DRIVER, images["driver"], kubernetes_version=DEFAULT_MINOR)
    # neuronMonitor off, as `cluster up`: AWS's monitor image cannot run on an emulated node (docs/utilisation.md).
    values = {"image": options.image, "hostPathsRoot": options.host_paths_root,
              "neuronMonitor": options.neuron_monitor}
    assert options_from_values({**default_values(), **values}, GENERATION) == options
    installed = manifests(options)
    assert [object_key(o) for o in installed if live(kapi, o) is not None] == []  # nothing of the driver yet
    kube = ("--kubeconfig", bare.kubeconfig, "--namespace", "default")

    slices = SliceWatch(kapi)
    slices.thread.start()
    try:
        values_file = tmp_path / "values.json"
        values_file.write_text(json.dumps(values))
        proc = run_helm(helm, "install", RELEASE, chart, *kube, "--values", values_file)
        assert proc.returncode == 0, proc.stderr
        for obj in installed:  # every object as the chart rendered it, owned by the release
            got = live(kapi, obj)
            assert got is not None, object_key(obj)
            assert got["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE, object_key(obj)
        daemonset = next(o for o in installed if o["kind"] == "DaemonSet")
        args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
        eventually(lambda: every_node_runs(core, options.namespace, args), 300, 0.5, what="the driver Ready")
        slices.wait(lambda s: all(s.get(n) for n in (TRN1, TRN2)), 120, "both nodes' slices")
        assert [registrations(bare, n)[:1] for n in (TRN1, TRN2)] == [[1], [1]]

        ns = "helm-claims"
        create_namespace(core, ns)
        res.create_namespaced_resource_claim_template(ns, claim_template(  # type: ignore[arg-type]
            "one-device", [{"name": "neuron", "exactly": {"deviceClassName": DRIVER}}]))
        core.create_namespaced_pod(ns, claim_pod("before", images["workload"], TRN2))  # type: ignore[arg-type]
        before = eventually(lambda: running(core, ns, "before"), 180, what="the claim pod Running")

        # The upgrade: a changed value that changes the driver's pod template (a rollout on every node), and the
        # UltraServer group controller turned on (its objects appear beside the driver's).
        values_file.write_text(json.dumps({**values, "kubeApiQps": 6, "ultraserverGroups": True}))
        proc = run_helm(helm, "upgrade", RELEASE, chart, *kube, "--values", values_file)
        assert proc.returncode == 0, proc.stderr
        upgraded_options = options.replace(kube_api_qps=6.0, ultraserver_groups=True)
        upgraded = manifests(upgraded_options)
        controller = ultraserver.manifests(ultraserver.spec_for(upgraded_options))
        for obj in controller:
            got = live(kapi, obj)
            assert got is not None, object_key(obj)
            assert got["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE, object_key(obj)
        assert [o["metadata"]["name"] for o in controller if o["kind"] == "DeviceClass"] == [f"ultraserver.{DRIVER}"]
        # Its pod (the driver's image, on the pod network: the in-cluster API address) runs and takes its Lease.
        eventually(lambda: controller_holds_its_lease(kapi, options.namespace), 300, 0.5,
                   what="the UltraServer controller's Deployment available, its pod holding the Lease")
        new_args = next(o for o in upgraded if o["kind"] == "DaemonSet")["spec"]["template"]["spec"][
            "containers"][0]["args"]
        assert new_args != args and "--kube-api-qps" in new_args
        eventually(lambda: every_node_runs(core, options.namespace, new_args), 300, 0.5,
                   what="the upgraded driver Ready on both nodes, the old pods gone")
        core.create_namespaced_pod(ns, claim_pod("after", images["workload"], TRN1))  # type: ignore[arg-type]
        eventually(lambda: running(core, ns, "after"), 180, what="a new claim pod Running after the upgrade")
        still = running(core, ns, "before")
        assert still is not None and still["metadata"]["uid"] == before["metadata"]["uid"]
        assert still["status"]["containerStatuses"][0]["restartCount"] == 0
        for node in (TRN1, TRN2):
            counts = registrations(bare, node)
            # Registered, the new instance beside the old (2), the old one gone (1): never none in between.
            assert 2 in counts and counts[-1] == 1 and min(counts) >= 1, (node, counts)
        assert slices.gaps == [], slices.gaps
        assert not slices.errors, slices.errors

        # Uninstall: the claim pods go first (their claims are unprepared by the driver that prepared them).
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        eventually(lambda: not core.list_namespaced_pod(ns).items, 120, what="the claim pods gone")
        eventually(lambda: not res.list_namespaced_resource_claim(ns).items, 60, what="their claims gone")
        proc = run_helm(helm, "uninstall", RELEASE, *kube, "--wait", "--timeout", "5m")
        assert proc.returncode == 0, proc.stderr
        assert [object_key(o) for o in upgraded if live(kapi, o) is not None] == []
        assert {o["kind"] for o in upgraded} >= {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                                                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                                 "Deployment", "Role", "RoleBinding"}
        slices.wait(lambda s: not any(s.values()), 120, "the slices withdrawn")
        assert res.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items == []
        for node in (TRN1, TRN2):
            assert registrations(bare, node)[-1] == 0, node
        assert run_helm(helm, "list", "--all", *kube, "-q").stdout.split() == []
        core.delete_namespace(ns)
    finally:
        slices.stop()
