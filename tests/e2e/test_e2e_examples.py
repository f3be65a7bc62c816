"""End-to-end: the example claim templates against the real kube-apiserver and kube-scheduler.

- Every template in `neuron_dra.claim_templates.examples` (AWS's official samples and the richer cases) is accepted
  by the apiserver as it is (its CEL compiled there, nothing pruned), and broken CEL is refused there.
- For several templates, predicted_count + 1 pods pinned to one node: exactly the number of claims per node the
  claim check predicted run, the extra pod is Unschedulable, and the devices the real scheduler allocated are the
  check's allocator simulation's, claim for claim, honouring every matchAttribute constraint in the published slices.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuron_dra.claim_templates import ClaimTemplate, Connected, Efa, Neuron, check, examples
from neuron_dra.claim_templates.allocator import simulate
from neuron_dra.claim_templates.checks import default_checker
from neuron_dra.claim_templates.loader import templates_in
from neuron_dra.localcluster.cluster import LocalCluster
from tests.support.e2e import eventually, pod_claim, pod_phase, pod_with_template, raw, unschedulable

# The end-to-end suite runs the local cluster.
pytestmark = pytest.mark.cluster

DRIVER = "neuron.aws.com"
TRN2_A, TRN2_B, TRN1, INF2 = "trn2-48xlarge-1", "trn2-48xlarge-2", "trn1-32xlarge-1", "inf2-48xlarge-1"
EXAMPLES = templates_in(vars(examples))

# trn1.32xlarge has 2 EFAs per row of 4 devices, so AWS's 4+4 sample does not fit it; this is its aligned case.
TRN1_ROW_WITH_EFAS = ClaimTemplate(
    "trn1-row-with-efas", Neuron(4, topology=Connected(), instance_types="trn1.32xlarge"), Efa(2))

CASES = [
    pytest.param(examples.neuron_1x4_connected, TRN2_A, id="4-connected-trn2"),
    pytest.param(examples.neuron_8_connected, TRN2_B, id="8-connected-trn2"),
    pytest.param(examples.inf2_ring_segment_4, INF2, id="inf2-ring-segment-4"),
    pytest.param(TRN1_ROW_WITH_EFAS, TRN1, id="aligned-efa-trn1"),
    pytest.param(examples.neuron_efa_aligned, TRN2_B, id="aligned-efa-trn2-official"),
    pytest.param(examples.trn2_8_else_trn1_16, TRN1, id="first-available-second-option-trn1"),
    pytest.param(examples.trn2_8_else_trn1_16, TRN2_A, id="first-available-first-option-trn2"),
]


def _manifest(template: ClaimTemplate, ns: str) -> dict[str, Any]:
    m = template.to_manifest()
    m["metadata"]["namespace"] = ns
    return m


def _create_template(res: client.ResourceV1Api, ns: str, manifest: Mapping[str, Any]) -> None:
    res.create_namespaced_resource_claim_template(ns, manifest)  # type: ignore[arg-type]


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "").get("message"))
    except (ValueError, AttributeError):
        return f"{e.status} {e.reason}"


def test_every_example_template_is_accepted_as_is(kube: client.ApiClient, ns: str) -> None:
    assert len(EXAMPLES) >= 16, [t.name for t in EXAMPLES]
    res = client.ResourceV1Api(kube)
    rejected: dict[str, str] = {}
    for template in EXAMPLES:
        try:
            _create_template(res, ns, _manifest(template, ns))
        except ApiException as e:
            rejected[template.name] = _api_message(e)
    assert not rejected, "the apiserver rejected: " + "; ".join(f"{n}: {m}" for n, m in rejected.items())
    # stored as sent: no field pruned as unknown, nothing defaulted differently (the server adds only an empty
    # metadata for the claims)
    changed = []
    for template in EXAMPLES:
        stored = raw(res.read_namespaced_resource_claim_template(template.name, ns, _preload_content=False))["spec"]
        sent = template.to_manifest()["spec"]
        if stored["spec"] != sent["spec"] or stored.get("metadata", {}) != sent.get("metadata", {}):
            changed.append(template.name)
    assert not changed, f"stored differently from the rendered manifest: {changed}"


@pytest.mark.parametrize(("expression", "complaint"), [
    ("device.attributes['neuron.aws.com'].instanceType ==", "Syntax error"),
    ("device.driver + 1 == 2", "found no matching overload"),  # a type error: CEL is type-checked there
])
def test_broken_cel_is_refused_by_the_apiserver(kube: client.ApiClient, ns: str, expression: str,
                                                complaint: str) -> None:
    manifest = copy.deepcopy(_manifest(examples.neuron_1x4_connected, ns))
    manifest["metadata"]["name"] = "broken"
    selectors = manifest["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    selectors.append({"cel": {"expression": expression}})
    with pytest.raises(ApiException) as refused:
        _create_template(client.ResourceV1Api(kube), ns, manifest)
    assert refused.value.status == 422
    message = _api_message(refused.value)
    assert "spec.spec.devices.requests[0].exactly.selectors[1].cel.expression" in message and complaint in message


# --- allocation by the real scheduler vs the check's prediction ------------------------------------------------

def _running(core: client.CoreV1Api, ns: str, pods: list[str]) -> list[str]:
    return [p for p in pods if pod_phase(core, ns, p) == "Running"]


def _slice_attributes(res: client.ResourceV1Api, node: str) -> dict[str, dict[str, Any]]:
    """device name -> its attributes, qualified (`domain/name`), as the node's slices publish them."""
    out: dict[str, dict[str, Any]] = {}
    items = raw(res.list_resource_slice(field_selector=f"spec.nodeName={node}", _preload_content=False))["items"]
    for s in items:
        driver = s["spec"]["driver"]
        for d in s["spec"].get("devices") or ():
            out[d["name"]] = {(k if "/" in k else f"{driver}/{k}"): v for k, v in (d.get("attributes") or {}).items()}
    return out


def _predicted_allocations(template: ClaimTemplate, instance_type: str) -> list[tuple[tuple[str, str], ...]]:
    """The check's allocator simulation packing claims of the template into one empty node of the type:
    per claim, (request, device) pairs."""
    node = default_checker().catalog(template.drivers).node(instance_type)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": template.name, "namespace": "default"}, "spec": template.claim_spec()}
    result = simulate(node.slices, node.device_classes, [claim], node_name=node.node_name, mode="count")
    return [tuple(sorted((d.request, d.device) for d in allocation)) for allocation in result.allocation]


@pytest.mark.parametrize(("template", "node"), CASES)
def test_scheduler_allocates_what_the_check_predicted(local_cluster: LocalCluster, kube: client.ApiClient, ns: str,
                                                     template: ClaimTemplate, node: str) -> None:
    instance_type = next(n.instance_type for n in local_cluster.nodes if n.name == node)
    predicted = check(template, [instance_type]).fit(instance_type).claims_per_node
    packing = _predicted_allocations(template, instance_type)
    assert predicted >= 1 and len(packing) == predicted
    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    _create_template(res, ns, _manifest(template, ns))
    pods = [f"p{i}" for i in range(predicted + 1)]
    for p in pods:
        core.create_namespaced_pod(ns, pod_with_template(p, template.name, node=node))  # type: ignore[arg-type]
    eventually(lambda: len(_running(core, ns, pods)) == predicted, 120,
               what=f"{predicted} pods of {template.name} running on {node}")
    (extra,) = set(pods) - set(_running(core, ns, pods))
    eventually(lambda: unschedulable(core, ns, extra), 60, what=f"pod {extra} unschedulable")
    time.sleep(2)  # and it stays so: the node holds exactly the predicted number of claims
    assert len(_running(core, ns, pods)) == predicted and unschedulable(core, ns, extra)

    attributes = _slice_attributes(res, node)
    constraints = template.claim_spec()["devices"].get("constraints", [])
    actual = []
    for p in _running(core, ns, pods):
        claim = pod_claim(core, res, ns, p)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["pool"] for r in results} == {node}
        actual.append(tuple(sorted((r["request"], r["device"]) for r in results)))
        for c in constraints:  # every matchAttribute constraint holds in the published attributes
            # a constraint names requests (all their alternatives) or one alternative (`req/sub`)
            named = [r for r in results if r["request"] in c["requests"] or r["request"].split("/")[0] in c["requests"]]
            if not named:
                continue  # it names another alternative than the one allocated
            values = {repr(attributes[r["device"]].get(c["matchAttribute"])) for r in named}
            assert len(values) == 1 and "None" not in values, (p, c, values)
    # the real scheduler's claims are the simulation's, claim for claim (which pod got which is the scheduler's)
    assert sorted(actual) == sorted(packing)
