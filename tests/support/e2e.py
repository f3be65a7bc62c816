"""Helpers for the end-to-end tests against the local cluster (real apiserver, scheduler, controller-manager)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from neuron_dra.driver.model.k8s_names import neuron_toleration

if TYPE_CHECKING:  # annotations only: importing this module does not import the kubernetes client
    from kubernetes import client

NEURON_TOLERATION = neuron_toleration()

T = TypeVar("T")


def eventually(fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.3, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except AssertionError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or fn}" + (f": {last}" if last else ""))


def namespace_name(prefix: str, test_name: str) -> str:
    """A valid, distinct namespace name for a test (parametrized names have brackets; long ones get a hash)."""
    clean = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")
    if len(clean) > 50:
        clean = clean[:43].rstrip("-") + "-" + hashlib.sha256(test_name.encode()).hexdigest()[:6]
    return prefix + clean


def create_namespace(core: client.CoreV1Api, name: str) -> None:
    """Namespace `name`, once its `default` ServiceAccount exists (a pod created before it is refused)."""
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(name).items), 30, what="default SA")


def device_claim(name: str, driver: str, device_id: int) -> dict[str, Any]:
    """A ResourceClaim for the one Neuron device with `deviceId` `device_id` (DeviceClass named as the driver)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "neuron", "exactly": {
                "deviceClassName": driver,
                "selectors": [{"cel": {"expression": f'device.attributes["{driver}"].deviceId == {device_id}'}}]}}]}}}


def raw(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data)
    return data


def claim_template(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None,
                   config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": {"devices": devices}}}


def pod_with_template(name: str, template: str, node: str | None = None, request: str | None = None
                      ) -> dict[str, Any]:
    claim_use: dict[str, Any] = {"name": "neuron"}
    if request:
        claim_use["request"] = request
    spec: dict[str, Any] = {
        "tolerations": [NEURON_TOLERATION],
        "resourceClaims": [{"name": "neuron", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "public.ecr.aws/neuron/pytorch-training:emulated",
                        "resources": {"claims": [claim_use]}}],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def unschedulable(core: client.CoreV1Api, ns: str, pod: str) -> bool:
    """The scheduler found no node for the pod (PodScheduled False, reason Unschedulable) and it is not bound."""
    p = raw(core.read_namespaced_pod(pod, ns, _preload_content=False))
    return not p["spec"].get("nodeName") and any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in p.get("status", {}).get("conditions", []))


def pod_phase(core: client.CoreV1Api, ns: str, name: str) -> str:
    return str(raw(core.read_namespaced_pod(name, ns, _preload_content=False)).get("status", {}).get("phase"))


def pod_claim(core: client.CoreV1Api, res: client.ResourceV1Api, ns: str, pod: str) -> dict[str, Any]:
    p = raw(core.read_namespaced_pod(pod, ns, _preload_content=False))
    (status,) = p["status"]["resourceClaimStatuses"]
    return raw(res.read_namespaced_resource_claim(status["resourceClaimName"], ns, _preload_content=False))


def allocated_devices(claim: dict[str, Any], driver: str) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver]


def created_container(records: Path, ns: str, pod: str, container: str = "main") -> dict[str, Any]:
    """What the node's fake runtime recorded when kubelet created the container (CDI ids, resolved env and
    device nodes); fails the test when there is no such record."""
    from neuron_dra.localcluster.nodes.fakeruntime import created_containers

    found = created_containers(records, ns, pod)
    assert container in found, f"no CreateContainer of {ns}/{pod}/{container} in {records}"
    return found[container]


def cdi_specs_naming(cdi_root: Path, uids: list[str]) -> list[str]:
    """CDI spec files whose content names one of the claim UIDs (files may vanish while we look)."""
    found = []
    for f in cdi_root.iterdir():
        try:
            text = f.read_text()
        except FileNotFoundError:
            continue
        if any(u in text for u in uids):
            found.append(f.name)
    return found
