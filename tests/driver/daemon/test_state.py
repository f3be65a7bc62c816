"""Prepare/unprepare logic (DriverState) on emulated hosts, with the claim lookup faked in memory.

The same logic is exercised over the real sockets in test_driver_plugin.py, in a separate process with
kill -9 in test_driver_daemon.py, and against the real API server in test_driver_apiserver.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from neuron_dra.driver.daemon.claims import checkpoint as checkpoint_module
from neuron_dra.driver.daemon.claims.allocation import Reason, allocated_devices
from neuron_dra.driver.daemon.claims.cdi import CDI_KIND, CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, CheckpointError, ClaimState, PreparedClaim
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.daemon.observability.metrics import Metrics
from neuron_dra.driver.kubeletplugin._claimref import Claim, ClaimFailed, ClaimRef
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from tests.support.driver import (
    DRIVER,
    NEURON_CONFIG,
    NODE,
    ULTRASERVER_CONFIG,
    FakeLookup,
    Served,
    claim,
    devices,
    opaque,
    result,
    snapshot,
    uid,
)


@dataclass
class Env:
    state: Served
    lookup: FakeLookup
    root: Path
    cdi: Path
    checkpoint: Path
    metrics: Metrics
    make: Callable[[], Served]  # a fresh DriverState on the same directories (a restart)

    def spec(self, claim_uid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.cdi / f"{DRIVER}_{claim_uid}.json").read_text())
        return data

    def files(self) -> dict[str, bytes]:
        return snapshot(self.cdi, self.checkpoint.parent)


@pytest.fixture
def env_for(tmp_path: Path) -> Callable[..., Env]:
    def make_env(instance_type: str = "trn2.48xlarge", options: EmulationOptions | None = None) -> Env:
        root = emulate(instance_type, tmp_path / "host", options)
        host = discover(root)
        lookup = FakeLookup()
        metrics = Metrics()
        cdi = tmp_path / "cdi"
        cp = tmp_path / "plugin" / "checkpoint.json"
        cp.parent.mkdir(parents=True)

        def make() -> Served:
            s = DriverState(host=host, host_root=root, driver_name=DRIVER, pool_name=NODE,
                            cdi=CdiStore(cdi, DRIVER), checkpoint=Checkpoint(cp), lookup=lookup, metrics=metrics)
            s.load()
            s.reconcile_local()
            return Served(s, lookup)

        return Env(make(), lookup, root, cdi, cp, metrics, make)

    return make_env


def ref(name: str, n: int, namespace: str = "default") -> ClaimRef:
    return ClaimRef(namespace, name, uid(n))


def env_of(spec: dict[str, Any], request: str = "neurons") -> dict[str, str]:
    dev = next(d for d in spec["devices"] if d["name"].endswith(f"-request-{request}"))
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


def ok(results: dict[str, Any], claim_uid: str) -> tuple[Any, ...]:
    r = results[claim_uid]
    assert not isinstance(r, ClaimFailed), r.message
    return tuple(r)


# --- successful prepares ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("indexes", "cores"), [
    ((3,), "12-15"),
    ((4, 5, 6, 7), "16-31"),
    (tuple(range(16)), "0-63"),
])
def test_prepare_1_4_16_devices_on_trn2(env_for: Callable[..., Env], indexes: tuple[int, ...], cores: str) -> None:
    e = env_for("trn2.48xlarge")
    e.lookup.put(claim("c", uid(1), devices(*indexes)))
    answer = ok(e.state.prepare([ref("c", 1)]), uid(1))

    assert [d.device_name for d in answer] == [f"neuron-device-{i}" for i in indexes]
    for d, i in zip(answer, indexes, strict=True):
        assert d.request_names == ("neurons",)
        assert d.pool_name == NODE
        assert d.cdi_device_ids == (f"{CDI_KIND}={uid(1)}-neuron-device-{i}", f"{CDI_KIND}={uid(1)}-request-neurons")
    spec = e.spec(uid(1))
    assert spec["kind"] == CDI_KIND
    assert spec["cdiVersion"] == "0.5.0"  # hostPath (and names starting with a digit) need 0.5.0
    nodes = [n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", ())]
    host = discover(e.root)
    assert nodes == [{"path": f"/dev/neuron{i}", "hostPath": f"/dev/neuron{i}", "type": "c",
                      "major": host.device(i).major, "minor": host.device(i).minor, "permissions": "rw"}
                     for i in indexes]
    assert env_of(spec) == {"NEURON_RT_VISIBLE_CORES": cores, "NEURON_LOGICAL_NC_CONFIG": "2"}
    entry = e.state.prepared()[uid(1)]
    assert entry.state is ClaimState.PREPARE_COMPLETED
    assert entry.neuron_indexes == indexes
    assert e.metrics.prepared_claims._value.get() == 1


def test_lnc_config_per_request_and_class_before_claim(env_for: Callable[..., Env]) -> None:
    e = env_for("trn2.48xlarge")
    results = [*devices(4, 5, request="train"), *devices(9, request="serve")]
    configs = [
        # listed first, but FromClaim overrides FromClass regardless of order
        opaque({**NEURON_CONFIG, "logicalNeuronCore": 1}, requests=["train"], source="FromClaim"),
        opaque({**NEURON_CONFIG, "logicalNeuronCore": 2}, source="FromClass"),
    ]
    e.lookup.put(claim("c", uid(2), results, configs=configs))
    answer = ok(e.state.prepare([ref("c", 2)]), uid(2))
    assert [(d.device_name, d.request_names) for d in answer] == [
        ("neuron-device-4", ("train",)), ("neuron-device-5", ("train",)), ("neuron-device-9", ("serve",))]
    spec = e.spec(uid(2))
    # LNC=1: 8 logical cores per device, device 4 owns 32-39
    assert env_of(spec, "train") == {"NEURON_RT_VISIBLE_CORES": "32-47", "NEURON_LOGICAL_NC_CONFIG": "1"}
    assert env_of(spec, "serve") == {"NEURON_RT_VISIBLE_CORES": "36-39", "NEURON_LOGICAL_NC_CONFIG": "2"}


def test_subrequest_results_answer_base_request_names(env_for: Callable[..., Env]) -> None:
    e = env_for("trn2.48xlarge")
    results = devices(0, 1, request="neurons/two")
    configs = [opaque({**NEURON_CONFIG, "logicalNeuronCore": 1}, requests=["neurons/two"])]
    e.lookup.put(claim("c", uid(3), results, configs=configs))
    answer = ok(e.state.prepare([ref("c", 3)]), uid(3))
    assert {d.request_names for d in answer} == {("neurons",)}
    assert env_of(e.spec(uid(3)))["NEURON_LOGICAL_NC_CONFIG"] == "1"


def test_trn1_has_no_lnc_and_two_cores_per_device(env_for: Callable[..., Env]) -> None:
    e = env_for("trn1.32xlarge")
    e.lookup.put(claim("c", uid(4), devices(2, 3, 6)))
    ok(e.state.prepare([ref("c", 4)]), uid(4))
    assert env_of(e.spec(uid(4))) == {"NEURON_RT_VISIBLE_CORES": "4-7,12-13"}


def test_ultraserver_node_device_gets_all_devices_and_ultraserver_env(env_for: Callable[..., Env]) -> None:
    e = env_for("trn2u.48xlarge", EmulationOptions(host_id="us1", ultraserver_node=3))
    configs = [opaque({**ULTRASERVER_CONFIG, "ultraserverMode": 2})]
    e.lookup.put(claim("c", uid(5), [result("neuron-node")], configs=configs))
    answer = ok(e.state.prepare([ref("c", 5)]), uid(5))
    assert [d.device_name for d in answer] == ["neuron-node"]
    spec = e.spec(uid(5))
    node_dev = next(d for d in spec["devices"] if d["name"] == f"{uid(5)}-neuron-node")
    assert [n["path"] for n in node_dev["containerEdits"]["deviceNodes"]] == [f"/dev/neuron{i}" for i in range(16)]
    klass = e.root / "sys/class/neuron_device"
    assert env_of(spec) == {
        "NEURON_RT_VISIBLE_CORES": "0-63", "NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_ULTRASERVER_MODE": "2",
        "NEURON_RT_ULTRASERVER_SERVER_ID": (klass / "server_id_2").read_text().strip(),
        "NEURON_RT_ULTRASERVER_NODE_ID": "1",  # node 3 of 4 is node 1 of its pair
    }
    assert e.state.prepared()[uid(5)].neuron_indexes == tuple(range(16))


def test_ultraserver_mode_defaults_to_the_hosts_file_read_at_prepare_time(env_for: Callable[..., Env]) -> None:
    e = env_for("trn2u.48xlarge", EmulationOptions(host_id="us2", ultraserver_node=2))
    e.lookup.put(claim("c", uid(6), [result("neuron-node")]))
    ok(e.state.prepare([ref("c", 6)]), uid(6))
    assert env_of(e.spec(uid(6)))["NEURON_RT_ULTRASERVER_MODE"] == "4"
    assert env_of(e.spec(uid(6)))["NEURON_RT_ULTRASERVER_NODE_ID"] == "2"
    (e.root / "sys/class/neuron_device/ultraserver_mode").write_text("1\n")  # operator changed the mode
    e.lookup.put(claim("d", uid(7), [result("neuron-node")]))
    assert e.state.unprepare([ref("c", 6)]) == {uid(6): None}
    ok(e.state.prepare([ref("d", 7)]), uid(7))
    assert env_of(e.spec(uid(7))) == {"NEURON_RT_VISIBLE_CORES": "0-63", "NEURON_LOGICAL_NC_CONFIG": "2",
                                      "NEURON_RT_ULTRASERVER_MODE": "1"}


# --- bad input: a per-claim error, nothing changed ----------------------------------------------------------------

BAD = {
    "not found": (None, Reason.NOT_FOUND, "does not exist"),
    "uid mismatch": (claim("c", uid(99), devices(0)), Reason.UID_MISMATCH, "replaced"),
    "not allocated": (claim("c", uid(10), None), Reason.NOT_ALLOCATED, "status.allocation is not set"),
    "other node": (claim("c", uid(10), devices(0, pool="node-b")), Reason.NOT_FOR_THIS_NODE, "pool node-b"),
    "other driver": (claim("c", uid(10), [result("eth0", driver="dra.net")]), Reason.NOT_FOR_THIS_NODE,
                     "no devices of driver neuron.aws.com (allocated: dra.net/node-a/eth0)"),
    "unknown device": (claim("c", uid(10), devices(0, 16)), Reason.UNKNOWN_DEVICE, "'neuron-device-16'"),
    "no node device on trn2": (claim("c", uid(10), [result("neuron-node")]), Reason.UNKNOWN_DEVICE, "neuron-node"),
    "unknown field": (claim("c", uid(10), devices(0), configs=[opaque({**NEURON_CONFIG, "logicalNeuronCoreCount": 1})]),
                      Reason.BAD_CONFIG, "'logicalNeuronCoreCount'"),
    "bad lnc": (claim("c", uid(10), devices(0), configs=[opaque({**NEURON_CONFIG, "logicalNeuronCore": 4})]),
                Reason.BAD_CONFIG, "allowed: 1 or 2"),
    "unknown kind": (claim("c", uid(10), devices(0), configs=[opaque({**NEURON_CONFIG, "kind": "GpuConfig"})]),
                     Reason.BAD_CONFIG, "NeuronConfig or UltraServerConfig"),
    "ultraserver config on trn2": (claim("c", uid(10), devices(0), configs=[opaque({**ULTRASERVER_CONFIG,
                                                                                      "ultraserverMode": 4})]),
                                   Reason.BAD_CONFIG, "UltraServer instance types only"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_claims_fail_alone_and_change_nothing(env_for: Callable[..., Env], case: str) -> None:
    e = env_for("trn2.48xlarge")
    bad, reason, text = BAD[case]
    e.lookup.put(claim("good", uid(11), devices(7)))
    ok(e.state.prepare([ref("good", 11)]), uid(11))
    if bad is not None:
        e.lookup.put(bad)
    before = e.files()
    results = e.state.prepare([ref("c", 10), ref("good", 11)])
    err = results[uid(10)]
    assert isinstance(err, ClaimFailed)
    assert err.reason == reason
    assert text in err.message
    assert ok(results, uid(11))  # the other claim of the same call is unaffected
    assert e.files() == before
    assert e.metrics.errors.labels("prepare", reason.value)._value.get() == 1


def test_lnc_on_trainium1_is_a_config_error(env_for: Callable[..., Env]) -> None:
    e = env_for("trn1.32xlarge")
    e.lookup.put(claim("c", uid(12), devices(0), configs=[opaque({**NEURON_CONFIG, "logicalNeuronCore": 1})]))
    before = e.files()  # the empty snapshot and journal the load wrote
    err = e.state.prepare([ref("c", 12)])[uid(12)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.BAD_CONFIG
    assert "logicalNeuronCore" in err.message and "Trainium2" in err.message
    assert e.files() == before


def test_invalid_uid_is_refused_before_touching_files(env_for: Callable[..., Env]) -> None:
    e = env_for()
    err = e.state.prepare([ClaimRef("default", "c", "../../etc/passwd")])["../../etc/passwd"]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.INVALID_REQUEST
    assert e.lookup.calls == []


def test_api_error_is_a_per_claim_error(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(13), devices(0)))
    e.lookup.fail = True
    err = e.state.prepare([ref("c", 13)])[uid(13)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.API_ERROR
    e.lookup.fail = False
    assert ok(e.state.prepare([ref("c", 13)]), uid(13))


# --- devices held by other claims ----------------------------------------------------------------------------------

def test_device_of_a_live_claim_is_refused_and_of_a_gone_claim_released(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("a", uid(20), devices(0, 1, 2, 3)))
    ok(e.state.prepare([ref("a", 20)]), uid(20))
    e.lookup.put(claim("b", uid(21), devices(3, 4)))
    before = e.files()
    err = e.state.prepare([ref("b", 21)])[uid(21)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.DEVICE_BUSY
    assert "Neuron device(s) 3" in err.message and "default/a" in err.message
    assert e.files() == before
    # claim a is deleted (its pods gone) but kubelet never unprepared it: b may take the device
    e.lookup.delete("a")
    assert [d.device_name for d in ok(e.state.prepare([ref("b", 21)]), uid(21))] == ["neuron-device-3",
                                                                                       "neuron-device-4"]
    assert set(e.state.prepared()) == {uid(21)}
    assert not (e.cdi / f"{DRIVER}_{uid(20)}.json").exists()


def test_admin_access_devices_do_not_conflict(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("a", uid(22), devices(5)))
    e.lookup.put(claim("mon", uid(23), [result("neuron-device-5", admin=True)]))
    ok(e.state.prepare([ref("a", 22)]), uid(22))
    ok(e.state.prepare([ref("mon", 23)]), uid(23))
    assert e.state.prepared()[uid(23)].neuron_indexes == ()


# --- idempotency, unprepare, restarts -----------------------------------------------------------------------------

def test_repeated_prepare_rewrites_the_spec_and_returns_the_same_answer(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(30), devices(8, 9)))
    first = ok(e.state.prepare([ref("c", 30)]), uid(30))
    spec_file = e.cdi / f"{DRIVER}_{uid(30)}.json"
    content = spec_file.read_bytes()
    spec_file.unlink()  # /var/run/cdi is tmpfs: a reboot wipes it
    calls = len(e.lookup.calls)
    assert ok(e.state.prepare([ref("c", 30)]), uid(30)) == first
    assert spec_file.read_bytes() == content
    assert len(e.lookup.calls) == calls  # answered from the checkpoint


def test_unprepare_removes_spec_and_entry_and_unknown_claims_succeed(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(31), devices(1)))
    ok(e.state.prepare([ref("c", 31)]), uid(31))
    assert e.state.unprepare([ref("c", 31), ref("never", 32)]) == {uid(31): None, uid(32): None}
    assert e.state.prepared() == {}
    assert list(e.cdi.iterdir()) == []
    assert e.metrics.prepared_claims._value.get() == 0


def test_unprepare_after_restart_from_the_checkpoint_alone(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(33), devices(0, 1, 2, 3)))
    ok(e.state.prepare([ref("c", 33)]), uid(33))
    e.state.close()
    e.lookup.delete("c")  # the claim object is gone by the time kubelet unprepares
    e.lookup.fail = True  # and the API server is down: unprepare must not need it
    restarted = e.make()
    assert set(restarted.prepared()) == {uid(33)}
    assert restarted.unprepare([ClaimRef("default", "", uid(33))]) == {uid(33): None}
    assert restarted.prepared() == {}
    assert not (e.cdi / f"{DRIVER}_{uid(33)}.json").exists()


def test_restart_rewrites_lost_specs_and_keeps_answers(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(34), devices(2)))
    answer = ok(e.state.prepare([ref("c", 34)]), uid(34))
    spec_file = e.cdi / f"{DRIVER}_{uid(34)}.json"
    content = spec_file.read_bytes()
    spec_file.unlink()
    restarted = e.make()
    assert spec_file.read_bytes() == content  # rewritten at start, before kubelet asks
    e.lookup.fail = True
    assert ok(restarted.prepare([ref("c", 34)]), uid(34)) == answer


# --- concurrency ---------------------------------------------------------------------------------------------------

def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_prepare_that_was_in_flight_during_unprepare_does_not_complete(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(40), devices(0)))
    entered, release = e.lookup.gate("c")
    t, out = run_in_thread(lambda: e.state.prepare([ref("c", 40)]))
    assert entered.wait(5)
    # kubelet gave up on the slow prepare, the pod went away, kubelet unprepared the claim
    assert e.state.unprepare([ref("c", 40)]) == {uid(40): None}
    release.set()
    t.join(5)
    err = out[0][uid(40)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.UNPREPARED_MEANWHILE
    assert e.state.prepared() == {}
    assert list(e.cdi.iterdir()) == []
    # a prepare that arrives after the unprepare is a new request and succeeds
    del e.lookup.gates["c"]
    assert ok(e.state.prepare([ref("c", 40)]), uid(40))


def test_slow_get_of_one_claim_does_not_stall_another(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("slow", uid(41), devices(0)))
    e.lookup.put(claim("fast", uid(42), devices(1)))
    entered, release = e.lookup.gate("slow")
    t, out = run_in_thread(lambda: e.state.prepare([ref("slow", 41)]))
    assert entered.wait(5)
    # in order: the fast claim's prepare completes while the slow claim's GET is still held at its gate
    fast, fast_out = run_in_thread(lambda: e.state.prepare([ref("fast", 42)]))
    fast.join(30)
    assert not fast.is_alive() and t.is_alive(), "the fast claim's prepare waited for the slow claim's GET"
    assert ok(fast_out[0], uid(42))
    assert e.state.unprepare([ref("fast", 42)]) == {uid(42): None}
    release.set()
    t.join(5)
    assert ok(out[0], uid(41))


def test_claims_of_one_call_are_looked_up_in_parallel(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("a", uid(43), devices(0)))
    e.lookup.put(claim("b", uid(44), devices(1)))
    entered_a, release_a = e.lookup.gate("a")
    entered_b, release_b = e.lookup.gate("b")
    t, out = run_in_thread(lambda: e.state.prepare([ref("a", 43), ref("b", 44)]))
    assert entered_a.wait(5) and entered_b.wait(5)  # both GETs in flight at once
    release_a.set()
    release_b.set()
    t.join(5)
    assert ok(out[0], uid(43)) and ok(out[0], uid(44))


def test_concurrent_prepares_of_one_claim_commit_once(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(45), devices(0, 1)))
    entered, release = e.lookup.gate("c")
    threads = [run_in_thread(lambda: e.state.prepare([ref("c", 45)])) for _ in range(4)]
    assert entered.wait(5)
    time.sleep(0.1)
    release.set()
    answers = set()
    for t, out in threads:
        t.join(5)
        answers.add(ok(out[0], uid(45)))
    assert len(answers) == 1
    assert set(e.state.prepared()) == {uid(45)}


# --- start-up reconciliation ---------------------------------------------------------------------------------------

def started_entry(e: Env, name: str, n: int, index: int) -> PreparedClaim:
    """A PrepareStarted entry as a crash between the two checkpoint writes leaves it (with its CDI spec)."""
    host = discover(e.root)
    allocated = allocated_devices(Claim.checked(ref(name, n), claim(name, uid(n), devices(index))), DRIVER, NODE,
                                  host.spec)
    plan = e.state.plan(ref(name, n), allocated)
    return PreparedClaim(uid(n), "default", name, ClaimState.PREPARE_STARTED, plan.devices, plan.exclusive,
                         plan.cdi_spec, time.time())


def test_reconcile_cleans_unfinished_prepares_of_gone_claims_only(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("done", uid(50), devices(0)))
    ok(e.state.prepare([ref("done", 50)]), uid(50))
    completed = e.state.prepared()[uid(50)]
    gone, alive, unknown = started_entry(e, "gone", 51, 1), started_entry(e, "alive", 52, 2), \
        started_entry(e, "unknown", 53, 3)
    e.lookup.put(claim("alive", uid(52), devices(2)))
    e.lookup.put(claim("unknown", uid(53), devices(3)))
    e.lookup.put(claim("gone", uid(151), devices(1)))  # same name, new claim: the old one is gone
    store = CdiStore(e.cdi, DRIVER)
    for c in (gone, alive, unknown):
        store.write(c.uid, c.cdi_spec)
    Checkpoint(e.checkpoint).save({c.uid: c for c in (completed, gone, alive, unknown)})
    (e.cdi / f"{DRIVER}_{uid(54)}.json").write_text("{}")  # spec written, then killed before any record
    (e.cdi / f"other.driver_{uid(55)}.json").write_text("{}")  # not ours
    (e.cdi / f".{DRIVER}_{uid(56)}.json.tmp-1234abcd").write_text("{")  # interrupted atomic write
    e.lookup.fail = True
    restarted = e.make()
    assert not (e.cdi / f"{DRIVER}_{uid(54)}.json").exists()
    assert (e.cdi / f"other.driver_{uid(55)}.json").exists()
    assert not (e.cdi / f".{DRIVER}_{uid(56)}.json.tmp-1234abcd").exists()
    report = restarted.resolve_unfinished()
    assert set(report.unresolved) == {uid(51), uid(52), uid(53)}  # API down: nothing dropped
    e.lookup.fail = False
    report = restarted.resolve_unfinished()
    assert report.dropped == (uid(51),)
    assert set(report.kept) == {uid(52), uid(53)}
    assert set(restarted.prepared()) == {uid(50), uid(52), uid(53)}
    assert not (e.cdi / f"{DRIVER}_{uid(51)}.json").exists()
    # kubelet's retry completes a kept entry
    assert ok(restarted.prepare([ref("alive", 52)]), uid(52))
    assert restarted.prepared()[uid(52)].state is ClaimState.PREPARE_COMPLETED


def _malformed(name: str, n: int, case: str) -> Any:
    good = claim(name, uid(n), devices(1))
    if case == "allocation a list":
        good["status"]["allocation"] = [good["status"]["allocation"]]
    elif case == "results a string":
        good["status"]["allocation"]["devices"]["results"] = "neuron-device-1"
    elif case == "result a number":
        good["status"]["allocation"]["devices"]["results"] = [7]
    elif case == "device a list":
        good["status"]["allocation"]["devices"]["results"][0]["device"] = ["neuron-device-1"]
    elif case == "adminAccess a string":
        good["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = "yes"
    elif case == "metadata a string":
        good["metadata"] = "default/" + name
    elif case == "status a list":
        good["status"] = []
    elif case == "claim a list":
        return [good]
    elif case == "config requests a string":
        good["status"]["allocation"]["devices"]["config"] = [{**opaque(NEURON_CONFIG), "requests": "neurons"}]
    return good


MALFORMED = {  # case -> the field the error names
    "allocation a list": "status.allocation is [",
    "results a string": "status.allocation.devices.results is 'neuron-device-1' (str); expected a list",
    "result a number": "status.allocation.devices.results[0] is 7 (int); expected an object",
    "device a list": "status.allocation.devices.results[0].device is ['neuron-device-1'] (list); expected a string",
    "adminAccess a string": "status.allocation.devices.results[0].adminAccess is 'yes' (str); expected true or false",
    "metadata a string": "claim.metadata is 'default/c' (str); expected an object",
    "status a list": "claim.status is [] (list); expected an object",
    "claim a list": "the claim is [{",
    "config requests a string": "status.allocation.devices.config[0].requests is 'neurons' (str)",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_claim_is_a_per_claim_error_naming_the_field(env_for: Callable[..., Env], case: str) -> None:
    e = env_for()
    e.lookup.claims[("default", "c")] = _malformed("c", 10, case)
    before = e.files()
    err = e.state.prepare([ref("c", 10)])[uid(10)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.MALFORMED_CLAIM, err
    assert MALFORMED[case] in err.message and len(err.message) < 700
    assert e.files() == before


class RaisingLookup(FakeLookup):
    """Decodes each claim from JSON text as the API client does; deeply nested text raises RecursionError."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}

    def get(self, namespace: str, name: str) -> Any:
        super().get(namespace, name)
        return json.loads(self.texts[name]) if name in self.texts else self.claims.get((namespace, name))


@pytest.mark.parametrize("case", [*sorted(set(MALFORMED) - {"config requests a string"}), "nested 100,000 deep"])
def test_unfinished_prepares_with_malformed_claims_are_kept_not_fatal(env_for: Callable[..., Env], case: str
                                                                       ) -> None:
    """A restart after a crash mid-prepare: the claim's answer is malformed. Checking the unfinished entry
    reports it unresolved (devices kept) and never raises, so the daemon's start-up goes on; the others resolve.
    (Configs play no part in who owns devices, so a malformed config is the prepare's error only.)"""
    e = env_for()
    bad, gone = started_entry(e, "c", 10, 1), started_entry(e, "gone", 11, 2)
    Checkpoint(e.checkpoint).save({c.uid: c for c in (bad, gone)})
    lookup = RaisingLookup()
    if case.startswith("nested"):
        lookup.texts["c"] = '{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    else:
        lookup.claims[("default", "c")] = _malformed("c", 10, case)
    e.lookup = lookup
    restarted = Served(DriverState(host=discover(e.root), host_root=e.root, driver_name=DRIVER, pool_name=NODE,
                                   cdi=CdiStore(e.cdi, DRIVER), checkpoint=Checkpoint(e.checkpoint), lookup=lookup,
                                   metrics=e.metrics), lookup)
    restarted.load()
    report = restarted.resolve_unfinished()
    assert report.unresolved == (uid(10),) and report.dropped == (uid(11),)
    assert set(restarted.prepared()) == {uid(10)}
    # devices held by the unresolved entry stay held: another claim wanting them is told they are busy
    lookup.put(claim("other", uid(12), devices(1)))
    busy = restarted.prepare([ref("other", 12)])[uid(12)]
    assert isinstance(busy, ClaimFailed) and busy.reason == Reason.DEVICE_BUSY


def test_corrupt_checkpoint_refuses_to_load(env_for: Callable[..., Env]) -> None:
    e = env_for()
    e.lookup.put(claim("c", uid(60), devices(0)))
    ok(e.state.prepare([ref("c", 60)]), uid(60))
    e.state.close()  # the claim in the snapshot
    doc = json.loads(e.checkpoint.read_text())
    doc["preparedClaims"][uid(60)]["neuronDevices"] = [5]  # a flipped bit
    e.checkpoint.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="integrity digest mismatch"):
        e.make()


def test_a_call_writes_one_record_and_syncs_at_most_once(env_for: Callable[..., Env],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/durability.md: no more durable I/O per call than the Go example driver (one fsync). A prepare is one
    write of its record (twice in it) and one fdatasync; an unprepare one record and one fdatasync; an unprepare of
    an unknown claim one record (it notes the unprepare for the other instance) and no sync."""
    e = env_for()
    e.lookup.put(claim("c", uid(90), devices(0, 1)))
    calls: list[str] = []
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls.append("pwrite")
        return real_pwrite(fd, data, offset)

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    monkeypatch.setattr(checkpoint_module, "os", SimpleNamespace(**{**vars(os), "pwrite": pwrite,
                                                                    "fdatasync": fdatasync}))
    ok(e.state.prepare([ref("c", 90)]), uid(90))
    assert calls == ["pwrite", "fdatasync"]
    calls.clear()
    ok(e.state.prepare([ref("c", 90)]), uid(90))  # repeated: answered from the records
    assert calls == []
    assert e.state.unprepare([ref("c", 90)]) == {uid(90): None}
    assert calls == ["pwrite", "fdatasync"]
    calls.clear()
    assert e.state.unprepare([ref("c", 90)]) == {uid(90): None}
    assert calls == ["pwrite"]
