"""The controller's pure parts: who holds a group, which Nodes are Ready, which Node events start a pass."""

from __future__ import annotations

import copy
import logging
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
    from neuron_dra.driver.kubeletplugin.toolkit import ApiException

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


class _Cluster:
    """A stand-in for the API server's lists and writes, enough for whole passes (the real server, the real
    patch and the node policy: test_controller_apiserver.py): Nodes and slices served from memory, merge patches
    applied to the stored Node's labels, or refused while `refuse` is set."""

    def __init__(self, slices: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        self.slices, self.nodes = slices, {n["metadata"]["name"]: n for n in nodes}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.refuse: Exception | None = None

    def list(self, path: str, query: Any = None) -> dict[str, Any]:
        items = list(self.nodes.values()) if path == "/api/v1/nodes" else self.slices
        return {"items": copy.deepcopy(items), "metadata": {"resourceVersion": "1"}}

    def call(self, method: str, path: str, *, query: Any = None, body: Any = None) -> dict[str, Any]:
        if method == "POST" and body and body.get("kind") == "ResourceSlice":
            self.slices.append(body)
        return copy.deepcopy(body) if body else {}

    def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((path, body))
        if self.refuse is not None:
            raise self.refuse
        node = self.nodes[path.rsplit("/", 1)[1]]
        labels = node["metadata"].setdefault("labels", {})
        for k, v in body["metadata"]["labels"].items():
            if v is None:
                labels.pop(k, None)
            else:
                labels[k] = v
        return node


def test_members_are_labelled_once_corrected_and_unlabelled_and_a_refused_patch_is_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    from neuron_dra.driver.kubeletplugin.toolkit import ApiException
    from neuron_dra.driver.model.k8s_names import ultraserver_label_keys
    from tests.driver.model.test_ultraserver import cluster

    whole, pair = ultraserver_label_keys(DRIVER)
    names = ("zeta", "alpha", "us-b-0", "mid", "us-a-0", "us-a-1", "plain")
    nodes = [node(n, "True") for n in names]
    nodes[-1]["metadata"]["labels"] = {whole: "stale", "team": "ml"}  # not a member: its stale label goes
    api = _Cluster(cluster(), nodes)
    controller = GroupController(cast(KubeApi, api), ControllerOptions(DRIVER))
    first = controller.reconcile()
    assert (first.labelled, first.label_failures) == (7, 0)
    labels = {n: api.nodes[n]["metadata"].get("labels", {}) for n in names}
    assert labels["plain"] == {"team": "ml"}
    assert len({labels[n][whole] for n in ("zeta", "alpha", "us-b-0", "mid")}) == 1
    assert labels["us-a-0"] == labels["us-a-1"] and labels["us-a-0"][pair] == labels["us-a-0"][whole]
    # every patch names the two keys only, under metadata.labels
    assert all(set(b) == {"metadata"} and set(b["metadata"]) == {"labels"} and set(b["metadata"]["labels"]) <=
               {whole, pair} for _, b in api.patches)

    # nothing changed: nothing patched, by this controller or a restarted one (a new leader)
    api.patches.clear()
    assert controller.reconcile().labelled == 0
    assert GroupController(cast(KubeApi, api), ControllerOptions(DRIVER)).reconcile().labelled == 0
    assert api.patches == []

    # someone writes a wrong value: corrected, that node only
    api.nodes["mid"]["metadata"]["labels"][whole] = "wrong"
    assert controller.reconcile().labelled == 1 and [p for p, _ in api.patches] == ["/api/v1/nodes/mid"]

    # refused (an old ClusterRole without patch): the pass goes on, one warning while it lasts
    api.nodes["mid"]["metadata"]["labels"][whole] = "wrong"
    api.refuse = ApiException(403, "Forbidden", "{}")
    caplog.set_level(logging.WARNING)
    results = [controller.reconcile() for _ in range(3)]
    assert [(r.labelled, r.label_failures) for r in results] == [(0, 1)] * 3
    warned = [r for r in caplog.records if "could not label" in r.getMessage()]
    assert len(warned) == 1 and warned[0].__dict__["first"] == "mid"
    api.refuse = None
    assert controller.reconcile().labelled == 1 and api.nodes["mid"]["metadata"]["labels"][whole] != "wrong"


def test_a_node_event_that_changes_an_ultraserver_label_starts_a_pass() -> None:
    from neuron_dra.driver.model.k8s_names import ultraserver_label_keys

    whole, _ = ultraserver_label_keys(DRIVER)
    c = GroupController(cast(KubeApi, None), ControllerOptions(DRIVER))
    labelled = node("a", "True")
    labelled["metadata"]["labels"] = {whole: "us-1", "other": "x"}
    other = copy.deepcopy(labelled)
    other["metadata"]["labels"]["other"] = "y"
    seen = [c._matters("/api/v1/nodes", {"type": "MODIFIED", "object": o})
            for o in (node("a", "True"), labelled, other)]
    assert seen == [True, True, False]  # other labels are not the controller's business
