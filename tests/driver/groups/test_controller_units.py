"""The controller's pure parts: who holds a group, which Nodes are Ready, which Node events start a pass."""

from __future__ import annotations

from typing import Any, cast

import pytest

from neuron_dra.driver.groups.controller import ControllerOptions, GroupController, holders, ready_node_names
from neuron_dra.driver.kubeletplugin.toolkit import KubeApi

DRIVER = "neuron.aws.com"


def node(name: str, ready: str | None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_only_nodes_ready_true_count() -> None:
    assert ready_node_names([node("a", "True"), node("b", "False"), node("c", "Unknown"), node("d", None),
                             {"metadata": {"name": "e"}}]) == {"a"}


def test_holders_are_the_claims_allocated_from_a_group_pool_of_this_driver() -> None:
    def claim(name: str, driver: str, pool: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}"},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": pool, "device": "d"}]}}}}
    found = holders([claim("a", DRIVER, "ultraserver-4/x"), claim("b", DRIVER, "node-1"),
                     claim("c", "other.example.com", "ultraserver-4/x"), {"metadata": {"name": "unallocated"}}],
                    DRIVER)
    assert found == {"ultraserver-4/x": [{"namespace": "ml", "name": "a", "uid": "u-a"}]}


def test_node_events_start_a_pass_only_when_readiness_or_existence_changes() -> None:
    c = GroupController(cast(KubeApi, None), ControllerOptions(DRIVER))
    seen = [c._matters("/api/v1/nodes", e) for e in (
        {"type": "ADDED", "object": node("a", "True")},
        {"type": "MODIFIED", "object": node("a", "True")},  # a heartbeat
        {"type": "MODIFIED", "object": node("a", "Unknown")},
        {"type": "MODIFIED", "object": node("a", "Unknown")},
        {"type": "DELETED", "object": node("a", "Unknown")},
        {"type": "DELETED", "object": node("never-seen", "True")},
    )]
    assert seen == [True, False, True, False, True, False]
    assert c._matters("/apis/resource.k8s.io/v1/resourceslices", {"type": "MODIFIED", "object": {}})


@pytest.mark.parametrize(("kwargs", "word"), [({"taint_effect": "Never"}, "taint effect"), ({"resync": 0}, "resync")])
def test_bad_controller_options_are_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ControllerOptions(DRIVER, **kwargs)
