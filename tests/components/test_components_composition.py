"""The composition examples of README.md and docs/components.md, run verbatim under the package's mocks: CoreDNS
after the first node group with nodes, the node groups after the VPC CNI's identity, the driver after the node
groups, the driver's objects for the cluster's Kubernetes version, the LNC on the nodes and in the checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.components import plan
from neuron_dra.components.mocks import OfflineRun, PlanMocks, run_offline
from neuron_dra.driver import deploy
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[2]
NETWORK = {"acme/network/prod": {"vpcId": "vpc-0123456789abcdef0",
                                 "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]}}
ZONES = {"subnet-0123456789abcdef0": "us-east-2a", "subnet-0fedcba9876543210": "us-east-2b"}


def python_block(path: Path, after: str) -> str:
    """The first ```python block after the line `after`."""
    text = path.read_text(encoding="utf-8")
    start = text.index(after)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"{path.name}: no python block after {after!r}"
    return match.group(1)


def run_example(code: str, name: str) -> OfflineRun[dict[str, Any]]:
    def program() -> dict[str, Any]:
        scope: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(code, name, "exec"), scope)  # the documented example, verbatim
        return scope

    return run_offline(program, mocks=PlanMocks(stack_outputs=NETWORK, subnet_zones=ZONES))


def by_name(run: OfflineRun[Any], typ: str) -> dict[str, Any]:
    return {r.name: r for r in run.of_type(typ)}


def driver_daemonset(run: OfflineRun[Any]) -> Any:
    """The driver's DaemonSet (neuron-monitor's is beside it: docs/utilisation.md §3)."""
    (ds,) = [r for r in run.of_type("kubernetes:apps/v1:DaemonSet")
             if r.plain_inputs["metadata"]["name"] == deploy.DEFAULT_DAEMONSET]
    return ds


def test_components_md_example() -> None:
    run = run_example(python_block(ROOT / "docs" / "components.md", "## A complete stack"), "components.md")
    eks = run.one("eks:index:Cluster").plain_inputs
    assert eks["vpcId"] == "vpc-0123456789abcdef0" and eks["version"] == "1.36" and eks["name"] == "training"
    assert eks["privateSubnetIds"] == NETWORK["acme/network/prod"]["privateSubnetIds"]
    assert eks["vpcCniOptions"]["enableNetworkPolicy"] is True
    groups = by_name(run, "aws:eks/nodeGroup:NodeGroup")
    assert set(groups) == {"trn2-block-ng", "trn1-ng"}
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    for group in groups.values():
        assert association.urn in group.dependencies  # the nodes' aws-node pods get the VPC CNI's identity
        assert group.plain_inputs["clusterName"] == "training" and group.plain_inputs["version"] == "1.36"
    trn2 = groups["trn2-block-ng"].plain_inputs
    assert trn2["capacityType"] == "CAPACITY_BLOCK" and trn2["subnetIds"] == ["subnet-0fedcba9876543210"]
    assert trn2["labels"]["neuron-dra/lnc"] == "1"
    lt = by_name(run, "aws:ec2/launchTemplate:LaunchTemplate")["trn2-block-lt"].plain_inputs
    assert len(lt["networkInterfaces"]) == 16 and "userData" in lt
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == \
        "cr-0123456789abcdef0"
    (coredns,) = [a for a in run.of_type("aws:eks/addon:Addon") if a.plain_inputs["addonName"] == "coredns"]
    assert groups["trn2-block-ng"].urn in coredns.dependencies
    manifests = plan.kubernetes_manifests(run)
    classes = [m["metadata"]["name"] for m in manifests if m["kind"] == "DeviceClass"]
    # 1.36 without NeuronCores asked for (DriverDeployOptions.core_partitions auto): whole devices only
    assert classes == ["neuron.aws.com"]
    daemonset = driver_daemonset(run)
    assert {g.urn for g in groups.values()} <= set(daemonset.dependencies)  # rolls out onto the nodes
    templates = [m for m in manifests if m["kind"] == "ResourceClaimTemplate"]
    assert [(t["metadata"]["namespace"], t["metadata"]["name"]) for t in templates] == [
        ("ml", "trn1-4-connected"), ("ml", "trn2-8-connected-efa"),
        ("neuron-dra-driver", "neuron-monitor")]  # neuron-monitor's, on by default
    for m in manifests:
        kubeschema.validate(m, "1.36", strict=True)
    scope = run.result
    assert scope["templates"].names == ["ml/trn2-8-connected-efa", "ml/trn1-4-connected"]
    assert scope["trn2"].lnc == 1 and scope["trn1"].lnc is None
    # The templates were checked against the trn2 nodes at LNC=1.
    assert scope["templates"].checked_against == ("trn2.48xlarge:lnc=1", "trn1.32xlarge")


def test_components_md_example_on_1_34_renders_what_1_34_serves() -> None:
    code = python_block(ROOT / "docs" / "components.md", "## A complete stack")
    assert code.count('kubernetes_version="1.36"') == 1
    run = run_example(code.replace('kubernetes_version="1.36"', 'kubernetes_version="1.34"'), "components.md")
    manifests = plan.kubernetes_manifests(run)
    classes = [m for m in manifests if m["kind"] == "DeviceClass"]
    assert [c["metadata"]["name"] for c in classes] == ["neuron.aws.com"]
    assert "extendedResourceName" not in classes[0]["spec"]
    env = {e["name"] for e in driver_daemonset(run).plain_inputs["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert "UNHEALTHY_TAINT_EFFECT" not in env and "HEALTHCHECK_PORT" in env
    for m in manifests:
        kubeschema.validate(m, "1.34", strict=True)


def test_readme_example() -> None:
    run = run_example(python_block(ROOT / "README.md", "**Components for other stacks.**"), "README.md")
    (group,) = run.of_type("aws:eks/nodeGroup:NodeGroup")
    (coredns,) = [a for a in run.of_type("aws:eks/addon:Addon") if a.plain_inputs["addonName"] == "coredns"]
    assert group.urn in coredns.dependencies
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert association.urn in group.dependencies
    assert group.urn in driver_daemonset(run).dependencies
    assert len(run.of_type("kubernetes:resource.k8s.io/v1:DeviceClass")) == 1  # 1.36: no NeuronCores unasked


def test_a_stack_reference_without_mocked_outputs_says_what_to_give() -> None:
    code = python_block(ROOT / "docs" / "components.md", "## A complete stack")
    with pytest.raises(LookupError, match="stack_outputs"):
        run_offline(lambda: exec(compile(code, "components.md", "exec"), {"__name__": "__main__"}))


KARPENTER_ONLY = '''
import pulumi

from neuron_dra.components import NeuronDraDriver, TrainiumCluster, TrainiumKarpenter, TrainiumNodePool

cluster = TrainiumCluster("training", kubernetes_version="1.36")
karpenter = TrainiumKarpenter("karpenter", cluster=cluster)
pool = TrainiumNodePool("trn2", cluster=cluster, karpenter=karpenter, instance_types=["trn2.48xlarge"], max_nodes=2)
driver = NeuronDraDriver("neuron-dra", cluster=cluster,
                         image="registry.example.com/neuron-dra-driver@sha256:" + "0" * 64)
pulumi.export("pools", [pool.name])
pulumi.export("clusterName", cluster.cluster_name)
'''


def test_a_karpenter_only_cluster_written_elsewhere_gets_coredns(tmp_path: Path) -> None:
    """Issue 39 finding 6: a user's own program with only Karpenter pools (no node group) gets CoreDNS, after the
    first nodes it has (Karpenter's controller nodes); its `pulumi.export` values are the run's exports."""
    (tmp_path / "Pulumi.yaml").write_text("name: team-trn\nruntime: python\n")
    (tmp_path / "__main__.py").write_text(KARPENTER_ONLY)
    run = plan.plan_program(plan.Project.load(tmp_path), {}, "dev")
    (coredns,) = [a for a in run.of_type("aws:eks/addon:Addon") if a.plain_inputs["addonName"] == "coredns"]
    (system,) = run.of_type("aws:eks/nodeGroup:NodeGroup")  # Karpenter's controller nodes: no node group
    assert system.plain_inputs["nodeGroupName"] == "karpenter-system" and system.urn in coredns.dependencies
    tolerations = json.loads(coredns.plain_inputs["configurationValues"])["tolerations"]
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert run.exports == {"pools": ["trn2"], "clusterName": "training"}


def test_a_pool_on_a_cluster_without_coredns_is_refused_saying_how() -> None:
    """Karpenter installed some other way (its node role given): nothing of this program installs CoreDNS, so the
    pool is refused at preview with the three ways out."""
    from neuron_dra.components import TrainiumCluster, TrainiumNodePool
    from neuron_dra.components.settings import SettingError

    def program() -> Any:
        cluster = TrainiumCluster("training", kubernetes_version="1.36")
        return TrainiumNodePool("trn2", cluster=cluster, node_role_name="karpenter-node",
                                instance_types=["trn2.48xlarge"])

    with pytest.raises(SettingError) as err:
        run_offline(program)
    assert err.value.setting == "TrainiumNodePoolArgs.cluster" and "CoreDNS" in err.value.allowed
    for way in ("karpenter=TrainiumKarpenter(cluster=...)", "TrainiumNodeGroup with nodes",
                "cluster.install_coredns(after=[...])"):
        assert way in err.value.allowed
