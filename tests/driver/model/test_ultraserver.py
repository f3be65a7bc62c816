"""UltraServer membership read back from the nodes' own ResourceSlices, and the group slices rendered from it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from neuron_dra.driver.model import k8s_names
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.emulate import EmulationOptions
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices, with_taints
from tests.support import kubeschema

DRIVER = "neuron.aws.com"


def node_slices(name: str, host_id: str, position: int, mode: int | None = 4, block: str | None = None,
                instance_type: str = "trn2u.48xlarge", unhealthy_device: str | None = None) -> list[dict[str, Any]]:
    """What a node's driver publishes (the daemon's own model), as the API server would store it."""
    host = emulated_host(instance_type, EmulationOptions(host_id=host_id, ultraserver_node=position,
                                                         ultraserver_mode=mode))
    pool = build_pool(host, NodeFacts(name, capacity_block_id=block))
    if unhealthy_device:
        pool = with_taints(pool, {unhealthy_device: ({"key": f"{DRIVER}/unhealthy", "value": "mem_ecc_uncorrected",
                                                      "effect": "NoSchedule"},)})
    return resource_slices(pool, generation=1)


def cluster() -> list[dict[str, Any]]:
    """Names that say nothing (and mislead): a 4-node UltraServer, a 2-node one, a plain trn2 node."""
    slices = []
    for name, pos in (("zeta", 2), ("alpha", 0), ("us-b-0", 3), ("mid", 1)):
        slices += node_slices(name, "us-a", pos, block="cr-0a")
    for name, pos in (("us-a-0", 0), ("us-a-1", 1)):
        slices += node_slices(name, "us-b", pos, mode=2)
    host = emulated_host("trn2.48xlarge")
    slices += resource_slices(build_pool(host, NodeFacts("plain")), generation=1)
    return slices


def membership(slices: list[dict[str, Any]], previous: list[dict[str, Any]] = (),  # type: ignore[assignment]
               ready: list[str] | None = None) -> us.Membership:
    facts, problems = us.member_facts(slices, DRIVER)
    assert problems == []
    return us.group_ultraservers(facts, us.previous_groups(previous), ready)


def by_pool(m: us.Membership) -> dict[str, us.Group]:
    return {g.pool_name: g for g in m.groups}


def test_the_sets_come_from_the_class_file_ids_not_from_node_names() -> None:
    groups = membership(cluster()).groups
    whole = [g for g in groups if g.half_of is None]
    assert sorted((g.size, g.node_names) for g in whole) == [
        (2, ("us-a-0", "us-a-1")), (4, ("alpha", "mid", "us-b-0", "zeta"))]
    four = next(g for g in whole if g.size == 4)
    assert [(s.node_id, s.node_name) for s in four.slots] == [(0, "alpha"), (1, "mid"), (2, "zeta"), (3, "us-b-0")]
    # AWS 1.2: ultraserverId is the capacity block id where there is one, else server_id_4.
    assert four.ultraserver_id == four.capacity_block_id == "cr-0a"
    two = next(g for g in whole if g.size == 2)
    assert two.ultraserver_id != "cr-0a" and two.capacity_block_id is None
    halves = sorted(g.node_names for g in groups if g.half_of == four.server_id)
    assert halves == [("alpha", "mid"), ("us-b-0", "zeta")]
    # No halves of a 2-node set, and no group for the plain trn2 node.
    assert len(groups) == 4 and all("plain" not in g.node_names for g in groups)


def test_group_slices_select_exactly_the_members_in_pools_no_node_can_own() -> None:
    slices = us.desired_slices(membership(cluster()), DRIVER)
    assert len(slices) == 4
    node_pools = {s["spec"]["pool"]["name"] for s in cluster()}
    for s in slices:
        kubeschema.validate(s, "1.34", strict=True)
        spec = s["spec"]
        assert "nodeName" not in spec and spec["driver"] == DRIVER
        assert "/" in spec["pool"]["name"] and spec["pool"]["name"] not in node_pools
        assert spec["pool"]["resourceSliceCount"] == 1
        (device,) = spec["devices"]
        assert "taints" not in device
        # One term (a slice's selector takes exactly one), naming the members by their hostname label.
        (term,) = spec["nodeSelector"]["nodeSelectorTerms"]
        assert term == {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                              "values": us.selected_nodes(spec["nodeSelector"])}]}
        assert us.is_group_slice(s, DRIVER)
    four = next(s for s in slices if s["spec"]["devices"][0]["attributes"]["nodeCount"] == {"int": 4})
    attrs = four["spec"]["devices"][0]["attributes"]
    assert us.selected_nodes(four["spec"]["nodeSelector"]) == ["alpha", "mid", "us-b-0", "zeta"]
    assert attrs["resourceType"] == {"string": "ultraserver"} and attrs["instanceType"] == {"string": "trn2u.48xlarge"}
    assert attrs["capacityBlockId"] == attrs["ultraserverId"] == {"string": "cr-0a"}
    assert attrs["ultraserverMode"] == {"int": 4}
    # Rendering twice gives the same objects: the controller compares, and writes nothing when equal.
    assert [us.slice_content(s) for s in slices] == [us.slice_content(s)
                                                     for s in us.desired_slices(membership(cluster()), DRIVER)]


def test_a_member_that_vanishes_stays_named_and_taints_its_group_until_it_returns() -> None:
    first = us.desired_slices(membership(cluster()), DRIVER)
    without_zeta = [s for s in cluster() if s["spec"]["nodeName"] != "zeta"]
    m = by_pool(membership(without_zeta, previous=first))
    four = next(g for g in m.values() if g.size == 4 and g.half_of is None)
    assert four.node_names == ("alpha", "mid", "us-b-0", "zeta") and four.missing == 1
    assert us.group_taints(four, DRIVER) == [{"key": f"{DRIVER}/member-missing", "value": "1-of-4",
                                              "effect": "NoSchedule"}]
    halves = {g.node_names: g for g in m.values() if g.half_of}
    assert halves[("us-b-0", "zeta")].missing == 1 and halves[("alpha", "mid")].ready
    # Without device taints (before 1.36) the device is withdrawn; the slice stays, so the pool does.
    withdrawn = us.group_slice(four, DRIVER, taints_served=False)
    assert withdrawn["spec"]["devices"] == []
    kubeschema.validate(withdrawn, "1.34", strict=True)
    # A Node that exists but is not Ready counts as missing too.
    not_ready = by_pool(membership(cluster(), ready=["alpha", "mid", "us-b-0", "us-a-0", "us-a-1"]))
    assert not_ready[four.pool_name].missing == 1
    # Back: the taint clears.
    back = by_pool(membership(cluster(), previous=us.desired_slices(membership(without_zeta, first), DRIVER)))
    assert back[four.pool_name].ready and us.group_taints(back[four.pool_name], DRIVER) == []


def test_the_selector_names_the_members_hostname_labels_and_remembers_them() -> None:
    facts, _ = us.member_facts(cluster(), DRIVER)
    labels = {name: f"ip-{i}.ec2.internal" for i, name in enumerate(sorted(facts))}
    m = us.group_ultraservers(facts, hostnames=labels)
    first = us.desired_slices(m, DRIVER)
    four = next(s for s in first if s["spec"]["devices"][0]["attributes"]["nodeCount"] == {"int": 4})
    assert us.selected_nodes(four["spec"]["nodeSelector"]) == sorted(
        labels[n] for n in ("alpha", "mid", "us-b-0", "zeta"))
    # zeta's Node and slices are gone: its hostname comes back from the annotation.
    without = [s for s in cluster() if s["spec"]["nodeName"] != "zeta"]
    facts, _ = us.member_facts(without, DRIVER)
    again = us.desired_slices(us.group_ultraservers(facts, us.previous_groups(first),
                                                    hostnames={k: v for k, v in labels.items() if k != "zeta"}),
                              DRIVER)
    four_again = next(s for s in again if s["spec"]["pool"] == four["spec"]["pool"])
    assert us.selected_nodes(four_again["spec"]["nodeSelector"]) == us.selected_nodes(four["spec"]["nodeSelector"])


def test_a_member_with_an_unhealthy_device_taints_its_group_and_its_half_only() -> None:
    slices = [s for s in cluster() if s["spec"]["nodeName"] != "mid"]
    slices += node_slices("mid", "us-a", 1, block="cr-0a", unhealthy_device="neuron-device-9")
    m = by_pool(membership(slices))
    tainted = {g.node_names: us.group_taints(g, DRIVER) for g in m.values()}
    key = {"key": f"{DRIVER}/unhealthy", "value": "member-unhealthy", "effect": "NoSchedule"}
    assert tainted[("alpha", "mid", "us-b-0", "zeta")] == [key]
    assert tainted[("alpha", "mid")] == [key] and tainted[("us-b-0", "zeta")] == []
    assert tainted[("us-a-0", "us-a-1")] == []


def test_two_nodes_claiming_one_slot_publish_no_group_and_say_why() -> None:
    slices = cluster() + node_slices("impostor", "us-a", 2, block="cr-0a")
    facts, _ = us.member_facts(slices, DRIVER)
    m = us.group_ultraservers(facts)
    assert all("impostor" not in g.node_names and "zeta" not in g.node_names for g in m.groups if g.size == 4
               and g.half_of is None)
    assert any(p.field == "node id" and p.value == 2 and "impostor" in p.allowed for p in m.problems)


@pytest.mark.parametrize(("attribute", "value", "allowed"), [
    ("ultraserverNodeId4", {"int": 7}, "0, 1, 2, 3"),
    ("ultraserverMode", {"int": 3}, "1, 2, 4"),
    ("ultraserverServerId4", {"string": ""}, "a string of 1 to 64 characters"),
])
def test_a_malformed_member_fact_is_refused_naming_the_node_field_and_value(attribute: str, value: Any,
                                                                            allowed: str) -> None:
    slices = copy.deepcopy(node_slices("n1", "us-c", 0))
    node_device = slices[0]["spec"]["devices"][-1]
    node_device["attributes"][attribute] = value
    facts, problems = us.member_facts(slices, DRIVER)
    assert facts == {}
    (p,) = problems
    assert (p.subject, p.field, p.allowed) == ("node n1", attribute, allowed)
    assert str(p).startswith(f"node n1: {attribute}")


def test_only_the_highest_generation_of_a_node_pool_counts() -> None:
    old = node_slices("n1", "us-c", 0)
    new = node_slices("n1", "us-d", 0)
    new[0]["spec"]["pool"]["generation"] = 2
    facts, _ = us.member_facts(old + new, DRIVER)
    assert facts["n1"].server_id_4 == us.member_facts(new, DRIVER)[0]["n1"].server_id_4 != \
        us.member_facts(old, DRIVER)[0]["n1"].server_id_4


def test_an_empty_mode_file_takes_the_catalog_size_and_a_one_node_set_is_its_own_group() -> None:
    facts, _ = us.member_facts(node_slices("a", "us-e", 0, mode=None) + node_slices("b", "us-f", 3, mode=1),
                               DRIVER)
    assert facts["a"].mode is None
    groups = {g.node_names: g for g in us.group_ultraservers(facts).groups if g.half_of is None}
    assert groups[("a",)].size == 4 and groups[("a",)].missing == 3
    assert groups[("b",)].size == 1 and groups[("b",)].ready


def test_taint_times_are_kept_and_ignored_when_comparing() -> None:
    first = us.desired_slices(membership(cluster()), DRIVER)
    without = [s for s in cluster() if s["spec"]["nodeName"] != "zeta"]
    desired = us.desired_slices(membership(without, previous=first), DRIVER)
    stored = copy.deepcopy(desired)
    for s in stored:
        for d in s["spec"]["devices"]:
            for t in d.get("taints", ()):
                t["timeAdded"] = "2026-12-06T05:00:00Z"
    assert [us.slice_content(s) for s in stored] == [us.slice_content(s) for s in desired]
    for d, s in zip(desired, stored, strict=True):
        us.keep_taint_times(d, s)
    assert any(t.get("timeAdded") == "2026-12-06T05:00:00Z" for s in desired for d in s["spec"]["devices"]
               for t in d.get("taints", ()))


def test_server_ids_become_pool_segments_without_collisions() -> None:
    assert us.sanitised_id("abc123") == "abc123"
    assert us.sanitised_id("ABC123") != us.sanitised_id("abc123")
    assert us.sanitised_id("a/b c").startswith("a-b-c-")
    assert us.sanitised_id("---") and len(us.sanitised_id("x" * 400)) <= us.MAX_ID + 11


def test_the_group_class_follows_the_driver_name_and_the_device_class_excludes_groups() -> None:
    assert k8s_names.device_class_names(DRIVER).ultraserver_class == "ultraserver.neuron.aws.com"
    assert k8s_names.ultraserver_class_name("neuron.example.com") == "ultraserver.neuron.example.com"
    whole = k8s_names.device_class_selector(DRIVER, cores=False)
    assert '!= "ultraserver"' in whole and '!= "neuron_core"' in whole
    assert k8s_names.ultraserver_class_selector(DRIVER).endswith('.resourceType == "ultraserver"')


def test_with_shared_counters_a_whole_and_its_halves_are_one_pool_that_consumes_per_slot_counters() -> None:
    """1.36+ (partitionable devices): the 4-node set's pool holds a counter slice (node-0..3, one each) and the
    whole's and halves' slices; the whole consumes all four counters, each half its two slots', so the scheduler
    cannot allocate the whole and a half at once. The 2-node set stays a pool of one slice."""
    m = membership(cluster())
    slices = us.desired_slices(m, DRIVER, counters=True)
    for s in slices:
        kubeschema.validate(s, "1.36", strict=True)
        assert us.is_group_slice(s, DRIVER) and "nodeName" not in s["spec"]
    four = next(g for g in m.groups if g.size == 4 and g.half_of is None)
    pools: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        pools.setdefault(s["spec"]["pool"]["name"], []).append(s)
    assert sorted(len(v) for v in pools.values()) == [1, 4]
    mine = pools[four.pool_name]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in mine} == {4}
    counter, *devices = mine  # the counter slice first: no device is written before the counters it consumes
    assert "devices" not in counter["spec"] and us.selected_nodes(counter["spec"]["nodeSelector"]) == [
        "alpha", "mid", "us-b-0", "zeta"]
    assert counter["spec"]["sharedCounters"] == [{"name": us.COUNTER_SET, "counters": {
        f"node-{i}": {"value": "1"} for i in range(4)}}]
    consumed = {s["spec"]["devices"][0]["name"]: (
        us.selected_nodes(s["spec"]["nodeSelector"]),
        sorted(s["spec"]["devices"][0]["consumesCounters"][0]["counters"]),
        s["spec"]["devices"][0]["attributes"]["nodeCount"]["int"]) for s in devices}
    # slots: alpha 0, mid 1, zeta 2, us-b-0 3
    assert consumed == {us.WHOLE_DEVICE: (["alpha", "mid", "us-b-0", "zeta"], [f"node-{i}" for i in range(4)], 4),
                        f"{us.HALF_DEVICE}-0": (["alpha", "mid"], ["node-0", "node-1"], 2),
                        f"{us.HALF_DEVICE}-1": (["us-b-0", "zeta"], ["node-2", "node-3"], 2)}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    # the whole's slice keeps its name across the change of layout; the 2-node set is as without counters
    plain = us.desired_slices(m, DRIVER)
    whole_name = next(s["metadata"]["name"] for s in devices if s["spec"]["devices"][0]["name"] == us.WHOLE_DEVICE)
    assert whole_name == next(s["metadata"]["name"] for s in plain if s["spec"]["pool"]["name"] == four.pool_name)
    two = [s for s in slices if s["spec"]["pool"]["name"] != four.pool_name]
    assert two == [s for s in plain if s["spec"]["devices"][0]["attributes"]["nodeCount"] == {"int": 2}
                   and s["spec"]["devices"][0]["name"] == us.WHOLE_DEVICE]
    # a member that leaves is remembered from the pool's richest annotation (the halves' name two slots only)
    without_zeta = [s for s in cluster() if s["spec"]["nodeName"] != "zeta"]
    again = membership(without_zeta, previous=slices)
    whole_again = next(g for g in again.groups if g.size == 4 and g.half_of is None)
    assert whole_again.node_names == ("alpha", "mid", "us-b-0", "zeta") and whole_again.missing == 1
    tainted = {s["spec"]["devices"][0]["name"] for s in us.desired_slices(again, DRIVER, counters=True)
               if s["spec"].get("devices") and s["spec"]["devices"][0].get("taints")}
    assert tainted == {us.WHOLE_DEVICE, f"{us.HALF_DEVICE}-1"}


# --- the members' Node labels ---------------------------------------------------------------------------------------

WHOLE, PAIR = k8s_names.ultraserver_label_keys(DRIVER)


def test_members_are_labelled_with_their_sets_id_and_their_pairs_id_and_nothing_else_is() -> None:
    m = membership(cluster())
    labels = us.node_labels(m, DRIVER)
    four = next(g for g in m.groups if g.size == 4)
    halves = {s.node_name: g.server_id for g in m.groups if g.half_of for s in g.slots}
    two = next(g for g in m.groups if g.size == 2 and g.half_of is None)
    assert set(labels) == {"alpha", "mid", "zeta", "us-b-0", "us-a-0", "us-a-1"}  # not the plain trn2 node
    for name in ("alpha", "mid", "zeta", "us-b-0"):
        assert labels[name] == {WHOLE: four.server_id, PAIR: halves[name]}
    # the halves split the set by node id (alpha 0, mid 1 | zeta 2, us-b-0 3): two values, two nodes each
    assert labels["alpha"][PAIR] == labels["mid"][PAIR] != labels["zeta"][PAIR] == labels["us-b-0"][PAIR]
    # a 2-node set: its pair is the set itself (a 2-node job's topology either way)
    assert labels["us-a-0"] == labels["us-a-1"] == {WHOLE: two.server_id, PAIR: two.server_id}
    for values in labels.values():
        assert all(k8s_names.is_label_key(k) and k8s_names.is_label_value(v) for k, v in values.items())


def test_a_one_node_set_has_its_own_whole_label_and_no_pair() -> None:
    facts, _ = us.member_facts(node_slices("b", "us-f", 3, mode=1), DRIVER)
    labels = us.node_labels(us.group_ultraservers(facts), DRIVER)
    assert list(labels["b"]) == [WHOLE]


def test_label_patches_name_only_nodes_that_differ_and_only_the_ultraserver_keys() -> None:
    want = {"a": {WHOLE: "us-1", PAIR: "us-1-0"}, "b": {WHOLE: "us-1", PAIR: "us-1-0"}}
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "a", "labels": {WHOLE: "us-1", PAIR: "us-1-0", "team": "x"}}},  # right: untouched
        {"metadata": {"name": "b", "labels": {WHOLE: "us-9", "team": "x"}}},  # wrong value, pair missing
        {"metadata": {"name": "c", "labels": {WHOLE: "us-1", PAIR: "p"}}},  # no longer a member: removed
        {"metadata": {"name": "d"}},  # never a member: nothing
        {"metadata": {"name": "e", "labels": "not a map"}},  # malformed: treated as none
    ]
    assert us.label_patches(nodes, want, DRIVER) == {"b": {WHOLE: "us-1", PAIR: "us-1-0"},
                                                    "c": {WHOLE: None, PAIR: None}}
    # a custom driver name has its own keys: the default's labels are not its business
    other = k8s_names.ultraserver_label_keys("neuron.example.com")
    assert other == ("neuron.example.com/ultraserver", "neuron.example.com/ultraserver-pair")
    assert us.label_patches(nodes[:1], {}, "neuron.example.com") == {}


@pytest.mark.parametrize("server_id", ["us4-0a1b", "Has Spaces/and:colons", "-edge-", "x" * 80, "é"])
def test_server_ids_become_label_values_without_collisions(server_id: str) -> None:
    value = us.label_value(server_id)
    assert k8s_names.is_label_value(value) and value
    assert value == server_id if k8s_names.is_label_value(server_id) else value != us.label_value(server_id + "!")
