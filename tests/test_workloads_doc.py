"""docs/workloads.md: every manifest an ML engineer copies is a valid object for the default Kubernetes version,
names claim templates that exist in the examples (in its own namespace), tolerates the Neuron taint and wires
each container to a claim. That the Pod example runs on the local cluster: tests/e2e/test_e2e_workloads_doc.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import examples
from neuron_dra.claim_templates.loader import templates_in
from neuron_dra.components.settings import DEFAULT_KUBERNETES_VERSION
from neuron_dra.driver.model.k8s_names import neuron_taint
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "workloads.md"
TEMPLATES = {(t.namespace, t.name): t for t in templates_in(vars(examples))}


def manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] == "Pod":
        spec: dict[str, Any] = obj["spec"]
        return spec
    if obj["kind"] in ("Deployment", "Job", "StatefulSet"):
        spec = obj["spec"]["template"]["spec"]
        return spec
    return None


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests() if m["kind"] == kind]


def test_the_doc_has_the_promised_workloads() -> None:
    kinds = [m["kind"] for m in manifests()]
    assert kinds.count("Pod") == 1 and kinds.count("Deployment") == 2 and kinds.count("Job") == 1
    (job,) = by_kind("Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4


@pytest.mark.parametrize("obj", manifests(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_every_manifest_is_valid_for_the_default_kubernetes_version(obj: dict[str, Any]) -> None:
    kubeschema.validate(obj, DEFAULT_KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("obj", [m for m in manifests() if pod_spec(m)], ids=lambda m: m["metadata"]["name"])
def test_every_workload_uses_existing_templates_tolerates_the_taint_and_wires_its_claims(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    assert spec is not None
    namespace = obj["metadata"]["namespace"]
    claims = {c["name"]: c["resourceClaimTemplateName"] for c in spec["resourceClaims"]}
    for template in claims.values():
        assert (namespace, template) in TEMPLATES, f"{template} is not an example template in {namespace}"
    taint = neuron_taint()
    assert any(t["key"] == taint["key"] and t.get("effect") == taint["effect"] and t["operator"] == "Exists"
               for t in spec["tolerations"])
    for container in spec["containers"]:
        used = {c["name"] for c in container["resources"]["claims"]}
        assert used and used <= set(claims)


def test_the_training_job_takes_whole_nodes_with_all_their_efas() -> None:
    (job,) = by_kind("Job")
    (claim,) = job["spec"]["template"]["spec"]["resourceClaims"]
    template = TEMPLATES[("default", claim["resourceClaimTemplateName"])].to_manifest()
    requests = {r["name"]: r["exactly"] for r in template["spec"]["spec"]["devices"]["requests"]}
    assert requests["neurons"]["count"] == 16 and requests["efa"]["count"] == 16
    assert requests["efa"]["deviceClassName"] == "efa.networking.k8s.aws"
    (service,) = by_kind("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
