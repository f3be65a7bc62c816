"""Prepare of an UltraServer group claim on a member node (docs/ultraserver.md §6): the membership checks, the
UltraServer environment through the claim's CDI spec, and unprepare/restart/checkpoint like any claim."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon.claims.allocation import Reason, allocated_devices
from neuron_dra.driver.daemon.claims.cdi import CDI_KIND, CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, ClaimState, PreparedClaim
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin._claimref import Claim, ClaimFailed, ClaimRef
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.discovery import discover, read_ultraserver
from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from tests.support.driver import (
    DRIVER,
    NODE,
    ULTRASERVER_CONFIG,
    FakeLookup,
    Served,
    claim,
    devices,
    opaque,
    result,
    uid,
)


def _state(tmp_path: Path, lookup: FakeLookup, options: EmulationOptions, instance_type: str = "trn2u.48xlarge"
           ) -> tuple[Served, Path]:
    root = tmp_path / "host"
    if not root.exists():
        emulate(instance_type, root, options)
    cp = tmp_path / "plugin" / "checkpoint.json"
    cp.parent.mkdir(parents=True, exist_ok=True)
    s = DriverState(host=discover(root), host_root=root, driver_name=DRIVER, pool_name=NODE,
                    cdi=CdiStore(tmp_path / "cdi", DRIVER), checkpoint=Checkpoint(cp), lookup=lookup)
    s.load()
    s.reconcile_local()
    return Served(s, lookup), root


def _group_claim(name: str, n: int, pool: str, members: list[str], device: str = us.WHOLE_DEVICE,
                 configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c = claim(name, uid(n), [result(device, "ultraserver", pool=pool)], configs=configs or [])
    c["status"]["allocation"]["nodeSelector"] = us.node_selector(members)
    return c


def _pool(root: Path, size: int) -> str:
    host = read_ultraserver(root)
    assert host is not None
    own = {4: host.server_id_4, 2: host.server_id_2, 1: f"{host.server_id_4}.{host.node_id_4}"}[size]
    return f"{us.POOL_PREFIX}{size}/{us.sanitised_id(own)}"


def _env(tmp_path: Path, claim_uid: str) -> dict[str, str]:
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_{claim_uid}.json").read_text())
    (dev,) = [d for d in spec["devices"] if "-ultraserver-" in d["name"]]
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


@pytest.mark.parametrize(("size", "position", "device", "ids"), [
    (4, 3, us.WHOLE_DEVICE, ("server_id_4", "3")),
    (2, 3, us.HALF_DEVICE, ("server_id_2", "1")),  # the second half of a 4-node set: node 1 of its pair
    (2, 1, us.WHOLE_DEVICE, ("server_id_2", "1")),  # a 2-node set
    (1, 0, us.WHOLE_DEVICE, None),
])
def test_a_member_gets_the_ultraserver_env_of_its_group(tmp_path: Path, size: int, position: int, device: str,
                                                        ids: tuple[str, str] | None) -> None:
    lookup = FakeLookup()
    state, root = _state(tmp_path, lookup, EmulationOptions(host_id="h", ultraserver_id="us-a",
                                                            ultraserver_node=position, ultraserver_mode=size))
    pool = _pool(root, size)
    lookup.put(_group_claim("job", 1, pool, ["other-node", NODE], device))
    answer = state.prepare([ClaimRef("default", "job", uid(1))])[uid(1)]
    assert not isinstance(answer, ClaimFailed), answer.message
    (prepared,) = answer
    assert (prepared.pool_name, prepared.device_name, prepared.request_names) == (pool, device, ("ultraserver",))
    assert prepared.cdi_device_ids == (f"{CDI_KIND}={uid(1)}-ultraserver-ultraserver",)
    expected = {"NEURON_RT_ULTRASERVER_MODE": str(size)}
    if ids is not None:
        klass = root / "sys/class/neuron_device"
        expected |= {"NEURON_RT_ULTRASERVER_SERVER_ID": (klass / ids[0]).read_text().strip(),
                     "NEURON_RT_ULTRASERVER_NODE_ID": ids[1]}
    assert _env(tmp_path, uid(1)) == expected
    entry = state.prepared()[uid(1)]
    assert entry.neuron_indexes == () and entry.neuron_cores == ()  # holds no device: shares nothing of the node


def test_group_claim_survives_restart_and_unprepares_like_any_claim(tmp_path: Path) -> None:
    lookup = FakeLookup()
    options = EmulationOptions(host_id="h", ultraserver_id="us-b", ultraserver_node=1)
    state, root = _state(tmp_path, lookup, options)
    pool = _pool(root, 4)
    lookup.put(_group_claim("job", 2, pool, [NODE]))
    lookup.put(claim("mine", uid(3), devices(*range(16), request="neurons")))
    first = state.prepare([ClaimRef("default", "job", uid(2)), ClaimRef("default", "mine", uid(3))])
    assert not any(isinstance(r, ClaimFailed) for r in first.values())
    spec_file = tmp_path / "cdi" / f"{DRIVER}_{uid(2)}.json"
    text = spec_file.read_text()
    spec_file.unlink()  # /var/run/cdi is tmpfs: gone after a reboot
    restarted, _ = _state(tmp_path, lookup, options)  # a new process reads the checkpoint, group pool included
    assert spec_file.read_text() == text
    assert restarted.prepared()[uid(2)].devices == first[uid(2)]
    del lookup.claims[("default", "job")]  # the job is gone: unprepare needs nothing from the API server
    assert restarted.unprepare([ClaimRef("default", "job", uid(2))]) == {uid(2): None}
    assert not spec_file.exists() and uid(2) not in restarted.prepared() and uid(3) in restarted.prepared()


Make = Callable[[Path], dict[str, Any]]
REFUSED: dict[str, tuple[Make, Reason, str]] = {
    "node not in the selector": (lambda root: _group_claim("job", 4, _pool(root, 4), ["n1", "n2"]),
                                 Reason.NOT_FOR_THIS_NODE, f"node {NODE} is not a member of UltraServer group"),
    "no selector at all": (lambda root: claim("job", uid(4), [result(us.WHOLE_DEVICE, "ultraserver",
                                                                      pool=_pool(root, 4))]),
                           Reason.NOT_FOR_THIS_NODE, "names none"),
    "another UltraServer's group": (lambda root: _group_claim("job", 4, "ultraserver-4/0123456789ab", [NODE]),
                                    Reason.NOT_FOR_THIS_NODE, "not the group's '0123456789ab': not a member"),
    "the other half": (lambda root: _group_claim("job", 4, "ultraserver-2/x-1", [NODE], us.HALF_DEVICE),
                       Reason.NOT_FOR_THIS_NODE, "2-node set is"),
    "a mode other than the group's": (lambda root: _group_claim(
        "job", 4, _pool(root, 4), [NODE], configs=[opaque({**ULTRASERVER_CONFIG, "ultraserverMode": 2})]),
        Reason.BAD_CONFIG, "ultraserverMode 2 is not allowed; allowed: 4"),
    "a selector of the wrong shape": (lambda root: {**_group_claim("job", 4, _pool(root, 4), [NODE]), "status": {
        "allocation": {**_group_claim("job", 4, _pool(root, 4), [NODE])["status"]["allocation"],
                       "nodeSelector": {"nodeSelectorTerms": ["x"]}}}},
        Reason.MALFORMED_CLAIM, "status.allocation.nodeSelector"),
    "a half of size 4 is no group": (lambda root: _group_claim("job", 4, _pool(root, 4), [NODE], us.HALF_DEVICE),
                                     Reason.NOT_FOR_THIS_NODE, "not to this node's pool"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_non_member_is_refused_with_a_clear_error(tmp_path: Path, case: str) -> None:
    make, reason, text = REFUSED[case]
    lookup = FakeLookup()
    state, root = _state(tmp_path, lookup, EmulationOptions(host_id="h", ultraserver_id="us-c", ultraserver_node=2))
    lookup.put(make(root))
    answer = state.prepare([ClaimRef("default", "job", uid(4))])[uid(4)]
    assert isinstance(answer, ClaimFailed) and answer.reason == reason, answer
    assert text in answer.message
    assert state.prepared() == {} and not (tmp_path / "cdi" / f"{DRIVER}_{uid(4)}.json").exists()


def test_a_host_without_ultraserver_files_is_no_member(tmp_path: Path) -> None:
    lookup = FakeLookup()
    state, _ = _state(tmp_path, lookup, EmulationOptions(host_id="h"), "trn2.48xlarge")
    lookup.put(_group_claim("job", 5, "ultraserver-4/abc", [NODE]))
    answer = state.prepare([ClaimRef("default", "job", uid(5))])[uid(5)]
    assert isinstance(answer, ClaimFailed) and answer.reason == Reason.NOT_FOR_THIS_NODE
    assert "no UltraServer class files" in answer.message


def test_emulated_hosts_with_one_seed_form_one_ultraserver(tmp_path: Path) -> None:
    hosts = [read_ultraserver(emulate("trn2u.48xlarge", tmp_path / str(i), EmulationOptions(
        host_id=f"n{i}", ultraserver_id="us-d", ultraserver_node=i))) for i in range(4)]
    assert len({h.server_id_4 for h in hosts if h}) == 1
    assert [h.node_id_4 for h in hosts if h] == [0, 1, 2, 3]
    assert len({h.server_id_2 for h in hosts if h}) == 2
    alone = read_ultraserver(emulate("trn2u.48xlarge", tmp_path / "x", EmulationOptions(host_id="n0")))
    assert alone is not None and hosts[0] is not None and alone.server_id_4 != hosts[0].server_id_4


def test_a_claim_with_a_group_device_and_node_devices_gets_both(tmp_path: Path) -> None:
    lookup = FakeLookup()
    state, root = _state(tmp_path, lookup, EmulationOptions(host_id="h", ultraserver_id="us-e", ultraserver_node=0))
    c = _group_claim("job", 6, _pool(root, 4), [NODE])
    c["status"]["allocation"]["devices"]["results"] += devices(0, 1)
    lookup.put(c)
    answer = state.prepare([ClaimRef("default", "job", uid(6))])[uid(6)]
    assert not isinstance(answer, ClaimFailed), answer.message
    assert [(d.pool_name, d.device_name) for d in answer] == [
        (NODE, "neuron-device-0"), (NODE, "neuron-device-1"), (_pool(root, 4), us.WHOLE_DEVICE)]
    assert _env(tmp_path, uid(6))["NEURON_RT_ULTRASERVER_MODE"] == "4"
    assert state.prepared()[uid(6)].neuron_indexes == (0, 1)


def test_an_unfinished_group_prepare_is_restored_when_its_claim_still_holds_the_group(tmp_path: Path) -> None:
    """A crash between the PrepareStarted record and the answer: at the next start the API server confirms the
    claim still holds the group (its pool is not the node's), so the entry is restored, not dropped."""
    lookup = FakeLookup()
    options = EmulationOptions(host_id="h", ultraserver_id="us-f", ultraserver_node=1)
    state, root = _state(tmp_path, lookup, options)
    c = _group_claim("job", 7, _pool(root, 4), [NODE])
    c["status"]["reservedFor"] = [{"resource": "pods", "name": "job-0", "uid": "p0"}]
    lookup.put(c)
    ref = ClaimRef("default", "job", uid(7))
    plan = state.plan(ref, allocated_devices(Claim.checked(ref, c), DRIVER, NODE, state.host.spec))
    started = PreparedClaim(uid(7), "default", "job", ClaimState.PREPARE_STARTED, plan.devices, plan.exclusive,
                            plan.cdi_spec, 0.0, plan.cores)
    Checkpoint(tmp_path / "plugin" / "checkpoint.json").save({uid(7): started})
    restarted, _ = _state(tmp_path, lookup, options)
    report = restarted.resolve_unfinished()
    assert report.restored == (uid(7),) and report.dropped == ()
    assert restarted.prepared()[uid(7)].state is ClaimState.PREPARE_COMPLETED
    lookup.put(_group_claim("job", 7, "ultraserver-4/someone-else", [NODE]))  # the claim now holds another group
    Checkpoint(tmp_path / "plugin" / "checkpoint.json").save({uid(7): started})
    assert _state(tmp_path, lookup, options)[0].resolve_unfinished().dropped == (uid(7),)


def test_a_half_in_its_four_node_sets_pool_runs_in_mode_2_on_its_own_half_only(tmp_path: Path) -> None:
    """With shared counters (1.36+) a half is `ultraserver-half-<0|1>` in its 4-node set's pool: node 3 is node 1
    of half 1, and half 0 is not its group."""
    lookup = FakeLookup()
    state, root = _state(tmp_path, lookup, EmulationOptions(host_id="h", ultraserver_id="us-a", ultraserver_node=3,
                                                            ultraserver_mode=4))
    pool = _pool(root, 4)
    lookup.put(_group_claim("job", 1, pool, ["other-node", NODE], f"{us.HALF_DEVICE}-1"))
    answer = state.prepare([ClaimRef("default", "job", uid(1))])[uid(1)]
    assert not isinstance(answer, ClaimError), answer.message
    klass = root / "sys/class/neuron_device"
    assert _env(tmp_path, uid(1)) == {"NEURON_RT_ULTRASERVER_MODE": "2", "NEURON_RT_ULTRASERVER_NODE_ID": "1",
                                      "NEURON_RT_ULTRASERVER_SERVER_ID": (klass / "server_id_2").read_text().strip()}
    lookup.put(_group_claim("other", 2, pool, ["other-node", NODE], f"{us.HALF_DEVICE}-0"))
    refused = state.prepare([ClaimRef("default", "other", uid(2))])[uid(2)]
    assert isinstance(refused, ClaimError) and refused.reason is Reason.NOT_FOR_THIS_NODE, refused
    assert "node 3 of its 4-node set (its class files), so in half 1, not the group's half 0" in refused.message
