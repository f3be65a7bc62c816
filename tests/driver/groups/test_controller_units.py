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


@pytest.mark.parametrize(("kwargs", "word"), [({"taint_effect": "Never"}, "taint effect"), ({"resync": 0}, "resync"),
                                               ({"shared_counters": "on"}, "shared counters")])
def test_bad_controller_options_are_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ControllerOptions(DRIVER, **kwargs)


class _Answers:
    """A stand-in for the API client's one call the probe makes (the served case runs against a real API server
    in test_controller_apiserver.py): answers as a 1.34/1.35 server (fields dropped) or refuses."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, Any, Any]] = []

    def list(self, path: str, query: Any = None) -> dict[str, Any]:
        return {"items": [], "metadata": {}}

    def call(self, method: str, path: str, *, query: Any = None, body: Any = None) -> dict[str, Any]:
        self.calls.append((method, path, query, body))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_counter_probe_is_a_dry_run_and_falls_back_when_counters_are_dropped_or_refused() -> None:
    from neuron_dra.driver.kubeletplugin import ApiException

    dropped = _Answers({"spec": {"driver": DRIVER}})  # what a server without DRAPartitionableDevices keeps
    assert GroupController(cast(KubeApi, dropped), ControllerOptions(DRIVER)).probe_counters() is False
    ((method, _, query, body),) = dropped.calls
    assert method == "POST" and query == {"dryRun": "All"} and body["spec"]["sharedCounters"]
    kept = _Answers({"spec": {"sharedCounters": body["spec"]["sharedCounters"]}})
    assert GroupController(cast(KubeApi, kept), ControllerOptions(DRIVER)).probe_counters() is True
    refused = _Answers(ApiException(403, "Forbidden", "{}"))
    assert GroupController(cast(KubeApi, refused), ControllerOptions(DRIVER)).probe_counters() is False


def test_with_shared_counters_off_the_controller_never_probes_and_publishes_one_pool_per_group() -> None:
    api = _Answers({"spec": {"sharedCounters": [{"name": "members"}]}})
    controller = GroupController(cast(KubeApi, api), ControllerOptions(DRIVER, shared_counters="off"))
    assert controller.reconcile().writes == 0 and controller.counters_served is False and api.calls == []
