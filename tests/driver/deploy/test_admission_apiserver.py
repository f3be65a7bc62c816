"""The claim admission policy (deploy/admission.py) on a real kube-apiserver: the server accepts the policy (its
CEL compiles there and reads `opaque.parameters`, a RawExtension), refuses the issue's typo at create with the
driver's message naming the field, admits valid configs and other drivers' configs, says of every sample what
cel-python says in test_admission.py, and lets a bad claim stored before the policy take metadata updates."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from neuron_dra.driver.deploy import admission
from tests.driver.deploy.test_admission import DRIVER, LABELS, NEURON, SAMPLES, admit, claim, opaque, template

pytestmark = pytest.mark.cluster

NS = "claims"
INSTALL_NS = "neuron-dra-driver"
POLICY = admission.policy_name(INSTALL_NS, DRIVER)
TYPO = {**NEURON, "logicalNeuronCoreCount": 2}
STORED_BEFORE = "stored-before-the-policy"


class Resources:
    def __init__(self, api: Any) -> None:
        dyn = dynamic.DynamicClient(api)
        self.claims = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        self.templates = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaimTemplate")
        self.policies = dyn.resources.get(api_version="admissionregistration.k8s.io/v1",
                                          kind="ValidatingAdmissionPolicy")
        self.bindings = dyn.resources.get(api_version="admissionregistration.k8s.io/v1",
                                          kind="ValidatingAdmissionPolicyBinding")

    def create(self, obj: dict[str, Any], name: str = "c", dry_run: bool = True) -> str | None:
        """None when the API server admits `obj`, else its message."""
        obj = {**obj, "metadata": {"name": name, "namespace": NS}}
        res = self.templates if obj["kind"] == "ResourceClaimTemplate" else self.claims
        try:
            res.create(body=obj, namespace=NS, query_params=[("dryRun", "All")] if dry_run else [])
        except ApiException as e:
            message: str = json.loads(e.body or "{}")["message"]
            return message
        return None


@pytest.fixture(scope="module")
def server(api: Any) -> Iterator[Resources]:
    """The policy and binding applied as rendered, after a claim with the typo was stored; returns once the
    policy refuses the typo (policies take effect asynchronously)."""
    r = Resources(api)
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    assert r.create(claim(opaque(TYPO)), STORED_BEFORE, dry_run=False) is None
    for obj in admission.manifests(DRIVER, INSTALL_NS, LABELS):
        (r.policies if obj["kind"] == "ValidatingAdmissionPolicy" else r.bindings).create(body=obj)
    deadline = time.monotonic() + 60
    while r.create(template(opaque(TYPO))) is None:
        assert time.monotonic() < deadline, "the policy never took effect"
        time.sleep(0.2)
    yield r


def test_the_api_server_type_checks_the_policy_without_warnings(server: Resources) -> None:
    """kube-apiserver type-checks every expression against the ResourceClaim and ResourceClaimTemplate schemas
    (in the background: status.observedGeneration says when). `parameters` is a RawExtension there, an object
    without fields: read through dyn(), the policy has no warnings."""
    deadline = time.monotonic() + 60
    while (status := server.policies.get(name=POLICY).to_dict().get("status") or {}).get("observedGeneration") != 1:
        assert time.monotonic() < deadline, "the policy was never type-checked"
        time.sleep(0.2)
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


def test_the_typo_of_the_issue_is_refused_at_create_naming_the_field(server: Resources) -> None:
    for wrap, resource, path in ((template, "resourceclaimtemplates", "spec.spec.devices.config"),
                                 (claim, "resourceclaims", "spec.devices.config")):
        message = server.create(wrap(opaque(TYPO)), dry_run=False)
        assert message == (
            f'{resource}.resource.k8s.io "c" is forbidden: ValidatingAdmissionPolicy \'{POLICY}\' with binding '
            f"'{POLICY}' denied request: {path}[0]: opaque config field 'logicalNeuronCoreCount': 2 is not allowed; "
            "allowed: the fields of NeuronConfig: apiVersion, kind, logicalNeuronCore")


def test_valid_configs_and_other_drivers_configs_are_admitted(server: Resources) -> None:
    assert server.create(template(opaque({**NEURON, "logicalNeuronCore": 1})), "valid", dry_run=False) is None
    assert server.create(claim(opaque({**NEURON, "logicalNeuronCore": 2})), "valid", dry_run=False) is None
    assert server.create(claim(opaque({"apiVersion": "x/v1", "logicalNeuronCoreCount": 2}, "gpu.example.com")),
                         "other", dry_run=False) is None


@pytest.mark.parametrize("parameters", [s for s in SAMPLES if isinstance(s, dict)], ids=lambda s: str(s)[:60])
def test_the_api_server_says_what_cel_python_says(server: Resources, parameters: dict[str, Any]) -> None:
    """Every sample of the unit tests (whose cel-python answers equal the driver's decode): the same answer
    from the real CEL. (Parameters that are not an object never reach admission: the API server refuses them.)"""
    for wrap in (claim, template):
        obj = wrap(opaque({"apiVersion": "gpu.example.com/v1"}, "gpu.example.com"), opaque(parameters))
        expected = admit(obj)
        got = server.create(obj)
        assert (got is None) == (expected is None), (got, expected)
        if expected is not None:
            assert got is not None and got.endswith(f" denied request: {expected}")


def test_a_claim_stored_before_the_policy_still_takes_metadata_updates(server: Resources) -> None:
    """Its finalizer must stay removable: the policy checks an UPDATE only when the configs change. (A change of
    the configs never gets that far today: the API server refuses it first, the spec being immutable.)"""
    stored = server.claims.get(name=STORED_BEFORE, namespace=NS).to_dict()
    stored["metadata"]["labels"] = {"touched": "yes"}
    server.claims.replace(body=stored, namespace=NS)
    assert server.claims.get(name=STORED_BEFORE, namespace=NS).to_dict()["metadata"]["labels"] == {"touched": "yes"}
    stored = server.claims.get(name=STORED_BEFORE, namespace=NS).to_dict()
    stored["spec"]["devices"]["config"][0]["opaque"]["parameters"] = {**NEURON, "logicalNeuronCore": 3}
    with pytest.raises(ApiException) as refused:
        server.claims.replace(body=stored, namespace=NS)
    assert "field is immutable" in json.loads(refused.value.body or "{}")["message"]


@pytest.mark.parametrize("unknown", [admission.MAX_SORTED_UNKNOWN, 800])
def test_the_worst_case_claim_stays_within_the_cost_budget(server: Resources, unknown: int) -> None:
    """32 configs (the API server's limit) of up to 10 KiB each (its limit too) full of unknown fields, as many as
    are sorted and as many as fit: refused with the driver's message, not with a CEL cost error."""
    big = {**NEURON, **{f"k{i:04d}": 0 for i in reversed(range(unknown))}}
    assert len(json.dumps(big)) <= 10 * 1024
    message = server.create(claim(*[opaque(big)] * admission.MAX_CONFIGS))
    # More than MAX_SORTED_UNKNOWN unknown fields: one of them is named, unsorted.
    named = "k0000" if unknown <= admission.MAX_SORTED_UNKNOWN else r"k\d{4}"
    assert message is not None and re.search(
        rf"denied request: spec\.devices\.config\[0\]: opaque config field '{named}': 0 is not allowed; allowed: the "
        rf"fields of NeuronConfig: apiVersion, kind, logicalNeuronCore \(and {admission.MAX_CONFIGS - 1} more\)$",
        message), message
