"""Attribution series (driver/daemon/observability/attribution.py): which pod holds which devices and cores,
read from the prepared claims at every scrape, through prepare, unprepare and a restart from the checkpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_dra.driver.daemon.claims.allocation import consumer_pods
from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import MAX_CONSUMERS, Checkpoint, ClaimState, PreparedClaim
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.daemon.observability.consumers import ConsumerRefresher
from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.kubeletplugin._claimref import ClaimFailed, ClaimRef
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.partitions import CoreLayout
from tests.support.driver import DRIVER, NEURON_CONFIG, NODE, FakeLookup, Served, claim, devices, opaque, result, uid

Labels = frozenset[tuple[str, str]]


def reserved(c: dict[str, Any], *pods: str) -> dict[str, Any]:
    c["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    return c


class Node:
    """A DriverState on an emulated trn2 (LNC 2: 4 NeuronCores per device) with the attribution collector."""

    def __init__(self, tmp: Path, max_series: int | None = None) -> None:
        self.root = emulate("trn2.48xlarge", tmp / "host")
        self.host = discover(self.root)
        self.lookup = FakeLookup()
        self.tmp = tmp
        self.taints: dict[str, tuple[Mapping[str, str], ...]] = {}
        self.max_series = max_series
        self.restart()

    def restart(self) -> None:
        self.metrics = Metrics()
        self.state = Served(DriverState(host=self.host, host_root=self.root, driver_name=DRIVER, pool_name=NODE,
                                        cdi=CdiStore(self.tmp / "cdi", DRIVER),
                                        checkpoint=Checkpoint(self.tmp / "plugin" / "checkpoint.json"),
                                        lookup=self.lookup, metrics=self.metrics), self.lookup)
        (self.tmp / "plugin").mkdir(exist_ok=True)
        self.state.load()
        self.state.reconcile_local()
        self.refresher = ConsumerRefresher(self.state.prepared, self.lookup, max_per_round=2)
        collector = self.metrics.attribute(self.state.prepared, NODE, [d.index for d in self.host.devices],
                                           self.state.cores, lambda: self.taints, self.refresher.current)
        if self.max_series is not None:
            collector._max_series = self.max_series

    def prepare(self, c: dict[str, Any]) -> None:
        self.lookup.put(c)
        meta = c["metadata"]
        r = self.state.prepare([ClaimRef(meta["namespace"], meta["name"], meta["uid"])])[meta["uid"]]
        assert not isinstance(r, ClaimFailed), r.message

    def series(self, name: str) -> dict[Labels, float]:
        text = generate_latest(self.metrics.registry).decode()
        out: dict[Labels, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name:
                    out[frozenset(s.labels.items())] = s.value
        return out

    def rows(self, name: str, *keys: str) -> set[tuple[str, ...]]:
        return {tuple(dict(labels)[k] for k in keys) for labels in self.series(name)}


def test_each_pod_of_a_claim_gets_its_devices_and_cores(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.prepare(reserved(claim("train", uid(1), devices(3, 4), namespace="ml"), "worker-0", "worker-1"))

    keys = ("namespace", "pod", "claim", "request", "device", "neuroncores", "node")
    assert n.rows("neuron_dra_claim_device_info", *keys) == {
        ("ml", pod, "train", "neurons", f"neuron-device-{d}", cores, NODE)
        for pod in ("worker-0", "worker-1") for d, cores in ((3, "12-15"), (4, "16-19"))}
    assert n.rows("neuron_dra_claim_neuroncore_info", "pod", "device", "neuroncore") == {
        (pod, f"neuron-device-{d}", str(c))
        for pod in ("worker-0", "worker-1") for d in (3, 4) for c in range(4 * d, 4 * d + 4)}
    assert n.series("neuron_dra_node_devices") == {
        frozenset({("node", NODE), ("state", "allocated")}): 2, frozenset({("node", NODE), ("state", "free")}): 14}
    assert n.series("neuron_dra_node_neuroncores") == {
        frozenset({("node", NODE), ("state", "allocated")}): 8, frozenset({("node", NODE), ("state", "free")}): 56}


def test_series_follow_unprepare_and_come_back_from_the_checkpoint_after_a_restart(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.prepare(reserved(claim("a", uid(1), devices(0)), "pod-a"))
    n.prepare(reserved(claim("b", uid(2), devices(1)), "pod-b"))
    assert n.rows("neuron_dra_claim_device_info", "pod", "device") == {("pod-a", "neuron-device-0"),
                                                                        ("pod-b", "neuron-device-1")}

    n.state.unprepare([ClaimRef("default", "a", uid(1))])
    assert n.rows("neuron_dra_claim_device_info", "pod", "device") == {("pod-b", "neuron-device-1")}
    assert n.rows("neuron_dra_claim_neuroncore_info", "neuroncore") == {("4",), ("5",), ("6",), ("7",)}

    n.state.close()
    n.lookup.claims.clear()  # the restart reads the checkpoint only
    n.restart()
    assert n.rows("neuron_dra_claim_device_info", "pod", "claim", "device", "neuroncores") == {
        ("pod-b", "b", "neuron-device-1", "4-7")}


def test_a_core_device_names_its_own_neuroncore(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.prepare(reserved(claim("small", uid(1), [result("neuron-device-2-core-1", "cores")]), "infer"))

    assert n.rows("neuron_dra_claim_device_info", "request", "device", "neuroncores") == {
        ("cores", "neuron-device-2-core-1", "9")}
    assert n.rows("neuron_dra_claim_neuroncore_info", "neuroncore") == {("9",)}
    allocated = {dict(k)["state"]: v for k, v in n.series("neuron_dra_node_neuroncores").items()}
    assert allocated == {"allocated": 1, "free": 63}
    # The device is busy (one of its cores is held), the node counts it allocated.
    assert {dict(k)["state"]: v for k, v in n.series("neuron_dra_node_devices").items()} == {"allocated": 1,
                                                                                            "free": 15}


def test_a_claim_without_pods_is_attributed_to_no_pod(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.prepare(claim("lonely", uid(1), devices(5)))
    assert n.rows("neuron_dra_claim_device_info", "pod", "device") == {("", "neuron-device-5")}


def test_pods_beyond_the_recorded_limit_are_counted_not_named(tmp_path: Path) -> None:
    n = Node(tmp_path)
    pods = [f"p-{i}" for i in range(MAX_CONSUMERS + 5)]
    n.prepare(reserved(claim("shared", uid(1), devices(0)), *pods))
    assert n.rows("neuron_dra_claim_device_info", "pod") == {(p,) for p in pods[:MAX_CONSUMERS]}
    assert list(n.series("neuron_dra_attribution_pods_omitted").values()) == [5]


def test_the_series_cap_drops_and_counts(tmp_path: Path) -> None:
    n = Node(tmp_path, max_series=12)  # room for two devices with their 4 cores each (5 series per device)
    n.prepare(reserved(claim("big", uid(1), devices(0, 1, 2)), "w"))
    assert len(n.series("neuron_dra_claim_device_info")) == 2
    assert len(n.series("neuron_dra_claim_neuroncore_info")) == 8
    assert list(n.series("neuron_dra_attribution_series_dropped").values()) == [5]


def test_taints_per_device(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.taints = {"neuron-device-7": ({"key": f"{DRIVER}/unhealthy", "value": "sram-ecc", "effect": "NoSchedule"},)}
    tainted = {dict(k)["device"]: v for k, v in n.series("neuron_dra_device_tainted").items()}
    assert tainted == {f"neuron-device-{i}": (1 if i == 7 else 0) for i in range(16)}
    assert n.rows("neuron_dra_device_taint_info", "device", "key", "effect") == {
        ("neuron-device-7", f"{DRIVER}/unhealthy", "NoSchedule")}


def test_pending_and_prepared_claims(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.prepare(reserved(claim("done", uid(1), devices(0)), "p"))
    started = PreparedClaim(uid(2), "default", "half", ClaimState.PREPARE_STARTED, (), (1,), "{}", 0.0)
    n.state._claims = {**n.state._claims, uid(2): started}
    assert {dict(k)["state"]: v for k, v in n.series("neuron_dra_claims").items()} == {"prepared": 1, "pending": 1}
    # A pending prepare holds its devices (they count allocated) but names no pod yet.
    assert {dict(k)["state"]: v for k, v in n.series("neuron_dra_node_devices").items()}["allocated"] == 2
    assert n.rows("neuron_dra_claim_device_info", "claim") == {("done",)}


def test_consumer_pods_reads_reserved_for_leniently() -> None:
    c = claim("c", uid(1), devices(0))
    c["status"]["reservedFor"] = [
        {"resource": "pods", "name": "a", "uid": "1"},
        {"resource": "pods", "name": "a", "uid": "1"},  # listed twice: named once
        {"resource": "workloads", "apiGroup": "scheduling.k8s.io", "name": "w", "uid": "2"},
        {"resource": "pods", "name": 7},
        "junk",
        {"resource": "pods", "name": "b", "uid": "3"},
    ]
    assert consumer_pods(c, 8) == (("a", "b"), 0)
    assert consumer_pods(c, 1) == (("a",), 1)
    assert consumer_pods({"status": {"reservedFor": "nope"}}, 8) == ((), 0)


def test_checkpoint_keeps_consumers_and_refuses_bad_ones(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    entry = PreparedClaim(uid(1), "ns", "c", ClaimState.PREPARE_COMPLETED, (), (0,), "{}", 1.0, (0, 1),
                          ("p1", "p2"), 3)
    cp.save({uid(1): entry})
    cp.close()
    assert Checkpoint(tmp_path / "checkpoint.json").load()[uid(1)] == entry
    assert entry.with_state(ClaimState.PREPARE_STARTED).consumers == ("p1", "p2")

    for bad in ([7], ["x" * 254], [f"p{i}" for i in range(MAX_CONSUMERS + 1)]):
        doc = entry.to_json() | {"consumers": bad}
        with pytest.raises((ValueError, TypeError)):
            PreparedClaim.from_json(uid(1), doc)


def test_logical_cores_of_every_device_kind() -> None:
    from neuron_dra.driver.daemon.observability.attribution import NodeDevices
    from neuron_dra.driver.model.catalog import CATALOG

    layout = CoreLayout.for_spec(CATALOG["trn2.48xlarge"], 1)
    nd = NodeDevices(tuple(range(16)), layout)
    assert nd.logical_cores("neuron-device-1") == tuple(range(8, 16))
    assert nd.logical_cores("neuron-device-1-core-3") == (11,)
    assert nd.logical_cores("neuron-node") == tuple(range(128))
    assert nd.logical_cores("something-else") == ()


def test_a_pod_joining_a_shared_claim_later_is_named_after_a_refresh(tmp_path: Path) -> None:
    n = Node(tmp_path)
    shared = reserved(claim("shared", uid(1), devices(6)), "first")
    n.prepare(shared)
    assert n.rows("neuron_dra_claim_device_info", "pod") == {("first",)}
    reserved(shared, "first", "second")  # kubelet does not prepare the claim again for the second pod
    n.refresher.refresh_once()
    assert n.rows("neuron_dra_claim_device_info", "pod") == {("first",), ("second",)}
    reserved(shared, "second")  # the first pod is done
    n.refresher.refresh_once()
    assert n.rows("neuron_dra_claim_device_info", "pod") == {("second",)}


def test_refresh_ignores_replaced_claims_and_failures_and_goes_round_robin(tmp_path: Path) -> None:
    n = Node(tmp_path)
    for i in range(1, 4):
        n.prepare(reserved(claim(f"c{i}", uid(i), devices(i)), f"p{i}"))
    for i in range(1, 4):
        reserved(n.lookup.claims[("default", f"c{i}")], f"p{i}", f"q{i}")
    n.lookup.calls.clear()
    n.refresher.refresh_once()  # two claims a round
    n.refresher.refresh_once()
    assert sorted(set(n.lookup.calls)) == [("default", "c1"), ("default", "c2"), ("default", "c3")]
    assert n.rows("neuron_dra_claim_device_info", "pod") >= {("q1",), ("q2",), ("q3",)}

    n.lookup.put(reserved(claim("c1", uid(9), devices(1)), "impostor"))  # deleted and made again: another uid
    n.lookup.fail = True
    n.refresher.refresh_once()  # c2, c3 fail: their last answers stay
    n.lookup.fail = False
    for _ in range(2):
        n.refresher.refresh_once()
    pods = n.rows("neuron_dra_claim_device_info", "claim", "pod")
    assert ("c1", "impostor") not in pods and ("c1", "p1") in pods  # the checkpoint's pods for c1 again
    assert {("c2", "q2"), ("c3", "q3")} <= pods

    n.state.unprepare([ClaimRef("default", "c2", uid(2))])
    n.refresher.refresh_once()
    assert uid(2) not in n.refresher.current()


def test_a_claim_at_its_own_lnc_is_labelled_with_the_cores_its_container_sees(tmp_path: Path) -> None:
    n = Node(tmp_path)  # the node at LNC 2: 4 cores per device
    n.prepare(reserved(claim("lnc1", uid(1), devices(3), configs=[opaque({**NEURON_CONFIG, "logicalNeuronCore": 1})]),
                       "p"))
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_{uid(1)}.json").read_text())
    env = [e for d in spec["devices"] for e in d.get("containerEdits", {}).get("env", [])]
    assert "NEURON_RT_VISIBLE_CORES=24-31" in env
    assert n.rows("neuron_dra_claim_device_info", "neuroncores") == {("24-31",)}
    assert len(n.series("neuron_dra_claim_neuroncore_info")) == 8


def admin_results(*indexes: int, request: str = "neuron") -> list[dict[str, Any]]:
    """neuron-monitor's claim (deploy/exporter.py): whole devices with admin access."""
    return [result(f"neuron-device-{i}", request, admin=True) for i in indexes]


def test_an_admin_access_claim_is_prepared_beside_the_holder_and_attributed_to_no_pod(tmp_path: Path) -> None:
    n = Node(tmp_path)
    every = range(16)
    n.prepare(reserved(claim("train", uid(1), devices(*every), namespace="ml"), "worker"))
    # neuron-monitor's claim on the same devices: prepared (no DEVICE_BUSY), every device node in its CDI spec.
    n.prepare(reserved(claim("monitor", uid(2), admin_results(*every), namespace="neuron-dra-driver"), "monitor-x"))
    spec = json.loads(n.state.prepared()[uid(2)].cdi_spec)
    nodes = {d["path"] for dev in spec["devices"] for d in dev.get("containerEdits", {}).get("deviceNodes", [])}
    assert nodes == {f"/dev/neuron{i}" for i in every}

    def holders() -> set[tuple[str, ...]]:
        return n.rows("neuron_dra_claim_device_info", "pod", "device") | n.rows(
            "neuron_dra_claim_neuroncore_info", "pod", "device")

    assert {pod for pod, _ in holders()} == {"worker"}
    allocated = frozenset({("node", NODE), ("state", "allocated")})
    assert n.series("neuron_dra_node_devices")[allocated] == 16

    # The holder gone: nothing is held, whatever the monitor's claim was prepared for; a new holder prepares.
    n.state.unprepare([ClaimRef("ml", "train", uid(1))])
    assert not holders()
    assert n.series("neuron_dra_node_devices")[allocated] == 0
    assert n.series("neuron_dra_node_neuroncores")[allocated] == 0
    n.prepare(reserved(claim("next", uid(3), devices(0)), "pod-next"))
    # A claim mixing a held device and an admin-access one: only the held one is attributed.
    n.prepare(reserved(claim("mixed", uid(4), [*devices(1), *admin_results(0, request="look")]), "pod-mixed"))
    n.state.close()
    n.lookup.claims.clear()  # the restart reads the checkpoint only
    n.restart()
    assert holders() == {("pod-next", "neuron-device-0"), ("pod-mixed", "neuron-device-1")}
    assert n.series("neuron_dra_node_devices")[allocated] == 2
