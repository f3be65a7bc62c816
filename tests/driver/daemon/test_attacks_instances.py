"""Issue 42, round 4, item 3: during a surge rollout two instances of the driver share the plugin directory (the
checkpoint, its journal and the instances' lock) and kubelet may call either. A prepare that began before an
unprepare of the same claim was answered, on either instance, must never commit: the claim would come back,
PrepareCompleted with its CDI spec, after kubelet released it. Two DriverState instances on one directory, the
slow prepare held at its claim GET; bounded: files in a temporary directory, no sockets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon.claims.allocation import Reason
from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin import ClaimFailed, ClaimRef
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, InstanceLock
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from tests.support.driver import DRIVER, NODE, FakeLookup, Served, claim, devices, uid

pytestmark = pytest.mark.attacks
JOURNAL = 8 * 1024  # small: a few prepares of the other instance compact it


@dataclass
class Node:
    a: Served
    b: Served
    lookup_a: FakeLookup
    lookup_b: FakeLookup
    cdi: Path
    checkpoint: Path

    def put(self, c: dict[str, Any]) -> None:
        self.lookup_a.put(c)
        self.lookup_b.put(c)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    root = emulate("trn2.48xlarge", tmp_path / "host")
    host = discover(root)
    plugin = tmp_path / "plugins" / DRIVER
    plugin.mkdir(parents=True)
    cdi = tmp_path / "cdi"
    locks = [InstanceLock(plugin), InstanceLock(plugin)]  # one per process: flock excludes the other's descriptor

    def instance(lookup: FakeLookup, lock: InstanceLock) -> Served:
        state = DriverState(host=host, host_root=root, driver_name=DRIVER, pool_name=NODE, cdi=CdiStore(cdi, DRIVER),
                            checkpoint=Checkpoint(plugin / "checkpoint.json", JOURNAL), lookup=lookup,
                            lock=CallLock(lock))
        state.load()
        state.reconcile_local()
        return Served(state, lookup)

    lookup_a, lookup_b = FakeLookup(), FakeLookup()
    n = Node(instance(lookup_a, locks[0]), instance(lookup_b, locks[1]), lookup_a, lookup_b, cdi,
             plugin / "checkpoint.json")
    yield n
    for state in (n.a, n.b):
        state.close()
    for lock in locks:
        lock.close()


def ref(n: int) -> ClaimRef:
    return ClaimRef("default", f"c{n}", uid(n))


def held_prepare(state: Served, lookup: FakeLookup, n: int) -> tuple[threading.Event, Callable[[], Any]]:
    """A prepare of claim `n` on `state`, held at its GET: (its release, a wait for its answer)."""
    entered, release = lookup.gate(f"c{n}")
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(state.prepare([ref(n)])), daemon=True)
    t.start()
    assert entered.wait(10)

    def answer() -> Any:
        t.join(10)
        assert not t.is_alive()
        del lookup.gates[f"c{n}"]
        return out[0][uid(n)]

    return release, answer


def refused(result: Any) -> bool:
    return isinstance(result, ClaimFailed) and result.reason == Reason.UNPREPARED_MEANWHILE


def gone(node: Node, n: int) -> bool:
    return (uid(n) not in node.a.prepared() and uid(n) not in node.b.prepared()
            and not (node.cdi / f"{DRIVER}_{uid(n)}.json").exists()
            and uid(n) not in Checkpoint(node.checkpoint).read())


def test_unprepare_of_an_unknown_claim_on_the_other_instance_stops_a_prepare_in_flight(node: Node) -> None:
    node.put(claim("c1", uid(1), devices(0)))
    release, answer = held_prepare(node.b, node.lookup_b, 1)
    assert node.a.unprepare([ref(1)]) == {uid(1): None}  # kubelet gave up on B's call, the pod went away
    release.set()
    assert refused(answer())
    assert gone(node, 1)
    assert not isinstance(node.b.prepare([ref(1)])[uid(1)], ClaimFailed)  # a prepare after it is a new request


def test_prepare_and_unprepare_on_the_other_instance_stop_a_prepare_in_flight(node: Node) -> None:
    node.put(claim("c2", uid(2), devices(1)))
    release, answer = held_prepare(node.b, node.lookup_b, 2)
    assert not isinstance(node.a.prepare([ref(2)])[uid(2)], ClaimFailed)  # kubelet's retry went to A
    assert node.a.unprepare([ref(2)]) == {uid(2): None}
    release.set()
    assert refused(answer())
    assert gone(node, 2)


def test_the_other_instance_compacting_meanwhile_does_not_lose_the_unprepare(node: Node) -> None:
    node.put(claim("c3", uid(3), devices(2)))
    release, answer = held_prepare(node.b, node.lookup_b, 3)
    assert node.a.unprepare([ref(3)]) == {uid(3): None}
    generation = Checkpoint(node.checkpoint).path.read_bytes()[:200]
    for i in range(10, 40):  # A's journal fills and is compacted (a new generation) while B's prepare waits
        node.put(claim(f"c{i}", uid(i), devices(4 + i % 8)))
        assert not isinstance(node.a.prepare([ref(i)])[uid(i)], ClaimFailed)
        assert node.a.unprepare([ref(i)]) == {uid(i): None}
    assert node.checkpoint.read_bytes()[:200] != generation  # compacted
    release.set()
    assert refused(answer())
    assert gone(node, 3)


def test_an_unprepare_that_arrived_before_the_prepare_does_not_stop_it(node: Node) -> None:
    node.put(claim("c4", uid(4), devices(3)))
    assert node.a.unprepare([ref(4)]) == {uid(4): None}
    release, answer = held_prepare(node.b, node.lookup_b, 4)
    release.set()
    assert not isinstance(answer(), ClaimFailed)
    assert uid(4) in node.a.prepared()  # recorded where both read it


def test_unprepares_noted_before_a_reboot_do_not_refuse_prepares_after_it(tmp_path: Path) -> None:
    """Arrivals are time.monotonic_ns, which starts again at a boot: an unprepare noted in the previous boot (a
    large arrival) must not refuse a prepare of this boot (a small one); kubelet prepares its pods' claims again."""
    path = tmp_path / "checkpoint.json"
    before = Checkpoint(path, JOURNAL, boot_id="boot-1")
    before.load()
    before.note_unprepared(uid(5), 10**18)  # far beyond any arrival of the next boot
    assert before.unprepared_since(uid(5), 1)
    before.close(compact=False)  # killed: the journal keeps the note
    same_boot = Checkpoint(path, JOURNAL, boot_id="boot-1")
    same_boot.load()
    assert same_boot.unprepared_since(uid(5), 1)  # a restart within the boot keeps it
    same_boot.close(compact=False)
    after = Checkpoint(path, JOURNAL, boot_id="boot-2")
    after.load()
    assert not after.unprepared_since(uid(5), 1)
    after.close()
