"""The real Pulumi engine (CLI v3.274.1, Kubernetes provider 4.25.0, built by localcluster/build.py) runs the
project's own Pulumi.yaml and programs through the Automation API with inline programs.

- The engine accepts Pulumi.yaml's declarations with only `aws:region` (or only `kubeconfig`) set; a
  declaration without a default makes it refuse the stack, which mocks cannot see.
- The default stack program in existing-cluster mode on a containerd local cluster with the cluster's own images:
  `up` (every object in the apiserver as planned, the driver ready, registered and publishing, a pod of the
  stack's claim templates running and printing its device; the engine's plugin-version warnings exactly what the
  built provider and the SDK imply), a second `up` with no change, a setting change that `preview` shows as
  exactly the expected diff and `up` applies (the DaemonSet rolls), `destroy` leaving nothing.
- The same on a local control plane (no nodes) for a separate project that pip-installs this package into a
  virtualenv and composes the components.

Names differ from what `neuron-dra cluster up` installs: the provider would silently adopt same-named objects.
Every step runs in its own process (tests/support/engine_driver.py); step timings are printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.components.claims import module_templates
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.slices import device_name
from neuron_dra.localcluster.build import pulumi_kubernetes_version
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from neuron_dra.localcluster.nodes.nodens import HOST_TREE
from neuron_dra.localcluster.processes.podlogs import api_container_log, workload_report
from tests.components.test_components_import import (
    PACKAGE_PARTS,
    environment_without_this_checkout,
    with_packages_of_this_interpreter,
)
from tests.support.e2e import NEURON_TOLERATION, allocated_devices, eventually, pod_claim, raw
from tests.support.pulumi_engine import (
    DRIVER,
    Engine,
    expected_plugin_version_warnings,
    is_subset,
    plugin_version_warnings,
    read_object,
)

# gobuild: the first use builds the CLI and provider (minutes), cached after.
pytestmark = [pytest.mark.pulumi_engine, pytest.mark.gobuild, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STACK_PROGRAM = "neuron_dra.components.stack:run_program"
LOCAL_DRIVER = "local.neuron.aws.com"  # the containerd cluster's own driver: not the stack's neuron.aws.com


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = Engine.prepare(tmp_path_factory.mktemp("pulumi-engine"))
    yield eng
    print(f"\nengine step timings (s): {json.dumps(eng.timings)}")


def project_dir(tmp_path: Path, pulumi_yaml: str | None = None) -> Path:
    work = tmp_path / "project"
    work.mkdir(parents=True)
    (work / "Pulumi.yaml").write_text(pulumi_yaml if pulumi_yaml is not None else (ROOT / "Pulumi.yaml").read_text())
    return work


def test_the_engine_accepts_pulumi_yaml_with_only_the_minimal_config(engine: Engine, tmp_path: Path) -> None:
    work = project_dir(tmp_path)
    report = "tests.support.engine_programs:settings_report"
    new = engine.step("up", work_dir=work, stack="aws-only", program=report, config={"aws:region": "us-east-2"})
    assert new["outputs"]["existingCluster"] is False
    assert new["outputs"]["kubernetesVersion"] == "1.36"
    assert new["outputs"]["nodeGroups"] == ["trn2"]
    # The engine passed Pulumi.yaml's defaults ("" and [] for optional settings): they decode to the defaults.
    assert new["outputs"]["settings"] == repr(decode_settings({}))

    kubeconfig = str(tmp_path / "kubeconfig")
    image = "registry.example.com/neuron-dra-driver@sha256:" + "0" * 64  # an existing cluster needs one
    existing = engine.step("up", work_dir=work, stack="kubeconfig-only", program=report,
                           config={"neuron-dra:kubeconfig": kubeconfig, "neuron-dra:driverImage": image})
    assert existing["outputs"]["existingCluster"] is True
    assert existing["outputs"]["settings"] == repr(decode_settings({"kubeconfig": kubeconfig, "driverImage": image}))

    # The control: one declaration without a default, and the engine refuses the same minimal stack.
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    del doc["config"]["clusterName"]["default"]
    strict = project_dir(tmp_path / "strict", yaml.safe_dump(doc))
    refused = engine.step("up", work_dir=strict, stack="aws-only", program=report,
                          config={"aws:region": "us-east-2"}, check=False)
    assert "is missing configuration value 'clusterName'" in refused["error"]


def planned_driver(options: DriverDeployOptions) -> list[dict[str, Any]]:
    return deploy.manifests(options)


def assert_live_as_planned(api: Any, planned: list[dict[str, Any]]) -> None:
    for manifest in planned:
        live = read_object(api, manifest)
        assert live is not None, f"{deploy.object_key(manifest)} is not in the apiserver"
        differences = is_subset({k: v for k, v in manifest.items() if k != "status"}, live)
        assert not differences, (deploy.object_key(manifest), differences)


def assert_all_gone(api: Any, planned: list[dict[str, Any]]) -> None:
    def gone(manifest: dict[str, Any]) -> bool:
        return read_object(api, manifest) is None

    for manifest in planned:
        # A namespace is gone once its finalizers ran (the controller-manager empties it first).
        eventually(lambda: gone(manifest), 120, what=f"{deploy.object_key(manifest)} gone")  # noqa: B023


def changed_kinds(before: DriverDeployOptions, after: DriverDeployOptions) -> tuple[list[str], list[str]]:
    """The kinds of the driver's objects whose manifests differ between two option sets (what an update must
    touch), and of those only `after` has (what it creates: a metrics port adds its Service, docs/metrics.md)."""
    old = {deploy.object_key(m): m for m in deploy.manifests(before)}
    new = {deploy.object_key(m): m for m in deploy.manifests(after)}
    assert old.keys() <= new.keys()
    return (sorted(new[k]["kind"] for k in old if old[k] != new[k]),
            sorted(new[k]["kind"] for k in new.keys() - old.keys()))


# The steps of the default stack's StackReference to itself (driver.own_previous_outputs): a read each run, a
# discard at destroy; the counts below are of the resources the stack manages.
READ_OPS = ("read", "read-replacement", "read-discard", "discard", "discard-replaced")


def managed(result: dict[str, Any]) -> dict[str, int]:
    """A step's change counts without the reads."""
    return {op: n for op, n in result["changes"].items() if op not in READ_OPS}


def kubernetes_events(result: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [e for e in result["events"] if e["op"] == op and e["type"].startswith("kubernetes:")]


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A containerd local cluster with one trn2.48xlarge node. Its own driver gets another name (and so other
    objects), so that the stack installs the default driver `neuron.aws.com` itself, which the default claim
    templates' DeviceClass names."""
    from neuron_dra.localcluster.cluster import up

    cluster = up(tmp_path_factory.mktemp("engine-ctrd"), ["trn2.48xlarge:1"], ttl=3600, timeout=1800,
                 runtime="containerd", driver_name=LOCAL_DRIVER)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def capi(ctrd: LocalCluster) -> Iterator[Any]:
    from kubernetes import config

    api = config.new_client_from_config(str(ctrd.kubeconfig))
    yield api
    api.close()


def cluster_images(cluster: LocalCluster) -> dict[str, str]:
    refs: dict[str, str] = json.loads((cluster.dir / "images.json").read_text())
    return refs


def assert_driver_ready_and_publishing(api: Any, cluster: LocalCluster, options: DriverDeployOptions) -> None:
    """The stack's DaemonSet has its one pod ready, which kubelet registered and which publishes the node's
    devices."""
    from kubernetes import client

    node = cluster.nodes[0].name
    ds = raw(client.AppsV1Api(api).read_namespaced_daemon_set(options.daemonset_name, options.namespace,
                                                               _preload_content=False))
    status = ds["status"]
    assert status["desiredNumberScheduled"] == status["numberReady"] == status["updatedNumberScheduled"] == 1, status
    assert status["observedGeneration"] == ds["metadata"]["generation"], status
    log = cluster.node_paths(node).kubelet.log.read_text(errors="replace")
    assert "Registered DRA plugin" in log and f'driverName="{options.driver_name}"' in log

    def devices() -> list[str] | None:
        found = [d["name"] for s in raw(client.ResourceV1Api(api).list_resource_slice(_preload_content=False))[
            "items"] if s["spec"]["driver"] == options.driver_name and s["spec"].get("nodeName") == node
                 for d in s["spec"].get("devices", [])]
        return found or None

    published = eventually(devices, 60, what=f"ResourceSlices of {options.driver_name} on {node}")
    assert {device_name(i) for i in range(16)} <= set(published), published


def claim_pod(image: str, node: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "engine-claim"}, "spec": {
        "tolerations": [NEURON_TOLERATION], "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 2,
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                        "resources": {"claims": [{"name": "neuron"}]}}]}}


def assert_claim_pod_runs_with_its_device(api: Any, cluster: LocalCluster, template: dict[str, Any],
                                          driver: str) -> None:
    """A pod of `template` (one device) runs on the node and its log (read as `kubectl logs` does) names the
    device the claim was allocated; the pod is then deleted and gone."""
    from kubernetes import client

    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    ns = template["metadata"]["namespace"]
    pod = claim_pod(cluster_images(cluster)["workload"], cluster.nodes[0].name, template["metadata"]["name"])
    core.create_namespaced_pod(ns, pod)  # type: ignore[arg-type]
    try:
        def report() -> dict[str, str] | None:
            phase = raw(core.read_namespaced_pod("engine-claim", ns, _preload_content=False))["status"].get("phase")
            if phase != "Running":
                return None
            got = workload_report(api_container_log(core, ns, "engine-claim", "main"))
            return got if got.get("ready") == "yes" else None

        seen = eventually(report, 180, what=f"{ns}/engine-claim running and reporting its devices")
        (device,) = allocated_devices(pod_claim(core, res, ns, "engine-claim"), driver)
        assert seen["devices"] == f"neuron{int(device.rsplit('-', 1)[-1])}", (seen, device)
    finally:
        core.delete_namespaced_pod("engine-claim", ns, body=client.V1DeleteOptions(grace_period_seconds=0))
        eventually(lambda: not [p for p in core.list_namespaced_pod(ns).items
                                if p.metadata is not None and p.metadata.name == "engine-claim"],
                   90, what=f"{ns}/engine-claim gone")


@pytest.mark.cluster
@pytest.mark.containerd
def test_the_stack_program_on_real_containers_up_again_change_and_destroy(ctrd: LocalCluster, capi: Any,
                                                                          engine: Engine, tmp_path: Path) -> None:
    """The default stack in existing-cluster mode on a containerd local cluster, with the cluster's own driver
    image: every resource ready, the driver registered and publishing, a claim pod of the stack's templates
    running; a no-op up, a previewed and applied change, destroy leaving nothing."""
    work = project_dir(tmp_path)
    image = cluster_images(ctrd)["driver"]
    config = {
        "neuron-dra:kubeconfig": str(ctrd.kubeconfig),
        "neuron-dra:driverImage": image,
        # The local nodes keep their emulated Neuron host tree there, not at /sys, /dev and /opt/aws/neuron.
        "neuron-dra:driverHostPathsRoot": HOST_TREE,
        # The local cluster publishes EFA devices and their DeviceClass itself (its emulated EFA driver).
        "neuron-dra:efaDriver": "external",
        "neuron-dra:driverRolloutTimeoutSeconds": "300",
        # AWS's neuron-monitor image cannot be pulled here, and its rollout is awaited: off (its objects meet the
        # API server in test_components_apiserver.py, its claim the scheduler and kubelet in
        # tests/localcluster/test_utilisation_local.py).
        "neuron-dra:neuronMonitor": "false",
    }
    settings = decode_settings(config)
    options = settings.driver_options().replace(image=image)
    assert options.driver_name == "neuron.aws.com" != LOCAL_DRIVER
    templates = [dict(t.to_manifest()) for t in module_templates(settings.claim_templates_module)]
    planned = planned_driver(options) + templates
    step: dict[str, Any] = {"work_dir": work, "stack": "containerd", "program": STACK_PROGRAM}
    expected_warnings = expected_plugin_version_warnings(pulumi_kubernetes_version())

    up = engine.step("up", config=config, **step)
    created = kubernetes_events(up, "create")
    assert sorted(e["type"].split(":")[-1] for e in created if e["type"] != "pulumi:providers:kubernetes") == \
        sorted(m["kind"] for m in planned)
    assert plugin_version_warnings(up["warnings"]) == expected_warnings, up["warnings"]
    assert up["outputs"]["driverImage"] == image
    assert_live_as_planned(capi, planned)
    assert_driver_ready_and_publishing(capi, ctrd, options)
    one_device = next(t for t in templates if t["metadata"]["name"] == "one-neuron-device")
    assert_claim_pod_runs_with_its_device(capi, ctrd, one_device, options.driver_name)
    total = sum(managed(up).values())

    again = engine.step("up", config=config, **step)
    assert managed(again) == {"same": total}

    changed = {**config, "neuron-dra:driverMetricsPort": "9400"}
    preview = engine.step("preview", config=changed, **step)
    # Exactly what deploy renders differently: the DaemonSet (its args and port) and the NetworkPolicy (the port);
    # new: the metrics Service and the dashboard ConfigMap (grafanaDashboard is on with a metrics port).
    metrics_options = decode_settings(changed).driver_options().replace(image=image)
    expected, new_kinds = changed_kinds(options, metrics_options)
    assert expected == ["DaemonSet", "NetworkPolicy"] and new_kinds == ["ConfigMap", "Service"]
    assert managed(preview) == {"same": total - len(expected), "update": len(expected), "create": len(new_kinds)}
    updates = [e for e in preview["events"] if e["op"] == "update"]
    assert sorted(e["type"].rsplit(":", 1)[1] for e in updates) == expected
    # Only spec fields change (detailed diff paths such as spec.template.spec.containers[0].args[3]).
    assert all(e["detailed"] and all(k.startswith("spec") for k in e["detailed"]) for e in updates), updates
    daemonset = next(m for m in planned if m["kind"] == "DaemonSet")
    live = read_object(capi, daemonset)
    assert live is not None and not is_subset(daemonset, live)  # preview changed nothing
    # Applied, the DaemonSet rolls its pod on the node (surge: the new one beside the old one until Ready).
    applied = engine.step("up", config=changed, **step)
    assert managed(applied) == {"same": total - len(expected), "update": len(expected), "create": len(new_kinds)}
    assert_live_as_planned(capi, planned_driver(metrics_options) + templates)
    assert_driver_ready_and_publishing(capi, ctrd, metrics_options)

    destroyed = engine.step("destroy", config=changed, **step)
    assert managed(destroyed) == {"delete": total + len(new_kinds)}  # the stack resource included
    assert_all_gone(capi, planned_driver(metrics_options) + templates)
    assert_no_driver_pods(capi, options)


def assert_no_driver_pods(api: Any, options: DriverDeployOptions) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    selector = ",".join(f"{k}={v}" for k, v in deploy.daemonset(options)["spec"]["selector"]["matchLabels"].items())
    # Only the stack's namespace: the local cluster's own driver pods carry the same labels.
    eventually(lambda: not core.list_namespaced_pod(options.namespace, label_selector=selector).items or None, 120,
               what=f"the pods of {options.daemonset_name} gone")


TEAM_PROGRAM = '''
"""Another team's program: composes neuron-dra's components with its own provider and namespace."""
import pulumi
import pulumi_kubernetes as k8s

import neuron_dra
from neuron_dra.claim_templates import ClaimTemplate, Connected, Neuron
from neuron_dra.components import ClaimTemplates, ClaimTemplatesArgs, NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.driver.deploy import DriverDeployOptions


def program() -> None:
    config = pulumi.Config()
    provider = k8s.Provider("team-cluster", kubeconfig=config.require("kubeconfig"))
    on_cluster = pulumi.ResourceOptions(provider=provider)
    namespace = k8s.core.v1.Namespace("team-ml", metadata={"name": "team-ml"}, opts=on_cluster)
    driver = NeuronDraDriver("dra", NeuronDraDriverArgs(
        options=DriverDeployOptions(namespace="team-dra", driver_name="team.neuron.aws.com",
                                    core_device_class_name="team.neuroncore.aws.com",
                                    metrics_port=config.get_int("metricsPort") or 0),
        image="registry.invalid/team/neuron-dra-driver:1",
        rollout_timeout_seconds=0,  # no node may run it here: do not wait for the rollout
    ), opts=on_cluster)
    ClaimTemplates("claims", ClaimTemplatesArgs(
        templates=[ClaimTemplate("rows", Neuron(4, topology=Connected()), namespace="team-ml")],
        instance_types=["trn2.48xlarge"], depends_on=[namespace]), opts=on_cluster)
    pulumi.export("package", neuron_dra.__file__)
    pulumi.export("image", driver.image)
'''

@pytest.mark.cluster
@pytest.mark.process
def test_a_separate_project_with_the_pip_installed_package(engine: Engine, plane: ControlPlane, api: Any,
                                                           tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    source.mkdir()
    for part in PACKAGE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, source / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, source / part)
    venv = tmp_path / "venv"
    python = str(with_packages_of_this_interpreter(venv))
    env = environment_without_this_checkout()  # the program imports the venv's copy
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    str(source)], check=True, cwd=tmp_path, env=env)

    work = tmp_path / "team-infra"
    work.mkdir()
    (work / "Pulumi.yaml").write_text("name: team-infra\nruntime:\n  name: python\n")
    (work / "team_program.py").write_text(textwrap.dedent(TEAM_PROGRAM))
    shutil.copy2(DRIVER, work / "engine_driver.py")
    step: dict[str, Any] = {"work_dir": work, "stack": "dev", "program": "team_program:program", "python": python,
            "driver": work / "engine_driver.py", "env": env, "sys_path": [str(work)]}
    config = {"team-infra:kubeconfig": str(plane.kubeconfig)}

    options = DriverDeployOptions(namespace="team-dra", driver_name="team.neuron.aws.com",
                                  core_device_class_name="team.neuroncore.aws.com",
                                  image="registry.invalid/team/neuron-dra-driver:1")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "rows", "namespace": "team-ml"}}
    planned = [*planned_driver(options), template]

    up = engine.step("up", config=config, **step)
    package = Path(up["outputs"]["package"])
    assert package.is_relative_to(venv) and not package.is_relative_to(ROOT)
    assert up["outputs"]["image"] == options.image
    assert_live_as_planned(api, planned)
    ds = read_object(api, next(m for m in planned if m["kind"] == "DaemonSet"))
    assert ds is not None and ds["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    total = sum(up["changes"].values())

    assert engine.step("up", config=config, **step)["changes"] == {"same": total}

    changed = {**config, "team-infra:metricsPort": "9400"}
    preview = engine.step("preview", config=changed, **step)
    expected, new_kinds = changed_kinds(options, options.replace(metrics_port=9400))
    assert new_kinds == ["Service"]  # the metrics port's
    assert preview["changes"] == {"same": total - len(expected), "update": len(expected), "create": len(new_kinds)}
    updates = [e for e in preview["events"] if e["op"] == "update"]
    assert sorted(e["type"].rsplit(":", 1)[1] for e in updates) == expected
    # Only spec fields change (detailed diff paths such as spec.template.spec.containers[0].args[3]).
    assert all(e["detailed"] and all(k.startswith("spec") for k in e["detailed"]) for e in updates), updates
    assert engine.step("up", config=changed, **step)["changes"] == {"same": total - len(expected),
                                                                   "update": len(expected),
                                                                   "create": len(new_kinds)}
    assert_live_as_planned(api, planned_driver(options.replace(metrics_port=9400)))

    assert engine.step("destroy", config=changed, **step)["changes"] == {"delete": total + len(new_kinds)}
    assert_all_gone(api, [*planned, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-ml"}}])
