"""`cluster up --node trn2u.48xlarge:4 --node trn2u.48xlarge:2`: each flag of an UltraServer type is one UltraServer
of its emulated nodes, which the driver's own model groups exactly so; the group controller's local objects and
command line. (The running cluster: tests/e2e/test_e2e_ultraserver.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from neuron_dra.driver.groups.main import parser as controller_parser
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.k8s_names import ultraserver_class_name
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices
from neuron_dra.localcluster.controlplane.groups import controller_argv, controller_objects, controller_options
from neuron_dra.localcluster.nodes.labels import node_manifest
from neuron_dra.localcluster.nodes.nodeagent import emulation_options
from neuron_dra.localcluster.nodes.topology import parse_nodes, ultraservers

DRIVER = "neuron.aws.com"


def test_each_flag_of_an_ultraserver_type_is_one_ultraserver() -> None:
    nodes = parse_nodes(["trn2u.48xlarge:4", "trn2.48xlarge:1", "trn2u.48xlarge:2", "trn3p.48xlarge"])
    assert [(n.name, n.ultraserver_node, n.ultraserver_size) for n in nodes if n.ultraserver] == [
        ("trn2u-48xlarge-1", 0, 4), ("trn2u-48xlarge-2", 1, 4), ("trn2u-48xlarge-3", 2, 4),
        ("trn2u-48xlarge-4", 3, 4), ("trn2u-48xlarge-5", 0, 2), ("trn2u-48xlarge-6", 1, 2),
        ("trn3p-48xlarge-1", 0, 1)]
    assert [n.ultraserver for n in nodes if n.instance_type == "trn2.48xlarge"] == [""]
    assert sorted(map(len, ultraservers(nodes).values())) == [1, 2, 4]


@pytest.mark.parametrize(("arg", "allowed"), [("trn2u.48xlarge:3", "1, 2, 4"), ("trn2u.48xlarge:8", "1, 2, 4")])
def test_an_ultraserver_of_a_size_the_hardware_has_not_is_refused(arg: str, allowed: str) -> None:
    with pytest.raises(ValueError, match=rf"--node '{arg}'.*not allowed; allowed: {allowed}"):
        parse_nodes([arg])


def test_the_emulated_nodes_group_into_exactly_their_ultraservers(tmp_path: Path) -> None:
    """The hosts the node agents emulate, published by the driver's model and grouped by the controller's: one
    group per flag, whose selector names exactly the flag's nodes by their hostname label."""
    nodes = parse_nodes(["trn2u.48xlarge:4", "trn2u.48xlarge:2", "trn2.48xlarge:1"])
    slices = []
    hostnames = {}
    for n in nodes:
        host = discover(emulate(n.instance_type, tmp_path / n.name, emulation_options(n)))
        slices += resource_slices(build_pool(host, NodeFacts(n.name)), generation=1)
        hostnames[n.name] = node_manifest(n.name, n.instance_type)["metadata"]["labels"][us.HOSTNAME_LABEL]
    facts, problems = us.member_facts(slices, DRIVER)
    assert problems == []
    membership = us.group_ultraservers(facts, hostnames=hostnames)
    assert membership.problems == ()
    whole = {g.size: g for g in membership.groups if g.half_of is None}
    members = ultraservers(nodes)
    assert sorted(whole) == [2, 4]
    for group in whole.values():
        assert list(group.node_names) == sorted(next(m for m in members.values() if len(m) == group.size))
        assert group.ready
        selector = us.group_slice(group, DRIVER)["spec"]["nodeSelector"]
        assert us.selected_nodes(selector) == sorted(hostnames[m] for m in group.node_names)
    halves = [g for g in membership.groups if g.half_of is not None]
    assert [g.node_names for g in halves] == [("trn2u-48xlarge-1", "trn2u-48xlarge-2"),
                                              ("trn2u-48xlarge-3", "trn2u-48xlarge-4")]


def test_the_controller_runs_on_the_host_with_its_objects_but_not_its_deployment(tmp_path: Path) -> None:
    options = controller_options(DRIVER, "neuron-dra-driver")
    objects = controller_objects(options)
    kinds = [o["kind"] for o in objects]
    assert "Deployment" not in kinds
    assert {"ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy", "DeviceClass"} <= set(kinds)
    (device_class,) = [o for o in objects if o["kind"] == "DeviceClass"]
    assert device_class["metadata"]["name"] == ultraserver_class_name(DRIVER)
    argv = controller_argv(options, tmp_path / "kubeconfig")
    assert argv[1:3] == ["-m", "neuron_dra.driver.groups"]
    args = controller_parser().parse_args(argv[3:])  # the controller's own parser takes every flag
    assert (args.driver_name, args.namespace, args.lease_name, args.kubeconfig) == (
        DRIVER, "neuron-dra-driver", options.name, str(tmp_path / "kubeconfig"))
