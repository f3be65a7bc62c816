"""TrainiumNodeGroup under Pulumi mocks (preview=False: every apply runs, every input is resolved and recorded).

Assertions run on the recorded inputs after the program finished, so none can be skipped by an unresolved
Output; each test also checks how many resources it looked at.
"""

from __future__ import annotations

import base64
import email
import pydoc
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pulumi
import pytest

from neuron_dra.components.efa import EfaInterface, efa_interfaces
from neuron_dra.components.mocks import OfflineRun, PlanMocks, RecordedResource, run_offline
from neuron_dra.components.nodegroup import CNI_POLICY, NODE_POLICIES, TrainiumNodeGroup, TrainiumNodeGroupArgs
from neuron_dra.components.settings import NodeGroupSettings, SettingError
from neuron_dra.driver.model.catalog import CATALOG, get_instance_spec
from neuron_dra.driver.model.partitions import read_node_lnc

CANDIDATES = ["subnet-0000000000000000a", "subnet-0000000000000000b", "subnet-0000000000000000c"]
ZONES = {s: f"us-east-2{s[-1]}" for s in CANDIDATES}


def run_groups(groups: Sequence[NodeGroupSettings], zones: Sequence[str] = ("us-east-2a", "us-east-2b"),
               **placement: Any) -> OfflineRun[list[TrainiumNodeGroup]]:
    def program() -> list[TrainiumNodeGroup]:
        return [
            TrainiumNodeGroup(f"ng-{g.name}", TrainiumNodeGroupArgs.from_settings(
                g, cluster_name="c1", vpc_id="vpc-0123456789abcdef0",
                cluster_security_group_id="sg-0cluster0000000000", kubernetes_version="1.34",
                candidate_subnet_ids=CANDIDATES, availability_zones=zones, **placement))
            for g in groups
        ]

    return run_offline(program, mocks=PlanMocks(subnet_zones=ZONES))


def children_of(run: OfflineRun[Any], group: str, typ: str) -> list[RecordedResource]:
    parent = run.one("neuron-dra:index:TrainiumNodeGroup", f"ng-{group}")
    return [r for r in run.children(parent) if r.type == typ]


def only(run: OfflineRun[Any], group: str, typ: str) -> dict[str, Any]:
    found = children_of(run, group, typ)
    assert len(found) == 1, (group, typ, len(found))
    return found[0].plain_inputs


def name_of(instance_type: str) -> str:
    return instance_type.replace(".", "-")


@pytest.fixture(scope="module")
def catalog_run() -> OfflineRun[list[TrainiumNodeGroup]]:
    groups = [NodeGroupSettings(name=name_of(t), instance_type=t, desired_size=2, max_size=4) for t in CATALOG]
    return run_groups(groups)


def test_efa_layout_follows_the_catalog_for_every_instance_type(catalog_run: OfflineRun[Any]) -> None:
    checked = 0
    for instance_type, spec in CATALOG.items():
        lt = only(catalog_run, name_of(instance_type), "aws:ec2/launchTemplate:LaunchTemplate")
        nics = lt.get("networkInterfaces") or []
        assert len(nics) == spec.efa_count, instance_type
        for nic in nics:
            card = nic["networkCardIndex"]
            # card 0: primary interface, `efa`; other cards: device index 1, EFA-only by default
            assert nic["deviceIndex"] == (0 if card == 0 else 1)
            assert nic["interfaceType"] == ("efa" if card == 0 else "efa-only")
            assert nic["securityGroups"][0] == "sg-0cluster0000000000"
            assert len(nic["securityGroups"]) == 2  # + the EFA self-referencing group
        assert sorted(n["networkCardIndex"] for n in nics) == list(range(spec.efa_count))
        checked += 1
    assert checked == len(CATALOG) >= 10
    assert len(only(catalog_run, "trn2-48xlarge", "aws:ec2/launchTemplate:LaunchTemplate")["networkInterfaces"]) == 16
    assert len(only(catalog_run, "trn1-32xlarge", "aws:ec2/launchTemplate:LaunchTemplate")["networkInterfaces"]) == 8


def test_efa_groups_get_a_placement_group_one_subnet_and_self_referencing_rules(catalog_run: OfflineRun[Any]
                                                                                 ) -> None:
    for instance_type, spec in CATALOG.items():
        group = name_of(instance_type)
        efa = spec.efa_count > 0
        placement = children_of(catalog_run, group, "aws:ec2/placementGroup:PlacementGroup")
        lt = only(catalog_run, group, "aws:ec2/launchTemplate:LaunchTemplate")
        ng = only(catalog_run, group, "aws:eks/nodeGroup:NodeGroup")
        if efa:
            assert [p.plain_inputs["strategy"] for p in placement] == ["cluster"]
            # The auto-named placement group (the mock names it after its resource).
            assert lt["placement"]["groupName"].startswith(f"{placement[0].name}-")
            assert ng["subnetIds"] == ["subnet-0000000000000000a"]  # one subnet, the first AZ
            sg = children_of(catalog_run, group, "aws:ec2/securityGroup:SecurityGroup")
            assert len(sg) == 1
            sg_id = next(n for n in lt["networkInterfaces"][0]["securityGroups"] if n != "sg-0cluster0000000000")
            for typ in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"):
                rule = only(catalog_run, group, typ)
                assert rule["ipProtocol"] == "-1"
                assert rule["securityGroupId"] == rule["referencedSecurityGroupId"] == sg_id
                assert "cidrIpv4" not in rule
        else:
            assert placement == [] and "placement" not in lt
            assert children_of(catalog_run, group, "aws:ec2/securityGroup:SecurityGroup") == []
            # Non-EFA groups may use every candidate subnet in the offered AZs.
            assert ng["subnetIds"] == ["subnet-0000000000000000a", "subnet-0000000000000000b"]


def test_node_group_ami_taint_labels_scaling_and_launch_template(catalog_run: OfflineRun[Any]) -> None:
    count = 0
    for instance_type in CATALOG:
        group = name_of(instance_type)
        ng = only(catalog_run, group, "aws:eks/nodeGroup:NodeGroup")
        lt = only(catalog_run, group, "aws:ec2/launchTemplate:LaunchTemplate")
        assert ng["amiType"] == "AL2023_x86_64_NEURON"
        assert ng["capacityType"] == "ON_DEMAND"
        assert ng["instanceTypes"] == [instance_type] and "instanceType" not in lt
        assert ng["taints"] == [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NO_SCHEDULE"}]
        # Trainium2/3 nodes say their LNC (the AMI's default 2 unless lnc is set); other families have none.
        lnc = {"neuron-dra/lnc": "2"} if get_instance_spec(instance_type).lnc_supported else {}
        assert ng["labels"] == {"neuron-dra/node-group": group, **lnc}
        assert "userData" not in lt  # only a group with lnc set writes the LNC file
        assert ng["scalingConfig"] == {"desiredSize": 2, "minSize": 0, "maxSize": 4}
        assert ng["version"] == "1.34" and ng["clusterName"] == "c1" and ng["nodeGroupName"] == group
        assert ng["launchTemplate"]["version"] == "1"
        assert lt["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                         "httpPutResponseHopLimit": 1, "instanceMetadataTags": "disabled"}
        (root,) = lt["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"
        assert root["ebs"] == {"volumeSize": 500, "volumeType": "gp3", "encrypted": "true",
                               "deleteOnTermination": "true"}
        assert "instanceMarketOptions" not in lt and "capacityReservationSpecification" not in lt
        count += 1
    assert count == len(CATALOG)


def test_node_role_has_only_the_needed_managed_policies(catalog_run: OfflineRun[Any]) -> None:
    group = "trn2-48xlarge"
    role = only(catalog_run, group, "aws:iam/role:Role")
    assert role["assumeRolePolicy"]
    assert "managedPolicyArns" not in role and "inlinePolicies" not in role
    attached = {r.plain_inputs["policyArn"] for r in
                children_of(catalog_run, group, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    # No AmazonEKS_CNI_Policy: the VPC CNI has its own identity (TrainiumCluster), so a pod that reached IMDS
    # could not use the node role to change the node's network interfaces.
    assert attached == set(NODE_POLICIES) == {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    }
    ng_resource = children_of(catalog_run, group, "aws:eks/nodeGroup:NodeGroup")[0]
    attachment_urns = {r.urn for r in children_of(catalog_run, group,
                                                  "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attachment_urns <= set(ng_resource.dependencies)  # the node group waits for its permissions


def test_capacity_block_wiring() -> None:
    block = NodeGroupSettings(name="block", instance_type="trn2.48xlarge", desired_size=0, max_size=2,
                              capacity_reservation_id="cr-0123456789abcdef0", availability_zone="us-east-2b")
    run = run_groups([block])
    lt = only(run, "block", "aws:ec2/launchTemplate:LaunchTemplate")
    ng = only(run, "block", "aws:eks/nodeGroup:NodeGroup")
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert lt["instanceType"] == "trn2.48xlarge" and "instanceTypes" not in ng
    assert ng["capacityType"] == "CAPACITY_BLOCK"
    assert ng["subnetIds"] == ["subnet-0000000000000000b"]  # the reservation's AZ
    assert ng["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 2}
    assert ng["labels"]["neuron-dra/capacity-block-id"] == "cr-0123456789abcdef0"
    # Capacity Blocks are placed already; a placement group could keep instances out of the reservation.
    assert children_of(run, "block", "aws:ec2/placementGroup:PlacementGroup") == []
    assert "placement" not in lt


def test_efa_interface_type_efa_and_custom_root_volume() -> None:
    g = NodeGroupSettings(name="g", instance_type="trn1n.32xlarge", efa_interface_type="efa",
                          root_volume_size_gib=1000, root_volume_kms_key_id="arn:aws:kms:us-east-2:1:key/k",
                          labels={"team": "ml"}, subnet_ids=("subnet-0000000000000000c",))
    run = run_groups([g])
    lt = only(run, "g", "aws:ec2/launchTemplate:LaunchTemplate")
    assert {n["interfaceType"] for n in lt["networkInterfaces"]} == {"efa"}
    assert lt["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 1000
    assert lt["blockDeviceMappings"][0]["ebs"]["kmsKeyId"] == "arn:aws:kms:us-east-2:1:key/k"
    ng = only(run, "g", "aws:eks/nodeGroup:NodeGroup")
    assert ng["subnetIds"] == ["subnet-0000000000000000c"]
    assert ng["labels"] == {"team": "ml", "neuron-dra/node-group": "g"}
    # An explicit subnet needs no lookup.
    assert not [i for i in run.invokes if i.token == "aws:ec2/getSubnets:getSubnets"]


def test_no_private_subnet_in_the_groups_az_fails_naming_the_setting() -> None:
    g = NodeGroupSettings(name="g", instance_type="trn2.48xlarge", availability_zone="us-east-2d")
    with pytest.raises(Exception) as err:
        run_groups([g])
    chain: list[BaseException] = []
    e: BaseException | None = err.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    ours = [x for x in chain if isinstance(x, SettingError)]
    assert ours and ours[0].setting == "TrainiumNodeGroupArgs('g').availability_zone" and "us-east-2d" in str(ours[0])
    # ... and says where the cluster's subnets are (each looked up: getSubnet)
    assert ("its private subnets are in us-east-2a (subnet-0000000000000000a), us-east-2b (subnet-0000000000000000b), "
            "us-east-2c (subnet-0000000000000000c)") in str(ours[0])


def test_an_instance_type_typo_gets_a_did_you_mean() -> None:
    with pytest.raises(SettingError, match=r"did you mean 'trn2.48xlarge'\?"):
        NodeGroupSettings(name="g", instance_type="trn2.48xlarg")
    with pytest.raises(SettingError) as far:  # nothing close: the known types, no guess
        NodeGroupSettings(name="g", instance_type="zzz")
    assert "did you mean" not in str(far.value) and "trn2.48xlarge" in str(far.value)


def test_efa_interfaces_rules() -> None:
    assert efa_interfaces(get_instance_spec("inf2.48xlarge")) == ()
    assert efa_interfaces(get_instance_spec("trn2.3xlarge")) == (EfaInterface(0, 0, "efa"),)
    layout = efa_interfaces(get_instance_spec("trn1.32xlarge"), "efa")
    assert layout[0] == EfaInterface(0, 0, "efa")
    assert layout[1:] == tuple(EfaInterface(i, 1, "efa") for i in range(1, 8))
    with pytest.raises(ValueError, match="efa-only, efa"):
        efa_interfaces(get_instance_spec("trn2.48xlarge"), "ena")


def test_mocked_runs_execute_apply_callbacks() -> None:
    # Proof that the runs above resolve Outputs (preview=False): an apply's side effect happens.
    seen: list[str] = []

    def program() -> None:
        pulumi.Output.from_input("value").apply(seen.append)

    run_offline(program)
    assert seen == ["value"]


def test_imds_hop_limit_1_by_default_and_the_cni_policy_only_when_asked(catalog_run: OfflineRun[Any]) -> None:
    for group in (name_of(t) for t in CATALOG):
        md = only(catalog_run, group, "aws:ec2/launchTemplate:LaunchTemplate")["metadataOptions"]
        # Hop limit 1: a pod's packets to IMDS take one more hop and are dropped; host-network pods still reach it.
        assert md == {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1,
                      "instanceMetadataTags": "disabled"}, group
    g = NodeGroupSettings(name="legacy", instance_type="inf2.xlarge")
    run = run_groups([g], imds_hop_limit=2, cni_policy_on_node_role=True)
    md = only(run, "legacy", "aws:ec2/launchTemplate:LaunchTemplate")["metadataOptions"]
    assert md["httpPutResponseHopLimit"] == 2
    attached = {r.plain_inputs["policyArn"] for r in
                children_of(run, "legacy", "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == {*NODE_POLICIES, CNI_POLICY}


def test_args_take_plain_fields_and_name_the_python_field() -> None:
    def program() -> TrainiumNodeGroup:
        return TrainiumNodeGroup("team", TrainiumNodeGroupArgs(
            name="team", instance_type="trn1.32xlarge", desired_size=2, max_size=3, labels={"team": "ml"},
            cluster_name="c1", vpc_id="vpc-0123456789abcdef0", cluster_security_group_id="sg-0cluster0000000000",
            kubernetes_version="1.36", candidate_subnet_ids=CANDIDATES, availability_zones=["us-east-2b"]))

    run = run_offline(program, mocks=PlanMocks(subnet_zones=ZONES))
    ng = run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs
    assert ng["instanceTypes"] == ["trn1.32xlarge"] and ng["version"] == "1.36"
    assert ng["scalingConfig"] == {"desiredSize": 2, "minSize": 0, "maxSize": 3}
    assert ng["subnetIds"] == ["subnet-0000000000000000b"]
    assert ng["labels"] == {"team": "ml", "neuron-dra/node-group": "team"}
    with pytest.raises(SettingError) as err:
        TrainiumNodeGroupArgs(name="x", instance_type="p5.48xlarge", cluster_name="c", vpc_id="v",
                              cluster_security_group_id="sg", kubernetes_version="1.36", availability_zones=["a"])
    assert err.value.setting == "TrainiumNodeGroupArgs('x').instance_type"
    with pytest.raises(SettingError) as err:
        TrainiumNodeGroupArgs(name="x", cluster_name="c", vpc_id="v", cluster_security_group_id="sg",
                              kubernetes_version="1.36", availability_zones=["a"], imds_hop_limit=0)
    assert err.value.setting == "TrainiumNodeGroupArgs.imds_hop_limit"


def _placement(**extra: Any) -> dict[str, Any]:
    return {"cluster_name": "c1", "vpc_id": "vpc-0123456789abcdef0",
            "cluster_security_group_id": "sg-0cluster0000000000", "kubernetes_version": "1.36",
            "candidate_subnet_ids": CANDIDATES, "availability_zones": ["us-east-2a"], **extra}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.process
def test_lnc_is_written_where_the_ami_and_the_driver_read_it(lnc: int, tmp_path: Path) -> None:
    """The user data's script, run against a scratch root, leaves the file that the driver's own reader
    (partitions.read_node_lnc, as on the node) reads as `lnc`; the node label says the same."""
    run = run_offline(lambda: TrainiumNodeGroup("g", TrainiumNodeGroupArgs(
        name="g", instance_type="trn2.48xlarge", lnc=lnc, **_placement())), mocks=PlanMocks(subnet_zones=ZONES))
    lt = run.one("aws:ec2/launchTemplate:LaunchTemplate").plain_inputs
    message: Any = email.message_from_bytes(base64.b64decode(lt["userData"]))
    assert message.is_multipart()  # EKS merges MIME multi-part user data with its own bootstrap
    (part,) = message.get_payload()
    assert part.get_content_type() == "text/x-shellscript"
    script = part.get_payload().replace("/opt/aws/neuron", f"{tmp_path}/opt/aws/neuron")
    subprocess.run(["bash", "-c", script], check=True)
    assert read_node_lnc(tmp_path, get_instance_spec("trn2.48xlarge")) == lnc
    ng = run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs
    assert ng["labels"]["neuron-dra/lnc"] == str(lnc)


@pytest.mark.parametrize(("instance_type", "lnc", "fragment"), [
    ("trn1.32xlarge", 1, "drop lnc"),
    ("inf2.48xlarge", 2, "drop lnc"),
    ("trn2.48xlarge", 4, "1 or 2"),
    ("trn2.48xlarge", True, "1 or 2"),
])
def test_lnc_outside_trainium2_and_3_or_out_of_range_is_refused(instance_type: str, lnc: Any, fragment: str) -> None:
    with pytest.raises(SettingError) as err:
        TrainiumNodeGroupArgs(name="g", instance_type=instance_type, lnc=lnc, **_placement())
    assert err.value.setting == "TrainiumNodeGroupArgs('g').lnc" and fragment in str(err.value)


def test_check_target_names_a_non_default_lnc() -> None:
    assert NodeGroupSettings(name="a", lnc=1).check_target == "trn2.48xlarge:lnc=1"
    assert NodeGroupSettings(name="a", lnc=2).check_target == "trn2.48xlarge"
    assert NodeGroupSettings(name="a", instance_type="trn1.32xlarge").check_target == "trn1.32xlarge"
    assert NodeGroupSettings(name="a", instance_type="trn1.32xlarge").node_lnc is None


def test_subnets_reservation_and_security_groups_as_outputs() -> None:
    out = pulumi.Output.from_input

    placement: dict[str, Any] = {k: out(v) if k in ("cluster_name", "vpc_id", "cluster_security_group_id") else v
                                 for k, v in _placement(availability_zones=()).items()}

    def program() -> TrainiumNodeGroup:
        return TrainiumNodeGroup("g", TrainiumNodeGroupArgs(
            name="g", instance_type="trn2.48xlarge", desired_size=0,
            capacity_reservation_id=out("cr-0123456789abcdef0"), subnet_ids=out(["subnet-0000000000000000b"]),
            security_group_ids=[out("sg-0123456789abcdef1")], **placement))

    run = run_offline(program, mocks=PlanMocks(subnet_zones=ZONES))
    ng = run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs
    assert ng["subnetIds"] == ["subnet-0000000000000000b"] and ng["clusterName"] == "c1"
    assert ng["labels"]["neuron-dra/capacity-block-id"] == "cr-0123456789abcdef0"
    lt = run.one("aws:ec2/launchTemplate:LaunchTemplate").plain_inputs
    target = lt["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target == {"capacityReservationId": "cr-0123456789abcdef0"}
    groups = lt["networkInterfaces"][0]["securityGroups"]
    assert groups[0] == "sg-0cluster0000000000" and groups[-1] == "sg-0123456789abcdef1" and len(groups) == 3


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("capacity_reservation_id", "cr-x", "cr-0123456789abcdef0"),
    ("subnet_ids", ["subnet-0000000000000000a", "subnet-0000000000000000b"], "exactly one subnet"),
    ("subnet_ids", ["sn-1"], "subnet ids such as"),
])
def test_a_bad_output_fails_with_the_message_of_the_known_value(field: str, value: Any, fragment: str) -> None:
    base: dict[str, Any] = {"name": "g", "instance_type": "trn2.48xlarge", "desired_size": 0,
                            **_placement(availability_zones=())}
    if field == "capacity_reservation_id":
        base["subnet_ids"] = ["subnet-0000000000000000a"]
    with pytest.raises(SettingError) as known:
        TrainiumNodeGroupArgs(**base, **{field: value})
    late_value: dict[str, Any] = {field: pulumi.Output.from_input(value)}
    with pytest.raises(Exception) as late:
        run_offline(lambda: TrainiumNodeGroup("g", TrainiumNodeGroupArgs(**base, **late_value)),
                    mocks=PlanMocks(subnet_zones=ZONES))
    ours: BaseException | None = late.value
    while ours is not None and not isinstance(ours, SettingError):
        ours = ours.__cause__ or ours.__context__
    assert isinstance(ours, SettingError) and str(ours) == str(known.value) and fragment in str(ours)


def test_placement_is_required_without_a_cluster() -> None:
    with pytest.raises(SettingError) as err:
        TrainiumNodeGroupArgs(name="g", availability_zones=["us-east-2a"])
    assert err.value.setting == "TrainiumNodeGroupArgs('g').cluster_name" and "cluster=" in str(err.value)


def test_pydoc_of_the_args_shows_field_docs_and_no_catalog() -> None:
    text = pydoc.render_doc(TrainiumNodeGroupArgs, renderer=pydoc.TextDoc())
    assert "InstanceSpec(" not in text and "Catalog(" in text and len(text) < 12_000
    for name in TrainiumNodeGroupArgs.model_fields:
        if name not in ("where", "hardware"):
            assert name in (TrainiumNodeGroupArgs.__doc__ or ""), name
