"""Day two under the real Pulumi engine (CLI and Kubernetes provider built here) on a containerd local cluster, the
default stack in existing-cluster mode (docs/upgrades.md "Day two"):

- a claim template's spec change (Neuron(1) -> Neuron(2)) is previewed as a replace and applied by an `up` that
  succeeds: the live template changes, the pod already running keeps its claim, a new pod gets two devices;
- a driver rename is refused at preview and at `up` with the message naming `driverName`, and nothing of the
  renamed driver is created.

The cluster's own driver has another name (local.neuron.aws.com), so the stack's objects are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.nodes.nodens import HOST_TREE
from tests.components.test_components_engine import (  # noqa: F401  (fixtures)
    STACK_PROGRAM,
    assert_all_gone,
    capi,
    claim_pod,
    cluster_images,
    ctrd,
    engine,
    managed,
    planned_driver,
    project_dir,
)
from tests.support.e2e import allocated_devices, eventually, pod_claim, raw
from tests.support.pulumi_engine import REPO_ROOT, Engine, read_object

pytestmark = [pytest.mark.pulumi_engine, pytest.mark.gobuild, pytest.mark.slow]

TEMPLATES = """
from neuron_dra.claim_templates import ClaimTemplate, Neuron

day_two = ClaimTemplate("day-two", Neuron({count}), namespace="default")
"""


def run_pod(api: Any, cluster: LocalCluster, name: str) -> dict[str, Any]:
    """A pod of the `day-two` template on the node, Running; its generated claim."""
    from kubernetes import client

    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    pod = claim_pod(cluster_images(cluster)["workload"], cluster.nodes[0].name, "day-two")
    pod["metadata"]["name"] = name
    core.create_namespaced_pod("default", pod)  # type: ignore[arg-type]
    eventually(lambda: raw(core.read_namespaced_pod(name, "default", _preload_content=False))["status"].get(
        "phase") == "Running", 180, what=f"default/{name} Running")
    return pod_claim(core, res, "default", name)


@pytest.mark.cluster
@pytest.mark.containerd
def test_a_claim_template_change_replaces_it_and_a_driver_rename_is_refused(
        ctrd: LocalCluster, capi: Any, engine: Engine, tmp_path: Path) -> None:  # noqa: F811
    from kubernetes import client

    work = project_dir(tmp_path)
    modules = tmp_path / "modules"
    modules.mkdir()
    for count in (1, 2):
        (modules / f"day_two_templates_{count}.py").write_text(TEMPLATES.format(count=count))
    image = cluster_images(ctrd)["driver"]
    config = {
        "neuron-dra:kubeconfig": str(ctrd.kubeconfig),
        "neuron-dra:driverImage": image,
        "neuron-dra:driverHostPathsRoot": HOST_TREE,
        "neuron-dra:efaDriver": "external",
        "neuron-dra:neuronMonitor": "false",  # AWS's monitor image cannot run on an emulated node
        "neuron-dra:driverRolloutTimeoutSeconds": "300",
        "neuron-dra:claimTemplatesModule": "day_two_templates_1",
    }
    options = decode_settings(config).driver_options().replace(image=image)
    step: dict[str, Any] = {"work_dir": work, "stack": "day-two", "program": STACK_PROGRAM,
                            "sys_path": [str(REPO_ROOT), str(modules)]}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "day-two", "namespace": "default"}}
    core = client.CoreV1Api(capi)

    up = engine.step("up", config=config, **step)
    assert up["outputs"]["driverName"] == options.driver_name
    total = sum(managed(up).values())
    live = read_object(capi, template)
    assert live is not None and live["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    first = run_pod(capi, ctrd, "day-two-first")
    assert len(allocated_devices(first, options.driver_name)) == 1

    try:
        changed = {**config, "neuron-dra:claimTemplatesModule": "day_two_templates_2"}
        preview = engine.step("preview", config=changed, **step)
        assert managed(preview) == {"same": total - 1, "replace": 1}, preview["changes"]
        replaced = [e for e in preview["events"] if e["op"] == "replace"]
        assert [e["type"] for e in replaced] == ["kubernetes:resource.k8s.io/v1:ResourceClaimTemplate"]
        # The engine's replace event may name no diff keys; any detailed path it names is in the spec.
        assert replaced[0]["diffs"] in ([], ["spec"]) and all(k.startswith("spec") for k in replaced[0]["detailed"])

        applied = engine.step("up", config=changed, **step)
        assert managed(applied) == {"same": total - 1, "replace": 1}, applied["changes"]
        live = read_object(capi, template)
        assert live is not None and live["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
        # The running pod keeps its claim (same object, same allocation); a new pod gets the new template.
        still = pod_claim(core, client.ResourceV1Api(capi), "default", "day-two-first")
        assert still["metadata"]["uid"] == first["metadata"]["uid"]
        assert still["status"]["allocation"] == first["status"]["allocation"]
        assert raw(core.read_namespaced_pod("day-two-first", "default", _preload_content=False))["status"][
            "phase"] == "Running"
        second = run_pod(capi, ctrd, "day-two-second")
        assert len(allocated_devices(second, options.driver_name)) == 2

        renamed = {**changed, "neuron-dra:driverName": "renamed.neuron.aws.com"}
        for refused_step in ("preview", "up"):
            refused = engine.step(refused_step, config=renamed, check=False, **step)
            assert "driverName: this stack's driver runs as 'neuron.aws.com'; renaming it to " \
                   "'renamed.neuron.aws.com'" in refused.get("error", ""), refused
        new_options = decode_settings(renamed).driver_options()
        assert new_options.namespace != options.namespace
        assert all(read_object(capi, m) is None for m in planned_driver(new_options)
                   if m["kind"] in ("Namespace", "DaemonSet", "DeviceClass"))
        assert managed(engine.step("up", config=changed, **step)) == {"same": total}  # the state is intact
    finally:
        present = {p.metadata.name for p in core.list_namespaced_pod("default").items if p.metadata is not None}
        for name in {"day-two-first", "day-two-second"} & present:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0, _preload_content=False)

    destroyed = engine.step("destroy", config=changed, **step)
    assert managed(destroyed) == {"delete": total}
    assert_all_gone(capi, [*planned_driver(options), template])
