"""Two instances of the driver on one node (a surge rollout): the lock they share and the checkpoint each
refreshes before a call, so neither overwrites or misses what the other recorded."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import threading
import time
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims import checkpoint as current
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, ClaimState, PreparedClaim
from neuron_dra.driver.kubeletplugin import ClaimFailed
from neuron_dra.driver.kubeletplugin._instance_lock import InstanceLock, LockTimeout
from tests.support.checkpoint_claims import claim, uid

BOOT = "boot-1"


def pair(tmp_path: Path, journal_size: int = 16384) -> tuple[Checkpoint, Checkpoint]:
    a = Checkpoint(tmp_path / "checkpoint.json", journal_size=journal_size, boot_id=BOOT)
    a.load()
    a.save({})
    b = Checkpoint(tmp_path / "checkpoint.json", journal_size=journal_size, boot_id=BOOT)
    b.load()
    return a, b


def test_each_instance_sees_the_records_of_the_other(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    assert a.refresh() is None and b.refresh() is None  # nothing changed
    a.save({uid(0): claim(current, uid(0), 0)})
    assert b.refresh() == {uid(0): claim(current, uid(0), 0)}
    assert b.refresh() is None
    both = {uid(0): claim(current, uid(0), 0), uid(1): claim(current, uid(1), 1, "PrepareStarted")}
    b.save(both, durable=False)
    assert a.refresh() == both
    completed = {**both, uid(1): both[uid(1)].with_state(ClaimState.PREPARE_COMPLETED)}
    a.save(completed)
    assert b.refresh() == completed
    assert Checkpoint(a.path, boot_id=BOOT).read() == completed  # one journal, records of both, in order


def test_a_compaction_by_one_is_a_new_snapshot_for_the_other(tmp_path: Path) -> None:
    a, b = pair(tmp_path, journal_size=4096)
    state: dict[str, PreparedClaim] = {}
    for i in range(12):  # fills 4 KiB several times: each instance compacts in turn
        writer, reader = (a, b) if i % 2 == 0 else (b, a)
        assert writer.refresh() in (None, state)
        state = {**state, uid(i): claim(current, uid(i), i)} if i % 3 else {uid(i): claim(current, uid(i), i)}
        writer.save(state)
        assert reader.refresh() == state
    assert Checkpoint(a.path, boot_id=BOOT).read() == state


def test_the_lock_excludes_the_other_process_and_times_out_with_the_path(tmp_path: Path) -> None:
    lock = InstanceLock(tmp_path)
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(tmp_path, ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(LockTimeout, match=r"serialize\.lock: another instance"), lock.hold(time.monotonic() + 0.2):
            pass
        release.set()
        with lock.hold(time.monotonic() + 10):
            pass
    finally:
        release.set()
        holder.join(10)
    killed_ready, never = multiprocessing.Event(), multiprocessing.Event()
    killed = multiprocessing.Process(target=_hold, args=(tmp_path, killed_ready, never))
    killed.start()
    assert killed_ready.wait(10)
    killed.kill()  # a kill -9 of the holder frees the lock
    killed.join(10)
    with lock.hold(time.monotonic() + 5):
        pass
    lock.close()


def _hold(directory: Path, ready: multiprocessing.synchronize.Event, release: multiprocessing.synchronize.Event
          ) -> None:
    lock = InstanceLock(directory)
    with lock.hold():
        ready.set()
        release.wait(30)


def test_a_refresh_reads_more_than_its_first_piece_when_the_other_wrote_much(tmp_path: Path) -> None:
    a, b = pair(tmp_path, journal_size=current.JOURNAL_SIZE)
    state: dict[str, PreparedClaim] = {}
    for i in range(300):  # far more than the 64 KiB a refresh reads first
        state = {**state, uid(i % 40): claim(current, uid(i % 40), i % 16)}
        a.save(state)
    assert a._offset > current._REFRESH_READ
    assert b.refresh() == state
    b.save({})
    assert a.refresh() == {}


def test_a_call_that_cannot_get_the_lock_before_its_deadline_fails_alone_naming_it(tmp_path: Path) -> None:
    from neuron_dra.driver.daemon.claims.allocation import Reason
    from neuron_dra.driver.daemon.claims.cdi import CdiStore
    from neuron_dra.driver.daemon.claims.state import DriverState
    from neuron_dra.driver.kubeletplugin._claimref import CallScope, ClaimRef
    from neuron_dra.driver.kubeletplugin._instance_lock import CallLock
    from neuron_dra.driver.model.discovery import discover
    from neuron_dra.driver.model.emulate import emulate
    from tests.support.driver import DRIVER, NODE, FakeLookup, Served, devices
    from tests.support.driver import claim as api_claim
    from tests.support.driver import uid as claim_uid

    root = emulate("trn2.48xlarge", tmp_path / "host")
    plugin = tmp_path / "plugin"
    lookup = FakeLookup(api_claim("c", claim_uid(1), devices(0)))
    state = Served(DriverState(host=discover(root), host_root=root, driver_name=DRIVER, pool_name=NODE,
                               cdi=CdiStore(tmp_path / "cdi", DRIVER),
                               checkpoint=Checkpoint(plugin / "checkpoint.json"), lookup=lookup,
                               lock=CallLock(InstanceLock(plugin))), lookup)
    state.load()
    state.reconcile_local()
    other = InstanceLock(plugin)  # another open file: flock excludes it as it would another process
    ref = ClaimRef("default", "c", claim_uid(1))
    with other.hold():
        result = state.prepare([ref], CallScope(time.monotonic() + 0.3))[ref.uid]
        assert isinstance(result, ClaimFailed) and result.reason == Reason.LOCK_TIMEOUT
        assert "serialize.lock: another instance of the driver held the lock" in result.message
    assert not isinstance(state.prepare([ref], CallScope(time.monotonic() + 5))[ref.uid], ClaimFailed)
    state.close()
    other.close()


def test_the_call_lock_gives_up_at_the_deadline_behind_another_call_of_this_process(tmp_path: Path) -> None:
    """The thread part of the CallLock keeps the deadline too (before, only the instances' flock did): a call
    behind another call of this instance gives up at its deadline while the other still holds the lock, naming
    it; without a deadline it waits. With no instances attached as with them."""
    from neuron_dra.driver.kubeletplugin._instance_lock import CallLock

    for lock in (CallLock(), CallLock(InstanceLock(tmp_path / "plugin"))):
        taken, release, waited = threading.Event(), threading.Event(), threading.Event()

        def holder(lock: CallLock = lock, taken: threading.Event = taken, release: threading.Event = release) -> None:
            with lock.hold():
                taken.set()
                release.wait(30)

        t = threading.Thread(target=holder)
        t.start()
        assert taken.wait(10)
        with pytest.raises(LockTimeout, match=r"^the call lock: another call of this instance held the lock"), \
                lock.hold(time.monotonic() + 0.2):
            pass
        assert t.is_alive()  # given up while the other call still held it

        def waiter(lock: CallLock = lock, waited: threading.Event = waited) -> None:
            with lock.hold():
                waited.set()

        w = threading.Thread(target=waiter)
        w.start()
        assert not waited.is_set()
        release.set()
        assert waited.wait(10)  # no deadline: it waited for the release
        t.join(10)
        w.join(10)
        with lock.hold(time.monotonic() + 0.2):  # free again: taken at once, released after
            pass


def test_an_instance_that_never_loaded_reads_the_others_records_and_a_closed_one_writes_nothing(
        tmp_path: Path) -> None:
    """Round 3: on a node with no checkpoint yet, an instance whose load found nothing never saw the other's
    records, and its first save wrote a snapshot of its own over them. Now a load always leaves a snapshot and a
    journal, a refresh before any load loads, and after a clean stop the stop's snapshot (version 1) stays."""
    a = Checkpoint(tmp_path / "checkpoint.json", journal_size=16384, boot_id=BOOT)
    b = Checkpoint(tmp_path / "checkpoint.json", journal_size=16384, boot_id=BOOT)
    assert a.load() == {} and b.load() == {}  # both on an empty node
    assert a.path.exists() and a.journal_path.exists()
    a.save({uid(0): claim(current, uid(0), 0)})
    assert b.refresh() == {uid(0): claim(current, uid(0), 0)}
    c = Checkpoint(tmp_path / "checkpoint.json", journal_size=16384, boot_id=BOOT)
    assert c.refresh() == {uid(0): claim(current, uid(0), 0)}  # never loaded: loads
    b.close()
    stopped = a.path.read_bytes()
    assert b.refresh() is None and a.path.read_bytes() == stopped
