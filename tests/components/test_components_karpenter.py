"""Karpenter for Trainium under Pulumi mocks: TrainiumKarpenter's IAM, queue and chart inputs, TrainiumNodePool's
NodePool and EC2NodeClass, the nodePools setting and its refusals, and the claim checks against pool types.

The stack of Pulumi.karpenter-example.yaml (one static trn2.48xlarge Capacity Block pool, one dynamic trn1 pool,
the driver) runs once per module, as `neuron-dra plan` runs it; assertions read the recorded inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.components import plan
from neuron_dra.components.claims import ClaimTemplateCheckError
from neuron_dra.components.cluster import POD_IDENTITY_TRUST
from neuron_dra.components.efa import karpenter_interfaces
from neuron_dra.components.karpenter import CHART, INTERRUPTION_EVENTS, KARPENTER_VERSION, NAMESPACE, SERVICE_ACCOUNT
from neuron_dra.components.mocks import OfflineRun
from neuron_dra.components.nodegroup import NODE_POLICIES
from neuron_dra.components.nodepool import lnc_user_data, node_class_manifest, node_pool_manifest
from neuron_dra.components.settings import NodePoolSettings, SettingError
from neuron_dra.components.settings_schema import NODE_POOL_KEYS, decode_settings
from neuron_dra.driver.deploy import CAPACITY_BLOCK_LABEL, NODE_POOL_LABEL
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.k8s_names import neuron_taint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "Pulumi.karpenter-example.yaml"
RESERVATION = "cr-0123456789abcdef0"


@pytest.fixture(scope="module")
def run() -> OfflineRun[Any]:
    planned: OfflineRun[Any] = plan.plan(plan.load_config_file(EXAMPLE))
    return planned


def one(run: OfflineRun[Any], typ: str, name: str | None = None) -> dict[str, Any]:
    inputs: dict[str, Any] = run.one(typ, name).plain_inputs
    return inputs


def manifests(run: OfflineRun[Any], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests(run) if m["kind"] == kind}


def test_the_example_stack_has_karpenter_two_pools_the_driver_and_no_node_group(run: OfflineRun[Any]) -> None:
    assert run.exports["nodePoolNames"] == ["trn2-block", "trn1"]
    assert run.exports["nodeGroupNames"] == []
    assert len(run.of_type("neuron-dra:index:TrainiumKarpenter")) == 1
    assert len(run.of_type("neuron-dra:index:NeuronDraDriver")) == 1
    kinds = [m["kind"] for m in plan.kubernetes_manifests(run)]
    # -o yaml: every object the stack applies, the pools last (after the chart has installed the CRDs).
    assert kinds[-4:] == ["EC2NodeClass", "EC2NodeClass", "NodePool", "NodePool"]
    assert "DaemonSet" in kinds and "Release" not in kinds
    # CoreDNS waits for the controller's node group (the only nodes before Karpenter launches any).
    coredns = run.one("aws:eks/addon:Addon", "cluster-coredns")
    assert run.one("aws:eks/nodeGroup:NodeGroup", "karpenter-system").urn in coredns.dependencies


def test_static_capacity_block_pool(run: OfflineRun[Any]) -> None:
    pool = manifests(run, "NodePool")["trn2-block"]["spec"]
    assert pool["replicas"] == 2 and pool["limits"] == {"nodes": 2} and "disruption" not in pool
    template = pool["template"]
    assert template["metadata"]["labels"] == {"team": "research", NODE_POOL_LABEL: "trn2-block",
                                              CAPACITY_BLOCK_LABEL: RESERVATION, "neuron-dra/lnc": "1"}
    spec = template["spec"]
    assert spec["expireAfter"] == "Never"
    assert spec["taints"] == [neuron_taint()]
    assert spec["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "trn2-block"}
    requirements = {r["key"]: r["values"] for r in spec["requirements"]}
    assert requirements == {"node.kubernetes.io/instance-type": ["trn2.48xlarge"],
                            "karpenter.k8s.aws/instance-family": ["trn2"],
                            "karpenter.sh/capacity-type": ["reserved"],
                            "topology.kubernetes.io/zone": ["us-east-2c"]}
    node_class = manifests(run, "EC2NodeClass")["trn2-block"]["spec"]
    assert node_class["capacityReservationSelectorTerms"] == [{"id": RESERVATION}]
    assert node_class["userData"] == lnc_user_data(1)
    assert "echo NEURON_LOGICAL_NC_CONFIG=1 > /opt/aws/neuron/logical_nc_config" in node_class["userData"]


def test_node_class_has_the_node_groups_node_settings(run: OfflineRun[Any]) -> None:
    node_class = manifests(run, "EC2NodeClass")["trn2-block"]["spec"]
    assert node_class["role"].startswith("karpenter-node-role-")  # the node role's (auto-named) name
    assert node_class["amiSelectorTerms"] == [{"alias": "al2023@latest"}]
    assert node_class["metadataOptions"]["httpTokens"] == "required"
    assert node_class["metadataOptions"]["httpPutResponseHopLimit"] == 1
    [root] = node_class["blockDeviceMappings"]
    assert root["rootVolume"] and root["ebs"] == {"volumeSize": "500Gi", "volumeType": "gp3", "encrypted": True,
                                                  "deleteOnTermination": True}
    assert [t["id"][:3] for t in node_class["securityGroupSelectorTerms"]] == ["sg-"]  # the cluster's own
    assert len(node_class["subnetSelectorTerms"]) >= 2
    interfaces = node_class["networkInterfaces"]
    assert len(interfaces) == 17  # the ENA primary and one EFA-only per network card (16 on trn2.48xlarge)
    assert interfaces[0] == {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    assert sorted(i["networkCardIndex"] for i in interfaces if i["interfaceType"] == "efa-only") == list(range(16))


def test_the_new_vpc_has_subnets_where_the_pools_launch(run: OfflineRun[Any]) -> None:
    zones = one(run, "awsx:ec2:Vpc")["availabilityZoneNames"]
    assert "us-east-2c" in zones  # the Capacity Block's AZ, which no node group and no default would bring
    assert "us-east-2a" in zones  # where the mocks offer trn1 first


def test_dynamic_trn1_pool(run: OfflineRun[Any]) -> None:
    pool = manifests(run, "NodePool")["trn1"]["spec"]
    assert "replicas" not in pool and pool["limits"] == {"nodes": 8}
    assert pool["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"}
    requirements = {r["key"]: r["values"] for r in pool["template"]["spec"]["requirements"]}
    assert requirements == {"node.kubernetes.io/instance-type": ["trn1.2xlarge", "trn1.32xlarge"],
                            "karpenter.k8s.aws/instance-family": ["trn1"],
                            "karpenter.sh/capacity-type": ["on-demand", "spot"]}
    node_class = manifests(run, "EC2NodeClass")["trn1"]["spec"]
    # trn1.2xlarge has no EFA, trn1.32xlarge 8: no fixed interface list (Karpenter sizes EFA per pod request).
    assert "networkInterfaces" not in node_class and "capacityReservationSelectorTerms" not in node_class
    assert node_class["blockDeviceMappings"][0]["ebs"]["volumeSize"] == "200Gi"


def test_karpenter_iam_queue_and_rules(run: OfflineRun[Any]) -> None:
    node_role = run.one("aws:iam/role:Role", "karpenter-node-role")
    assert json.loads(node_role.plain_inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "ec2.amazonaws.com"}
    attached = {r.plain_inputs["policyArn"] for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.name.startswith("karpenter-node-")}
    assert attached == set(NODE_POLICIES)
    access = one(run, "aws:eks/accessEntry:AccessEntry", "karpenter-node-access")
    node_role_arn = access["principalArn"]
    assert access["type"] == "EC2_LINUX" and "karpenter-node-role" in node_role_arn
    queue = one(run, "aws:sqs/queue:Queue", "karpenter-interruption")
    assert queue["messageRetentionSeconds"] == 300 and queue["sqsManagedSseEnabled"] is True
    queue_policy = json.loads(one(run, "aws:sqs/queuePolicy:QueuePolicy")["policy"])
    assert queue_policy["Statement"][0]["Principal"]["Service"] == ["events.amazonaws.com", "sqs.amazonaws.com"]
    assert queue_policy["Statement"][1]["Effect"] == "Deny"
    patterns = sorted((json.loads(r.plain_inputs["eventPattern"])["source"][0],
                       json.loads(r.plain_inputs["eventPattern"])["detail-type"][0])
                      for r in run.of_type("aws:cloudwatch/eventRule:EventRule"))
    assert patterns == sorted((source, detail) for _, source, detail in INTERRUPTION_EVENTS)
    targets = run.of_type("aws:cloudwatch/eventTarget:EventTarget")
    [queue_arn] = {t.plain_inputs["arn"] for t in targets}
    assert len(targets) == 4 and ":sqs:" in queue_arn and queue_policy["Statement"][0]["Resource"] == queue_arn

    controller = one(run, "aws:iam/role:Role", "karpenter-controller")
    assert json.loads(controller["assumeRolePolicy"]) == POD_IDENTITY_TRUST
    association = one(run, "aws:eks/podIdentityAssociation:PodIdentityAssociation", "karpenter-controller")
    assert (association["namespace"], association["serviceAccount"]) == (NAMESPACE, SERVICE_ACCOUNT)
    assert "karpenter-controller" in association["roleArn"]
    statements = {s["Sid"]: s for s in json.loads(one(run, "aws:iam/rolePolicy:RolePolicy")["policy"])["Statement"]}
    assert statements["PassNodeRole"]["Resource"] == node_role_arn  # no other role can be passed
    assert statements["ReadInterruptionQueue"]["Resource"] == queue_arn
    cluster = run.exports["clusterName"]
    assert statements["EndOwnNodes"]["Condition"]["StringEquals"] == {
        f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}
    assert statements["DiscoverApiServer"]["Resource"] == f"arn:aws:eks:us-east-2:123456789012:cluster/{cluster}"
    assert "ec2:DescribeCapacityReservations" in statements["ReadRegion"]["Action"]


def test_karpenter_chart_inputs(run: OfflineRun[Any]) -> None:
    # The stack's other release is the EFA DRA driver's (its static pool has EFA).
    (release,) = [r for r in run.of_type("kubernetes:helm.sh/v3:Release") if r.plain_inputs.get("chart") == CHART]
    values = release.plain_inputs
    assert (values["chart"], values["version"], values["namespace"]) == (CHART, KARPENTER_VERSION, NAMESPACE)
    settings = values["values"]["settings"]
    assert settings["clusterName"] == run.exports["clusterName"]
    queue_arn = run.one("aws:cloudwatch/eventTarget:EventTarget", "karpenter-spot").plain_inputs["arn"]
    assert queue_arn.endswith(":" + settings["interruptionQueue"])  # the queue the rules feed
    assert settings["featureGates"] == {"staticCapacity": True, "reservedCapacity": True}
    assert values["values"]["serviceAccount"]["name"] == SERVICE_ACCOUNT
    # The chart goes in once its Pod Identity association exists (pods get credentials only if it does).
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "karpenter-controller")
    assert association.urn in release.dependencies
    for pool in run.of_type("kubernetes:karpenter.sh/v1:NodePool"):
        assert release.urn in pool.dependencies


def test_controller_nodes_keep_imds_to_hop_one(run: OfflineRun[Any]) -> None:
    group = one(run, "aws:eks/nodeGroup:NodeGroup", "karpenter-system")
    assert group["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    template = one(run, "aws:ec2/launchTemplate:LaunchTemplate", "karpenter-system-lt")
    assert template["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert template["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"


def test_claim_templates_are_checked_against_the_pools_instance_types() -> None:
    config = {"neuron-dra:driverImage": "registry.example.com/d:1",
              "neuron-dra:nodePools": json.dumps([{"name": "inf2", "instanceFamilies": ["inf2"]}])}
    settings = decode_settings(config)
    assert settings.node_instance_types == ("inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge")
    with pytest.raises(ClaimTemplateCheckError) as err:  # the default templates want trn2 devices
        plan.plan(config)
    assert "inf2.48xlarge" in str(err.value)


def test_pools_next_to_node_groups_check_templates_against_both() -> None:
    pools = [{"name": "inf2", "instanceTypes": ["inf2.xlarge"]}]
    settings = decode_settings({"neuron-dra:nodeGroups": json.dumps([{"name": "trn2"}]),
                                "neuron-dra:nodePools": json.dumps(pools)})
    assert settings.node_instance_types == ("trn2.48xlarge", "inf2.xlarge")


def pool(**kwargs: Any) -> NodePoolSettings:
    return NodePoolSettings(**{"name": "p", **kwargs})


@pytest.mark.parametrize(("kwargs", "field", "fragment"), [
    ({"instance_types": ("p5.48xlarge",)}, "instance_types", "trn2.48xlarge"),
    ({"instance_families": ("p5",)}, "instance_families", "trn2"),
    ({}, "instance_types", "at least one instance type"),
    ({"instance_types": ("trn2.48xlarge", "trn1.32xlarge"), "replicas": 1}, "instance_types", "exactly one"),
    ({"instance_families": ("trn2",), "replicas": 1}, "instance_types", "exactly one"),
    ({"instance_types": ("trn2.48xlarge",), "capacity_reservation_id": RESERVATION}, "capacity_reservation_id",
     "set replicas"),
    ({"instance_types": ("trn2.48xlarge",), "capacity_types": ("reserved",)}, "capacity_types",
     "on-demand and/or spot"),
    ({"instance_types": ("trn2u.48xlarge",)}, "instance_types", "UltraServers come as Capacity Blocks"),
    ({"instance_types": ("trn2u.48xlarge",), "replicas": 4}, "capacity_reservation_id", "UltraServer"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": 2, "capacity_types": ("reserved",)},
     "capacity_reservation_id", "reservation id"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": 2, "capacity_types": ("spot",)}, "capacity_types", "spot"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": 2, "capacity_reservation_id": RESERVATION,
      "capacity_types": ("on-demand",)}, "capacity_types", "[reserved]"),
    ({"instance_types": ("inf2.xlarge",), "replicas": 1, "capacity_reservation_id": RESERVATION}, "instance_types",
     "sold as Capacity Blocks"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": 1, "capacity_reservation_id": RESERVATION},
     "availability_zone", "the reservation's AZ"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": 3, "max_nodes": 2}, "max_nodes", "at least replicas (3)"),
    ({"instance_types": ("trn2.48xlarge",), "max_nodes": 100000}, "max_nodes", "0 to 1000"),
    ({"instance_types": ("trn2.48xlarge",), "replicas": True}, "replicas", "whole number"),
    ({"instance_types": ("trn1.32xlarge",), "lnc": 1}, "lnc", "no Logical NeuronCore"),
    ({"instance_types": ("trn2.48xlarge",), "lnc": 3}, "lnc", "1 or 2"),
    ({"instance_types": ("trn2.48xlarge",), "capacity_types": ("preemptible",)}, "capacity_types", "on-demand, spot"),
    ({"instance_types": ("trn2.48xlarge",), "labels": {"karpenter.sh/foo": "x"}}, "labels", "Karpenter's own"),
    ({"instance_types": ("trn2.48xlarge",), "ami_version": "al2023@latest"}, "ami_version", "v20261120"),
    ({"instance_types": ("trn2.48xlarge",), "root_volume_size_gib": 20}, "root_volume_size_gib", "at least 50"),
    ({"name": "Bad_Name", "instance_types": ("trn2.48xlarge",)}, "name", "DNS label"),
])
def test_bad_pool_settings_name_the_field_the_value_and_what_is_allowed(kwargs: dict[str, Any], field: str,
                                                                        fragment: str) -> None:
    with pytest.raises(SettingError) as err:
        pool(**kwargs)
    assert err.value.field == f"NodePoolSettings({kwargs.get('name', 'p')!r}).{field}"
    assert fragment in str(err.value)


def test_config_errors_name_the_setting() -> None:
    bad = [{"name": "a", "instanceTypes": ["trn2.48xlarge"], "replica": 2}]
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:nodePools": json.dumps(bad)})
    assert err.value.field == "neuron-dra:nodePools[0].replica" and "did you mean 'replicas'" in str(err.value)
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:nodePools": json.dumps([{"name": "a", "instanceTypes": "trn2.48xlarge"}])})
    assert err.value.field == "neuron-dra:nodePools[0].instanceTypes"
    twice = [{"name": "a", "instanceTypes": ["trn2.48xlarge"]}] * 2
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:nodePools": json.dumps(twice)})
    assert err.value.field == "neuron-dra:nodePools[1].name"
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:kubeconfig": "~/.kube/config", "neuron-dra:nodePools": json.dumps(twice[:1])})
    assert err.value.field == "neuron-dra:nodePools"
    with pytest.raises(SettingError) as err:
        decode_settings({"neuron-dra:vpcCniVersion": "v1.18.0-eksbuild.1",
                         "neuron-dra:nodePools": json.dumps([{"name": "a", "instanceTypes": ["trn2.48xlarge"]}])})
    assert "a use EFA-only interfaces" in str(err.value)


@pytest.mark.parametrize("instance_type", BUILTIN.names)
def test_karpenter_interfaces_follow_the_catalog(instance_type: str) -> None:
    spec = BUILTIN.spec(instance_type)
    interfaces = karpenter_interfaces(spec)
    if spec.efa_count == 0:
        assert interfaces == ()
        return
    pairs = [(i.network_card_index, i.device_index) for i in interfaces]
    assert len(set(pairs)) == len(pairs)  # the CRD's rule: no duplicate card/device pair
    assert interfaces[0].interface_type == "interface" and pairs[0] == (0, 0)
    efa_cards = [i.network_card_index for i in interfaces if i.interface_type == "efa-only"]
    assert sorted(efa_cards) == list(range(spec.efa_count))  # one EFA per network card


def test_manifests_refuse_a_node_class_without_subnets() -> None:
    p = pool(instance_types=("trn2.48xlarge",))
    assert node_pool_manifest(p)["metadata"]["name"] == "p"
    with pytest.raises(SettingError, match="private subnets"):
        node_class_manifest(p, role="r", subnet_ids=[], security_group_ids=["sg-1"])


def test_pulumi_example_yaml_shows_every_node_pool_key() -> None:
    text = (ROOT / "Pulumi.example.yaml").read_text()
    assert "# neuron-dra:nodePools:" in text
    for key in NODE_POOL_KEYS:
        assert f"#     {key}:" in text or f"#   - {key}:" in text, key
