"""docs/workloads.md: every manifest an ML engineer copies is a valid object for the default Kubernetes version,
names claim templates that exist in the examples (in its own namespace) or the UltraServer job's shared claim and
template (which must be what `UltraServerJob` renders), tolerates the Neuron taint and wires each container to a
claim. JobSet, LeaderWorkerSet and Kueue schemas are not in kubernetes-validate: the JobSet's Job template is
validated as a Job and the LeaderWorkerSet's worker template as a Pod; Kueue's objects are not schema-checked.
That the Pod example runs on the local cluster: tests/e2e/test_e2e_workloads_doc.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import examples
from neuron_dra.claim_templates.loader import templates_in
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.cli import main
from neuron_dra.components.settings import DEFAULT_KUBERNETES_VERSION
from neuron_dra.driver.model.k8s_names import neuron_taint
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "workloads.md"
TEMPLATES = {(t.namespace, t.name): t for t in templates_in(vars(examples))}
# The doc's UltraServer job, as its Python block writes it.
ULTRA_JOB = UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge")
# Kinds whose CRD schemas kubernetes-validate does not have.
CRD_KINDS = {"JobSet", "LeaderWorkerSet", "Topology", "ResourceFlavor"}


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
    if obj["kind"] == "JobSet":
        (replicated,) = obj["spec"]["replicatedJobs"]
        spec = replicated["template"]["spec"]["template"]["spec"]
        return spec
    if obj["kind"] == "LeaderWorkerSet":
        spec = obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        return spec
    return None


def core_parts(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """What kubernetes-validate can check: the object itself, or a CRD's embedded Kubernetes parts."""
    meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"].get("namespace", "default")}
    if obj["kind"] == "JobSet":
        (replicated,) = obj["spec"]["replicatedJobs"]
        return [{"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": replicated["template"]["spec"]}]
    if obj["kind"] == "LeaderWorkerSet":
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                 "spec": obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]}]
    if obj["kind"] in CRD_KINDS:
        return []
    return [obj]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests() if m["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [m for m in by_kind(kind) if m["metadata"]["name"] == name]
    return obj


def test_the_doc_has_the_promised_workloads() -> None:
    kinds = [m["kind"] for m in manifests()]
    assert kinds.count("Pod") == 1 and kinds.count("Deployment") == 2 and kinds.count("Job") == 3
    assert kinds.count("JobSet") == 1 and kinds.count("LeaderWorkerSet") == 2
    for name in ("nxd-train", "ultra-train"):
        job = named("Job", name)
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4


@pytest.mark.parametrize("obj", manifests(), ids=lambda m: f"{m['kind']}/{m['metadata']['name']}")
def test_every_manifest_is_valid_for_the_default_kubernetes_version(obj: dict[str, Any]) -> None:
    parts = core_parts(obj)
    assert parts or obj["kind"] in ("Topology", "ResourceFlavor")  # Kueue's: no schema here
    for part in parts:
        kubeschema.validate(part, DEFAULT_KUBERNETES_VERSION, strict=True)


def test_the_ultraserver_claims_are_what_the_job_class_renders() -> None:
    assert [by_kind("ResourceClaim")[0], named("ResourceClaimTemplate", ULTRA_JOB.template_name)] == \
        ULTRA_JOB.manifests()
    assert 'UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge")' in DOC.read_text()


def shares_a_claim(obj: dict[str, Any]) -> bool:
    spec = pod_spec(obj)
    return spec is not None and any("resourceClaimName" in c for c in spec["resourceClaims"])


def pod_template_labels(obj: dict[str, Any]) -> dict[str, str]:
    if obj["kind"] == "LeaderWorkerSet":
        template = obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    elif obj["kind"] == "JobSet":
        template = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    else:
        template = obj["spec"]["template"]
    labels: dict[str, str] = (template.get("metadata") or {}).get("labels") or {}
    return labels


def pod_count(obj: dict[str, Any]) -> int:
    if obj["kind"] == "LeaderWorkerSet":
        return int(obj["spec"]["leaderWorkerTemplate"]["size"])
    job = obj["spec"]["replicatedJobs"][0]["template"] if obj["kind"] == "JobSet" else obj
    return int(job["spec"]["parallelism"])


@pytest.mark.parametrize("obj", [m for m in manifests() if shares_a_claim(m)], ids=lambda m: m["metadata"]["name"])
def test_ultraserver_workloads_share_the_group_claim_and_take_one_node_each(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    assert spec is not None
    assert sorted(spec["resourceClaims"], key=lambda c: c["name"]) == sorted(ULTRA_JOB.pod_claims(),
                                                                               key=lambda c: c["name"])
    assert pod_count(obj) == ULTRA_JOB.nodes
    # the pod side UltraServerJob renders, or LeaderWorkerSet's annotation that injects the same on the same label
    exclusive = (obj["metadata"].get("annotations") or {}).get("leaderworkerset.sigs.k8s.io/exclusive-topology")
    if exclusive is not None:
        assert exclusive == ULTRA_JOB.topology_key and "affinity" not in spec
    else:
        assert spec["affinity"] == ULTRA_JOB.affinity()
        assert pod_template_labels(obj) == ULTRA_JOB.pod_labels()
    if obj["kind"] in ("JobSet", "LeaderWorkerSet"):  # one replica per shared claim (the doc says why)
        replicas = obj["spec"]["replicatedJobs"][0]["replicas"] if obj["kind"] == "JobSet" else obj["spec"]["replicas"]
        assert replicas == 1


def test_the_claims_check_output_shown_is_what_the_cli_prints(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (shown,) = re.findall(r"^```text\n(ultraserver job .*?)^```", DOC.read_text(), flags=re.S | re.M)
    file = tmp_path / "jobs.py"
    file.write_text("from neuron_dra.claim_templates.ultraserver import UltraServerJob\n"
                    'train = UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge")\n')
    assert main(["claims", "check", str(file), "--ultraservers", "trn2u.48xlarge:4,trn2u.48xlarge:2"]) == 0
    assert capsys.readouterr().out == shown


@pytest.mark.parametrize("obj", [m for m in manifests() if pod_spec(m)], ids=lambda m: m["metadata"]["name"])
def test_every_workload_uses_existing_templates_tolerates_the_taint_and_wires_its_claims(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    assert spec is not None
    namespace = obj["metadata"]["namespace"]
    claims = {c["name"]: c.get("resourceClaimTemplateName") or c["resourceClaimName"] for c in spec["resourceClaims"]}
    ultra = {ULTRA_JOB.claim_name, ULTRA_JOB.template_name}
    for template in claims.values():
        assert (namespace, template) in TEMPLATES or template in ultra, \
            f"{template} is not an example template in {namespace} nor the UltraServer job's"
    taint = neuron_taint()
    assert any(t["key"] == taint["key"] and t.get("effect") == taint["effect"] and t["operator"] == "Exists"
               for t in spec["tolerations"])
    for container in spec["containers"]:
        used = {c["name"] for c in container["resources"]["claims"]}
        assert used and used <= set(claims)


def test_the_training_job_takes_whole_nodes_with_all_their_efas() -> None:
    job = named("Job", "nxd-train")
    (claim,) = job["spec"]["template"]["spec"]["resourceClaims"]
    template = TEMPLATES[("default", claim["resourceClaimTemplateName"])].to_manifest()
    requests = {r["name"]: r["exactly"] for r in template["spec"]["spec"]["devices"]["requests"]}
    assert requests["neurons"]["count"] == 16 and requests["efa"]["count"] == 16
    assert requests["efa"]["deviceClassName"] == "efa.networking.k8s.aws"
    (service,) = by_kind("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
