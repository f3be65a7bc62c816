"""Issue 32, round 3 of attacks on the daemon's files: two instances on a fresh node (no checkpoint yet) and damaged
journal bytes. Each attack is bounded (files in a temporary directory, loopback sockets) and asserts the outcome:
no device held by two claims, and no claim replayed from or dropped by damaged bytes in silence."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims.allocation import Reason
from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import JOURNAL_SIZE, Checkpoint, ClaimState, PreparedClaim
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin._claimref import ClaimFailed, ClaimRef
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, InstanceLock
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from tests.driver.kubeletplugin.test_instances import Instance, _check_whole
from tests.support import pluginclient
from tests.support.checkpoint_claims import ErrorCount
from tests.support.driver import DRIVER, NODE, DaemonDirs, FakeLookup, Served, claim, devices, uid

pytestmark = pytest.mark.attacks
SEED = 32


class Node:
    """One emulated node's files, and instances of the driver on them (each with its own lock file handle, as two
    processes have)."""

    def __init__(self, base: Path, lookup: FakeLookup, journal_size: int = JOURNAL_SIZE) -> None:
        self.base = base
        self.journal_size = journal_size
        self.root = emulate("trn2.48xlarge", base / "host")
        self.host = discover(self.root)
        self.plugin = base / "plugin"
        self.lookup = lookup
        self.locks: list[InstanceLock] = []

    def instance(self) -> Served:
        lock = InstanceLock(self.plugin)
        self.locks.append(lock)
        return Served(DriverState(host=self.host, host_root=self.root, driver_name=DRIVER, pool_name=NODE,
                                  cdi=CdiStore(self.base / "cdi", DRIVER),
                                  checkpoint=Checkpoint(self.plugin / "checkpoint.json", self.journal_size),
                                  lookup=self.lookup, lock=CallLock(lock)), self.lookup)

    def close(self) -> None:
        for lock in self.locks:
            lock.close()


@pytest.fixture
def two_claims_one_device_pair() -> FakeLookup:
    return FakeLookup(claim("k0", uid(0), devices(0, 1)), claim("k1", uid(1), devices(0, 1)))


@pytest.mark.parametrize("order", ["load A, load B, prepare A, prepare B", "load B, load A, prepare A, prepare B",
                                   "load A, prepare A, load B, prepare B", "load A, load B, prepare B, prepare A"])
def test_two_instances_on_an_empty_node_never_grant_one_device_to_two_claims(
        tmp_path: Path, two_claims_one_device_pair: FakeLookup, order: str) -> None:
    """Round 3, finding 1: instances A and B on a node with no checkpoint yet; A prepares k0 on devices 0 and 1,
    B prepares k1 on the same devices. Whatever the order, the second is refused as busy and the checkpoint keeps
    the first (it used to keep only k1, and k0's CDI spec was later removed as an orphan)."""
    node = Node(tmp_path, two_claims_one_device_pair)
    assert not node.plugin.exists()
    a, b = node.instance(), node.instance()
    who = {"A": (a, ClaimRef("default", "k0", uid(0))), "B": (b, ClaimRef("default", "k1", uid(1)))}
    answers: dict[str, object] = {}
    for step in order.split(", "):
        verb, name = step.split(" ")
        state, ref = who[name]
        if verb == "load":
            state.load()
            state.reconcile_local()
        else:
            answers[name] = state.prepare([ref])[ref.uid]
    first, second = ("B", "A") if order.endswith("prepare A") else ("A", "B")
    assert not isinstance(answers[first], ClaimFailed), answers[first]
    refused = answers[second]
    assert isinstance(refused, ClaimFailed) and refused.reason == Reason.DEVICE_BUSY, refused
    recorded = Checkpoint(node.plugin / "checkpoint.json").read()
    assert set(recorded) == {who[first][1].uid}
    for state in (a, b):  # both see the same one holder
        assert set(state.prepared()) == {who[first][1].uid}
        state.close()
    assert set(Checkpoint(node.plugin / "checkpoint.json").read()) == {who[first][1].uid}
    node.close()


@pytest.mark.process
def test_two_daemons_on_an_empty_node_never_grant_one_device_to_two_claims(dirs: DaemonDirs,
                                                                          host_root: Path) -> None:
    """The same with two daemon processes, as the surge rollout's two pods, on a node that never had the driver."""
    dirs.put_claim(claim("k0", uid(0), devices(0, 1)))
    dirs.put_claim(claim("k1", uid(1), devices(0, 1)))
    assert not dirs.checkpoint.exists()
    a, b = Instance(dirs, host_root), Instance(dirs, host_root)
    try:
        ca, cb = a.client(), b.client()
        k0, k1 = ClaimRef("default", "k0", uid(0)), ClaimRef("default", "k1", uid(1))
        assert not ca.prepare([k0], timeout=20)[k0.uid].error
        assert "prepared for another live claim: default/k0" in cb.prepare([k1], timeout=20)[k1.uid].error
        ca.close()
        cb.close()
        assert set(Checkpoint(dirs.checkpoint).read()) == {k0.uid}
        assert (dirs.cdi / f"{DRIVER}_{k0.uid}.json").exists()
    finally:
        a.process.kill()
        b.process.kill()


@pytest.mark.process
def test_kill_9_cycles_each_from_an_empty_node_never_grant_one_device_twice(host_root: Path) -> None:
    """Round 3 saw its double grants before the first kill of its kill -9 loop, i.e. from an empty node: here
    every cycle starts from one. Two instances, random prepares of claims that share devices sent to either,
    one instance killed (kill -9) in the middle; no two claims ever answered with one device, and what is
    recorded is whole."""
    rng = random.Random(SEED)
    began = time.monotonic()
    cycles = 0
    for cycle in range(2):
        node = DaemonDirs(host_root.parent / f"node{cycle}")
        refs = [ClaimRef("default", f"k{i}", uid(500 + i)) for i in range(6)]
        for i, r in enumerate(refs):  # pairs share devices
            node.put_claim(claim(r.name, r.uid, devices(2 * (i // 2), 2 * (i // 2) + 1)))
        assert not node.checkpoint.exists()
        instances = [Instance(node, host_root), Instance(node, host_root)]
        answers: dict[str, tuple[str, ...]] = {}
        uncertain: set[str] = set()
        try:
            clients = [inst.client() for inst in instances]
            victim = rng.randrange(2)
            timer = threading.Timer(rng.uniform(0.3, 0.8), instances[victim].process.proc.kill)
            timer.start()
            deadline = time.monotonic() + 1.2
            while time.monotonic() < deadline:
                batch = rng.sample(refs, rng.randrange(1, 3))
                try:
                    for u, res in rng.choice(clients).prepare(batch, timeout=5).items():
                        if not res.error:
                            got = tuple(d.device_name for d in res.devices)
                            assert answers.setdefault(u, got) == got
                            uncertain.discard(u)
                except pluginclient.PluginCallError:
                    uncertain.update(r.uid for r in batch)  # cut by the kill: either outcome is right
                holders: dict[str, str] = {}
                for u in answers:
                    for dev in answers[u]:
                        assert holders.setdefault(dev, u) == u, f"cycle {cycle}: {dev} to {holders[dev]} and {u}"
            timer.cancel()
            for c in clients:
                c.close()
            instances[victim].process.kill()
            _check_whole(node)
            recorded = Checkpoint(node.checkpoint).read()
            completed = {u for u, c in recorded.items() if c.state is ClaimState.PREPARE_COMPLETED}
            assert set(answers) <= completed | uncertain and completed - uncertain <= set(answers)
            cycles += 1
        finally:
            for inst in instances:
                inst.process.kill()
    assert cycles == 2 and time.monotonic() - began < 60


# --- damaged journal bytes -------------------------------------------------------------------------------------

@pytest.fixture
def journal_node(tmp_path: Path) -> Iterator[tuple[Node, dict[str, PreparedClaim]]]:
    """A node whose journal holds what the driver writes for: c0..c3 prepared, c1 unprepared, c4 prepared, c0
    unprepared (the last record: an unprepare kubelet was told of). The API server knows the claims still held."""
    claims = {i: claim(f"c{i}", uid(10 + i), devices(i)) for i in range(5)}
    lookup = FakeLookup(*claims.values())
    node = Node(tmp_path / "source", lookup, journal_size=16384)
    state = node.instance()
    state.load()
    state.reconcile_local()
    for i in (0, 1, 2, 3):
        assert not isinstance(state.prepare([ClaimRef("default", f"c{i}", uid(10 + i))])[uid(10 + i)], ClaimFailed)
    state.unprepare([ClaimRef("default", "c1", uid(11))])
    lookup.delete("c1")
    assert not isinstance(state.prepare([ClaimRef("default", "c4", uid(14))])[uid(14)], ClaimFailed)
    state.unprepare([ClaimRef("default", "c0", uid(10))])
    lookup.delete("c0")
    truth = dict(state.prepared())
    assert set(truth) == {uid(12), uid(13), uid(14)}
    state.calls.close()  # no close of the state: the records stay in the journal, as after a kill -9
    yield node, truth
    node.close()


def test_every_damaged_byte_of_the_last_records_is_resolved_against_the_api_server(
        tmp_path: Path, journal_node: tuple[Node, dict[str, PreparedClaim]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Round 3, finding 5: a line feed early in the last record dropped it silently (an unprepare undone). Every
    byte position of the last three records (c4's two and c0's removal) gets each of a line feed, a zero, a
    flipped bit: each load either yields exactly what was recorded, or logs the damage as an error; then the
    start-up check of unfinished prepares against the API server (c0 and c1 are gone, the others exist and are
    allocated) leaves exactly the claims that hold devices: none dropped, none resurrected."""
    node, truth = journal_node
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    # What is read back is the question here, not what reaches the disk: thousands of loads without flushes.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    journal = (node.plugin / "checkpoint.json.journal").read_bytes()
    snapshot = (node.plugin / "checkpoint.json").read_bytes()
    end = len(journal.rstrip(b"\0"))
    starts = [i + 1 for i in range(end - 1) if journal[i] == 0x0A]
    last_three = starts[-3]  # the records of c4 (started, completed) and c0's removal
    # In memory where there is a tmpfs (thousands of renames on a busy disk take minutes).
    shm = Path("/dev/shm")
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else tmp_path)))
    errors = ErrorCount()
    logging.getLogger("neuron_dra.driver.daemon.claims.checkpoint").addHandler(errors)
    counts = {"damaged": 0, "unchanged": 0, "resolved": 0}
    began = time.monotonic()
    victim = Node(work, node.lookup, journal_size=16384)
    state = victim.instance()  # one instance, loaded again for each damaged file (as a restart would)
    try:
        for position in range(last_three, end + 1):
            # At every byte one of a line feed, a zero or a flipped bit; a line feed at each of the first 19
            # bytes of every record (round 3's case).
            kinds = {(b"\n", b"\0", bytes([journal[position] ^ 0x01]))[position % 3]}
            if any(0 <= position - s < 19 for s in starts):
                kinds.add(b"\n")
            for damage in sorted(kinds):
                if journal[position:position + 1] == damage:
                    continue
                (work / "plugin").mkdir(parents=True, exist_ok=True)
                (work / "plugin" / "checkpoint.json").write_bytes(snapshot)
                (work / "plugin" / "checkpoint.json.journal").write_bytes(
                    journal[:position] + damage + journal[position + 1:])
                counts["damaged"] += 1
                errors.count = 0
                state.load()
                loaded = dict(state.prepared())
                where = f"byte {position - last_three} of the last records set to {damage!r}"
                if loaded == truth:
                    counts["unchanged"] += 1
                else:
                    assert errors.count, f"{where}: the claims changed without an error"
                    assert set(truth) <= set(loaded), f"{where}: a claim was dropped"
                    for u, c in loaded.items():  # what differs is left to the API server, never replayed
                        assert c == truth.get(u) or c.state is ClaimState.PREPARE_STARTED, where
                    counts["resolved"] += 1
                state.reconcile_local()
                state.resolve_unfinished()
                after = state.prepared()
                assert set(after) == set(truth), where  # c0 (unprepared) is not back, none is lost
                assert all(after[u].neuron_indexes == truth[u].neuron_indexes for u in truth), where
    finally:
        logging.getLogger("neuron_dra.driver.daemon.claims.checkpoint").removeHandler(errors)
        state.close()
        victim.close()
    with capsys.disabled():
        print(f"\ndamaged journal bytes: {counts} in {time.monotonic() - began:.1f} s")
    assert counts["resolved"] > 0
