"""docs/workloads.md's Pod example, copied as an ML engineer would, runs on the local cluster."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.support.e2e import eventually, pod_phase
from tests.test_workloads_doc import TEMPLATES, by_kind


@pytest.mark.cluster
def test_the_pod_example_runs_on_the_local_cluster(kube: client.ApiClient, ns: str) -> None:
    (pod,) = by_kind("Pod")
    (claim,) = pod["spec"]["resourceClaims"]
    template = TEMPLATES[("default", claim["resourceClaimTemplateName"])].to_manifest()
    template["metadata"]["namespace"] = ns
    pod["metadata"]["namespace"] = ns
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(ns, template)  # type: ignore[arg-type]
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(ns, pod)  # type: ignore[arg-type]
    eventually(lambda: pod_phase(core, ns, pod["metadata"]["name"]) == "Running", 180,
               what=f"pod {pod['metadata']['name']} Running")
