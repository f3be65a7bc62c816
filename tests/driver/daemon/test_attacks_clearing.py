"""Issue 42, round 4, item 7: a clearing of an earlier journal generation cut short (kill -9 inside the zeroing
`pwrite` of `Checkpoint._compact`, or a power loss before its fdatasync) leaves zeros and fragments of old records;
the next load must read them as stale bytes, not as damage that demotes every claim, while any single-byte damage
to a record of the current generation is still reported. Bounded: files in a temporary directory, no sockets."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims import checkpoint as current
from neuron_dra.driver.daemon.claims.checkpoint import SECTOR, Checkpoint, ClaimState, PreparedClaim
from neuron_dra.driver.kubeletplugin import ClaimRef
from tests.support.checkpoint_claims import claim, uid

pytestmark = pytest.mark.attacks
BOOT = "1b6e1bb1-0000-4000-8000-000000000042"
JOURNAL = 4 * 1024  # small, so that a few saves fill it and every byte of it can be cut at
SEED = 42


def _generation(cp: Checkpoint) -> str | None:
    generation = json.loads(cp.path.read_bytes()).get("journal")
    return generation if isinstance(generation, str) else None


def _compacted(tmp_path: Path) -> tuple[Checkpoint, bytes, dict[str, PreparedClaim]]:
    """A checkpoint whose journal filled with prepares and unprepares of 8 claims and was compacted: the
    checkpoint, the journal's bytes just before the compaction zeroed them, and the claims it recorded."""
    cp = Checkpoint(tmp_path / "checkpoint.json", JOURNAL, boot_id=BOOT)
    cp.load()
    claims: dict[str, PreparedClaim] = {}
    for step in range(1000):
        i = step % 8
        if uid(i) in claims and step % 3 == 0:
            claims = {u: c for u, c in claims.items() if u != uid(i)}
        else:
            claims = {**claims, uid(i): claim(current, uid(i), i)}
        before, generation = cp.journal_path.read_bytes(), _generation(cp)
        cp.save(claims)
        if _generation(cp) != generation and len(before.rstrip(b"\0")) > JOURNAL // 2:
            assert cp.journal_path.read_bytes().strip(b"\0") == b""  # the clearing completed here
            assert len(claims) >= 4
            return cp, before, claims
    raise AssertionError("the journal never filled")


def _damage(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and "journal is damaged" in r.getMessage()]


def _read_with(cp: Checkpoint, journal: bytes, caplog: pytest.LogCaptureFixture) -> dict[str, PreparedClaim]:
    with cp.journal_path.open("r+b") as f:  # in place: truncating would flush the file at close (ext4)
        f.write(journal)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        return Checkpoint(cp.path, JOURNAL, boot_id=BOOT).read()


def test_every_cut_point_of_the_clearing_loads_as_no_damage(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 inside the zeroing pwrite: the first `cut` bytes are zero, the old records after them remain."""
    cp, old, claims = _compacted(tmp_path)
    used = len(old.rstrip(b"\0"))
    cp.close(compact=False)
    generation = _generation(cp)
    assert generation is not None
    for cut in range(used + 1):
        journal = bytes(cut) + old[cut:]
        # Every cut through the reader that judges the journal; every 16th through a whole read of the files.
        content = current.read_journal(cp.journal_path, journal, generation)
        assert content.damage is None and content.records == () and content.end == 0, cut
        if cut % 16 == 0 or cut == used:
            assert _read_with(cp, journal, caplog) == claims, cut
            assert not _damage(caplog), cut
    # The load that follows clears the fragment and records of this generation go on from the journal's start.
    cp.journal_path.write_bytes(bytes(used // 2) + old[used // 2:])
    again = Checkpoint(cp.path, JOURNAL, boot_id=BOOT)
    assert again.load() == claims
    assert again.journal_path.read_bytes().strip(b"\0") == b""
    fewer = {u: c for u, c in claims.items() if u != min(claims)}
    again.save(fewer)
    assert Checkpoint(cp.path, JOURNAL, boot_id=BOOT).read() == fewer


def test_a_power_loss_in_the_clearing_leaves_any_sectors_zeroed_and_loads_as_no_damage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A power loss before the clearing's fdatasync: any subset of its sectors reached the disk."""
    cp, old, claims = _compacted(tmp_path)
    cp.close(compact=False)
    sectors = (len(old.rstrip(b"\0")) + SECTOR - 1) // SECTOR
    rng = random.Random(SEED)
    for attempt in range(300):
        raw = bytearray(old)
        for s in range(sectors):
            if rng.random() < 0.5:
                raw[s * SECTOR:(s + 1) * SECTOR] = bytes(SECTOR)
        assert _read_with(cp, bytes(raw), caplog) == claims, attempt
        assert not _damage(caplog), attempt


def test_single_byte_damage_to_the_current_generation_is_still_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first record after the compaction (the one most like a fragment of an old one), every byte of it changed
    three ways (a bit flip, a zero, a line feed), and every byte of a second one flipped: each is logged as damage
    with the claims it may have changed left unfinished, never read as stale bytes."""
    cp, _, claims = _compacted(tmp_path)
    first = {**{u: c for u, c in claims.items() if u != min(claims)}, uid(9): claim(current, uid(9), 9)}
    cp.save(first)
    cp.save({**first, uid(10): claim(current, uid(10), 10, "PrepareStarted")}, durable=False)
    cp.close(compact=False)
    journal = cp.journal_path.read_bytes()
    used = len(journal.rstrip(b"\0"))
    assert _read_with(cp, journal, caplog) == {**first, uid(10): claim(current, uid(10), 10, "PrepareStarted")}
    first_end = journal.index(b"\n") + 1
    for position in range(used):
        for change in ("flip", "zero", "lf") if position < first_end else ("flip",):
            raw = bytearray(journal)
            raw[position] = {"flip": raw[position] ^ 0x01, "zero": 0, "lf": 0x0A}[change]
            if raw == journal:
                continue
            loaded = _read_with(cp, bytes(raw), caplog)
            assert _damage(caplog), (position, change)
            # Nothing dropped in silence: what the snapshot held is still there, unfinished where in doubt.
            for u, c in claims.items():
                if u in loaded:
                    assert loaded[u].with_state(ClaimState.PREPARE_COMPLETED) == c, (position, change)
                else:
                    assert u == min(claims), (position, change)  # removed by a valid record


def test_claims_demoted_by_real_damage_are_restored_when_the_api_server_confirms_them(tmp_path: Path) -> None:
    """Real damage (a flipped byte in the last record) demotes every claim to an unfinished prepare; start-up's
    resolution restores those the API server confirms (the claim exists, is allocated exactly these devices of this
    node and is reserved for a pod) as prepared, so the gauge and the per-pod attribution are what they were; a
    claim not reserved for a pod stays unfinished; one allocated other devices, or gone, is dropped."""
    from neuron_dra.driver.daemon.observability.metrics import Metrics
    from tests.driver.daemon.test_attacks_files import Node
    from tests.support.driver import FakeLookup, devices
    from tests.support.driver import claim as api_claim
    from tests.support.driver import uid as api_uid

    def reserved(name: str, n: int, index: int, pod: str | None) -> dict[str, object]:
        c = api_claim(name, api_uid(n), devices(index))
        if pod is not None:
            c["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": api_uid(100 + n)}]
        return c

    lookup = FakeLookup(*(reserved(f"c{n}", n, n, f"pod-{n}") for n in range(4)), reserved("c4", 4, 4, None),
                        reserved("c5", 5, 5, "pod-5"), reserved("c6", 6, 6, "pod-6"))
    node = Node(tmp_path, lookup)
    try:
        state = node.instance()
        state.load()
        state.reconcile_local()  # creates the CDI directory, as start-up does
        for n in range(7):
            prepared = state.prepare([ClaimRef("default", f"c{n}", api_uid(n))])
            assert isinstance(prepared[api_uid(n)], tuple), prepared
        state.close()
        checkpoint = Checkpoint(node.plugin / "checkpoint.json")
        checkpoint.load()
        checkpoint.save(dict(checkpoint.read()))  # one journal record holding the claims (none changed: empty ops)
        checkpoint.save({u: c for u, c in checkpoint.read().items() if u != api_uid(6)})  # c6 unprepared
        checkpoint.close(compact=False)
        raw = bytearray(checkpoint.journal_path.read_bytes())
        raw[len(raw.rstrip(b"\0")) - 20] ^= 0x01  # the unprepare record of c6, damaged
        checkpoint.journal_path.write_bytes(bytes(raw))
        lookup.put(reserved("c5", 5, 7, "pod-5"))  # reallocated meanwhile: other devices, same uid
        lookup.delete("c6")
        metrics = Metrics()
        again = node.instance()
        again._metrics = metrics  # the gauge a restarted daemon exports
        again.load()
        assert {c.state for c in again.prepared().values()} == {ClaimState.PREPARE_STARTED}  # all demoted
        report = again.reconcile()
        assert set(report.restored) == {api_uid(n) for n in range(4)}
        assert set(report.dropped) == {api_uid(5), api_uid(6)} and report.kept == (api_uid(4),)
        after = again.prepared()
        assert {u for u, c in after.items() if c.state is ClaimState.PREPARE_COMPLETED} == \
            {api_uid(n) for n in range(4)}
        assert after[api_uid(4)].state is ClaimState.PREPARE_STARTED
        assert all(after[api_uid(n)].consumers == (f"pod-{n}",) for n in range(4))
        assert metrics.prepared_claims._value.get() == 4  # type: ignore[attr-defined]
        # A restart after it reads them as prepared from the files alone.
        again.close()
        third = node.instance()
        third.load()
        assert {u for u, c in third.prepared().items() if c.state is ClaimState.PREPARE_COMPLETED} == \
            {api_uid(n) for n in range(4)}
        third.close()
    finally:
        node.close()
