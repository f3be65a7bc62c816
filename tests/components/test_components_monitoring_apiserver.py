"""`podMonitor: auto` against a real kube-apiserver: off while the cluster lacks prometheus-operator's PodMonitor
CRD, on once it serves it (the CRD generated from the pinned types, localcluster/controlplane/prometheus_build.py),
off with a warning when the cluster cannot be asked."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client, dynamic

from neuron_dra.components.monitoring import serves_pod_monitors
from neuron_dra.components.settings_schema import decode_settings
from neuron_dra.components.stack import driver_options
from neuron_dra.localcluster.controlplane import prometheus_build
from neuron_dra.localcluster.controlplane.plane import ControlPlane

pytestmark = [pytest.mark.cluster, pytest.mark.gobuild]


def install_crd(api: Any) -> None:
    document = prometheus_build.podmonitor_crd()
    dynamic.DynamicClient(api).resources.get(api_version="apiextensions.k8s.io/v1",
                                             kind="CustomResourceDefinition").create(body=document)
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = ext.read_custom_resource_definition(document["metadata"]["name"]).status
        if any(c.type == "Established" and c.status == "True" for c in (status.conditions if status else None) or []):
            return
        time.sleep(0.5)
    raise AssertionError("the PodMonitor CRD was not established")


IMAGE = "registry.example.com/neuron-dra-driver@sha256:" + "0" * 64  # an existing cluster needs an image


def test_auto_follows_the_crd(plane: ControlPlane, api: Any) -> None:
    warnings: list[str] = []
    kubeconfig = str(plane.kubeconfig)
    settings = decode_settings({"kubeconfig": kubeconfig, "driverImage": IMAGE, "driverMetricsPort": "9400"})
    assert settings.pod_monitor == "auto"
    assert not serves_pod_monitors(kubeconfig, warnings.append)
    assert not driver_options(settings).pod_monitor
    assert warnings == []  # a 404 is an answer, not a problem

    install_crd(api)
    assert serves_pod_monitors(kubeconfig, warnings.append)
    assert serves_pod_monitors(plane.kubeconfig.read_text(), warnings.append)  # contents instead of a path
    assert driver_options(settings).pod_monitor
    assert not driver_options(decode_settings({"kubeconfig": kubeconfig, "driverImage": IMAGE,
                                               "driverMetricsPort": "9400", "podMonitor": "false"})).pod_monitor


def test_an_unreachable_cluster_means_no_pod_monitor_and_a_warning(plane: ControlPlane) -> None:
    text = plane.kubeconfig.read_text()
    server = next(line.split("server:", 1)[1].strip() for line in text.splitlines() if "server:" in line)
    warnings: list[str] = []
    assert not serves_pod_monitors(text.replace(server, "https://127.0.0.1:1"), warnings.append)
    assert len(warnings) == 1 and "did not answer" in warnings[0]
