"""The checkpoint's format versions and what may load: upgrade from and downgrade to the previous release's
format, the integrity digest over every field that decides what loads, torn writes against corruption in the
journal, the node's boot id; and a single-byte mutation over snapshot and journal that must never change the
loaded claims without an error."""

from __future__ import annotations

import json
import logging
import shutil
import tracemalloc
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims import checkpoint as current
from neuron_dra.driver.daemon.claims.checkpoint import SECTOR, Checkpoint, CheckpointError, ClaimState, PreparedClaim
from tests.support import previous_checkpoint
from tests.support.checkpoint_claims import ErrorCount, claim, uid

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoint_format1"
BOOT = "1b6e1bb1-0000-4000-8000-000000000001"


def expected_after_fixture() -> dict[str, PreparedClaim]:
    claims = {uid(i): claim(current, uid(i), i) for i in (0, 2, 3)}
    claims[uid(9)] = claim(current, uid(9), 9, "PrepareStarted")
    return claims


@pytest.fixture
def upgraded(tmp_path: Path) -> Checkpoint:
    for name in ("checkpoint.json", "checkpoint.json.journal"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    return Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)


def test_the_fixture_is_what_the_pinned_code_writes(tmp_path: Path) -> None:
    previous_checkpoint.write_fixture(tmp_path)
    old = previous_checkpoint.load()
    assert old.CHECKPOINT_VERSION == 1
    written = old.Checkpoint(tmp_path / "checkpoint.json").read()
    committed = old.Checkpoint(FIXTURE / "checkpoint.json").read()
    assert written.keys() == committed.keys() == expected_after_fixture().keys()


def test_upgrade_reads_format_1_with_its_journal_and_converts(upgraded: Checkpoint) -> None:
    assert upgraded.load() == expected_after_fixture()
    doc = json.loads(upgraded.path.read_text())
    assert (doc["format"], doc["version"], doc["bootId"]) == (3, 2, BOOT)  # converted at load
    assert upgraded.journal_path.read_bytes().strip(b"\0") == b""  # the format-1 records are folded in
    upgraded.save({uid(0): claim(current, uid(0), 0)})
    assert Checkpoint(upgraded.path, boot_id=BOOT).load() == {uid(0): claim(current, uid(0), 0)}


def test_downgrade_the_previous_release_refuses_a_journal_it_cannot_verify_and_reads_a_clean_stop(
        upgraded: Checkpoint) -> None:
    """The previous release's reader trusts the snapshot's `journal` field unchecked (a changed digit there would
    drop the journal), so while a journal applies the file is version 2, which it refuses as a future version
    (after a kill -9 too); what a clean stop leaves is version 1, with no journal, and loads there unchanged."""
    upgraded.load()
    claims = expected_after_fixture()
    claims[uid(5)] = claim(current, uid(5), 5)
    upgraded.save(claims)
    claims[uid(9)] = claims[uid(9)].with_state(ClaimState.PREPARE_COMPLETED)
    upgraded.save(claims)
    old = previous_checkpoint.load()
    with pytest.raises(old.CheckpointError, match=r"version 2 is not supported.*written by a newer driver"):
        old.Checkpoint(upgraded.path).load()
    upgraded.close()
    doc = json.loads(upgraded.path.read_text())
    assert doc["version"] == 1 and "journal" not in doc
    loaded = old.Checkpoint(upgraded.path).load()
    assert {k: v.to_json() for k, v in loaded.items()} == {k: v.to_json() for k, v in claims.items()}


def test_an_upgrade_then_a_surge_rollback_loses_nothing(upgraded: Checkpoint) -> None:
    """Up: the previous release's files load and convert. Two instances of this release side by side (a surge
    rollout) share them; the old one stops (a journal-less snapshot) and the other goes on with a journal again.
    Down, with a surge: the previous release starts beside the one left, which hands over (journal-less
    snapshots from then on), so what the previous release reads, at its start and at any restart, is verified
    whole and equal to what this release recorded, also after changes made after the hand-over."""
    a = upgraded
    assert a.load() == expected_after_fixture()
    b = Checkpoint(a.path, boot_id=BOOT)
    assert b.load() == expected_after_fixture()
    claims = {**expected_after_fixture(), uid(5): claim(current, uid(5), 5)}
    a.save(claims)
    assert b.refresh() == claims
    del claims[uid(0)]
    b.save(claims)
    assert a.refresh() == claims
    a.close()  # the old instance of this release stops
    assert json.loads(a.path.read_text())["version"] == 1
    assert b.refresh() == claims  # a new snapshot: read, and a journal of its own again
    claims[uid(6)] = claim(current, uid(6), 6)
    b.save(claims)
    old = previous_checkpoint.load()
    with pytest.raises(old.CheckpointError, match="version 2 is not supported"):
        old.Checkpoint(a.path).load()  # the previous release's first start: refused, not misread
    b.hand_over()  # it saw the previous release on the plain socket names
    assert {k: v.to_json() for k, v in old.Checkpoint(a.path).read().items()} == {
        k: v.to_json() for k, v in claims.items()}
    del claims[uid(2)]
    b.save(claims)  # a call already sent to this instance, answered after the hand-over
    assert b.refresh() is None
    assert {k: v.to_json() for k, v in old.Checkpoint(a.path).load().items()} == {
        k: v.to_json() for k, v in claims.items()}
    assert b.refresh() is not None  # the previous release rewrote the file (format 1): read again
    b.close()


def test_every_single_byte_change_of_a_clean_stop_is_refused_or_harmless_to_the_previous_release(
        tmp_path: Path) -> None:
    """A file this release leaves for a rollback: whatever one byte is changed, the previous release's reader
    refuses the file or loads exactly the claims written (nothing it cannot verify decides what it loads)."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)
    cp.load()
    claims = {uid(i): claim(current, uid(i), i) for i in range(2)}
    cp.save(claims)
    cp.close()
    old = previous_checkpoint.load()
    original = cp.path.read_bytes()
    expected = {k: v.to_json() for k, v in claims.items()}
    refused = 0
    for position in range(len(original)):
        mutated = bytearray(original)
        mutated[position] ^= (0x01, 0x20, 0x80)[position % 3]
        cp.path.write_bytes(bytes(mutated))
        try:
            loaded = old.Checkpoint(cp.path).read()
        except old.CheckpointError:
            refused += 1
            continue
        assert {k: v.to_json() for k, v in loaded.items()} == expected, position
    assert refused > len(original) // 2


@pytest.mark.parametrize(("field", "value", "message"), [
    ("journal", "0000000000000000", "integrity digest mismatch"),
    ("bootId", "another-boot", "integrity digest mismatch"),
    ("format", 4, "format 4 is not supported"),
    ("format", True, "format True is not supported"),
    ("version", 1, "not those of a format-3 version-1 checkpoint"),  # a journal needs version 2
    ("version", 3, "version 3 is not supported"),
    ("version", True, "version True is not supported"),
])
def test_every_field_that_decides_what_loads_is_covered(tmp_path: Path, field: str, value: object,
                                                        message: str) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)
    cp.save({uid(0): claim(current, uid(0), 0)})
    doc = json.loads(cp.path.read_text())
    doc[field] = value
    cp.path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(cp.path, boot_id=BOOT).load()


def test_a_renamed_field_is_not_taken_for_an_absent_one(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)
    cp.save({uid(0): claim(current, uid(0), 0)})
    raw = cp.path.read_bytes()
    for old, new in ((b'"integrity"', b'"integritx"'), (b'"format"', b'"formaT"')):
        cp.path.write_bytes(raw.replace(old, new))
        with pytest.raises(CheckpointError, match=r"are not those of a format|formats 1 and 2 are version 1"):
            Checkpoint(cp.path, boot_id=BOOT).load()


def _journal_with_records(tmp_path: Path) -> Checkpoint:
    cp = Checkpoint(tmp_path / "checkpoint.json", journal_size=8192, boot_id=BOOT)
    cp.load()
    claims: dict[str, PreparedClaim] = {}
    for i in range(3):
        claims[uid(i)] = claim(current, uid(i), i)
        cp.save(dict(claims))
    return cp


def _unfinished(claims: dict[str, PreparedClaim]) -> dict[str, PreparedClaim]:
    return {u: c.with_state(ClaimState.PREPARE_STARTED) for u, c in claims.items()}


def _damage_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and "journal is damaged" in r.getMessage()]


def test_a_damaged_last_record_is_not_replayed_and_its_claims_are_left_to_the_api_server(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The last record was synced and acknowledged to kubelet, or not: a flipped byte in it must neither replay
    it nor drop it in silence. What it may have changed becomes unfinished prepares (resolved against the API
    server at start), logged as an error, and the load writes that as a new snapshot."""
    cp = _journal_with_records(tmp_path)
    raw = bytearray(cp.journal_path.read_bytes())
    end = len(raw.rstrip(b"\0"))
    raw[end - 40] ^= 0x01
    cp.journal_path.write_bytes(bytes(raw))
    before = {uid(i): claim(current, uid(i), i) for i in range(2)}
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        assert Checkpoint(cp.path, boot_id=BOOT).load() == _unfinished(before)
    (logged,) = _damage_logged(caplog)
    assert logged.unfinished == sorted(before) and uid(2) in logged.named_in_damage  # type: ignore[attr-defined]
    assert Checkpoint(cp.path, boot_id=BOOT).read() == _unfinished(before)  # persisted, the damage gone


def test_a_line_feed_early_in_the_last_record_is_damage_not_unused_space(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Round 3: a line feed in the first 19 bytes of the last record made a piece shorter than a record, read as
    a stray byte, and the record was dropped in silence (an unprepare kubelet was told of undone)."""
    cp = _journal_with_records(tmp_path)
    claims = {uid(i): claim(current, uid(i), i) for i in range(3)}
    start = len(cp.journal_path.read_bytes().rstrip(b"\0"))
    cp.save({u: c for u, c in claims.items() if u != uid(0)})  # an unprepare, synced and acknowledged
    for position in range(19):
        raw = bytearray(cp.journal_path.read_bytes())
        saved = raw[start + position]
        raw[start + position] = 0x0A
        work = tmp_path / f"lf{position}"
        work.mkdir()
        (work / "checkpoint.json").write_bytes(cp.path.read_bytes())
        (work / "checkpoint.json.journal").write_bytes(bytes(raw))
        raw[start + position] = saved
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
            assert Checkpoint(work / "checkpoint.json", boot_id=BOOT).read() == _unfinished(claims), position
        assert _damage_logged(caplog), position


def test_a_torn_last_record_is_not_replayed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A power loss left a sector of the unsynced last record unwritten (zero): that record does not replay,
    the claims before it are left to the API server (a torn record can be one kubelet was never answered for,
    or, to the reader, one damaged later), and the journal starts anew."""
    cp = _journal_with_records(tmp_path)
    before = cp.journal_path.read_bytes()
    start = len(before.rstrip(b"\0"))
    claims = {uid(i): claim(current, uid(i), i) for i in range(3)}
    cp.save({**claims, uid(7): claim(current, uid(7), 7, "PrepareStarted")}, durable=False)
    raw = bytearray(cp.journal_path.read_bytes())
    end = len(raw.rstrip(b"\0"))
    sector = (start // SECTOR + 1) * SECTOR  # the record's second sector never reached the disk
    assert start < sector < end
    raw[sector:min(sector + SECTOR, end)] = bytes(min(SECTOR, end - sector))
    cp.journal_path.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        assert Checkpoint(cp.path, boot_id=BOOT).load() == _unfinished(claims)
    assert _damage_logged(caplog)
    assert cp.journal_path.read_bytes().strip(b"\0") == b""


def test_a_stray_byte_in_the_unused_journal_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cp = _journal_with_records(tmp_path)
    raw = bytearray(cp.journal_path.read_bytes())
    raw[len(raw.rstrip(b"\0")) + 3 * SECTOR] = 0x41
    cp.journal_path.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        loaded = Checkpoint(cp.path, boot_id=BOOT).load()
    assert loaded == _unfinished({uid(i): claim(current, uid(i), i) for i in range(3)}) and _damage_logged(caplog)


def _full_size_journal_with_records(tmp_path: Path) -> tuple[Checkpoint, dict[str, PreparedClaim]]:
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id=BOOT)  # the daemon's journal size
    cp.load()
    claims = {uid(i): claim(current, uid(i), i) for i in range(3)}
    cp.save(claims)
    cp.close(compact=False)  # as a kill -9 leaves it: the journal applies at the next load
    return cp, claims


@pytest.mark.parametrize("position", [current._SCAN_PIECE - 1, current._SCAN_PIECE, current.JOURNAL_SIZE - 1])
def test_a_stray_byte_at_a_piece_boundary_or_the_journal_s_end_is_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, position: int) -> None:
    """The journal's used part is found reading backwards a piece at a time: a non-zero byte on either side of
    a piece boundary, or the file's last byte, is still seen."""
    cp, claims = _full_size_journal_with_records(tmp_path)
    raw = bytearray(cp.journal_path.read_bytes())
    assert len(raw) == current.JOURNAL_SIZE and len(raw.rstrip(b"\0")) < position
    raw[position] = 0x41
    cp.journal_path.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        assert Checkpoint(cp.path, boot_id=BOOT).load() == _unfinished(claims)
    assert _damage_logged(caplog)


def test_loading_reads_the_journal_s_used_part_not_the_whole_file(tmp_path: Path) -> None:
    """The journal is zero-filled to its full size; reading all of it at once was the daemon's peak memory at
    start (docs/benchmarks.md §1). A load (a restart after a kill -9) holds about its records, not its size."""
    cp, claims = _full_size_journal_with_records(tmp_path)
    tracemalloc.start()
    try:
        assert Checkpoint(cp.path, boot_id=BOOT).load() == claims
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < current.JOURNAL_SIZE // 8, f"load allocated {peak} bytes at its peak"


def test_a_new_boot_keeps_the_claims_and_records_the_boot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cp = _journal_with_records(tmp_path)
    claims = cp.read()
    with caplog.at_level(logging.INFO, logger="neuron_dra.driver.daemon.claims.checkpoint"):
        assert Checkpoint(cp.path, boot_id="second-boot").load() == claims
    assert any("booted since the checkpoint" in r.getMessage() for r in caplog.records)
    assert json.loads(cp.path.read_text())["bootId"] == "second-boot"
    assert current.current_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.slow
def test_single_byte_mutations_never_change_the_loaded_claims_silently(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every byte of the snapshot and of the journal's used part (and one sector beyond), XORed with a mask that
    varies with the position (a low bit, a letter's case bit, the high bit): the load fails with CheckpointError,
    yields exactly the claims written, or logs the damage and yields them with the claims it may have changed
    as unfinished prepares (none dropped, none replayed from damaged bytes)."""
    source = tmp_path / "source"
    source.mkdir()
    cp = Checkpoint(source / "checkpoint.json", journal_size=8192, boot_id=BOOT)
    cp.load()
    claims: dict[str, PreparedClaim] = {}
    for i in range(2):  # as the driver writes: PrepareStarted, then PrepareCompleted
        claims[uid(i)] = claim(current, uid(i), i, "PrepareStarted")
        cp.save(dict(claims), durable=False)
        claims[uid(i)] = claims[uid(i)].with_state(ClaimState.PREPARE_COMPLETED)
        cp.save(dict(claims))
    cp.close()
    cp.load()  # the snapshot holds two claims; the journal records below change them
    claims[uid(2)] = claim(current, uid(2), 2, "PrepareStarted")
    cp.save(dict(claims), durable=False)
    claims[uid(2)] = claims[uid(2)].with_state(ClaimState.PREPARE_COMPLETED)
    cp.save(dict(claims))
    del claims[uid(0)]
    cp.save(dict(claims))
    expected = Checkpoint(cp.path, boot_id=BOOT).read()
    assert expected == claims
    every = {**claims, uid(0): claim(current, uid(0), 0)}
    snapshot, journal = cp.path.read_bytes(), cp.journal_path.read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    counts = {"mutations": 0, "errors": 0, "unchanged": 0, "left to the API server": 0}
    target = Checkpoint(work / "checkpoint.json", boot_id=BOOT)
    errors = ErrorCount()
    logging.getLogger("neuron_dra.driver.daemon.claims.checkpoint").addHandler(errors)
    try:
        for name, original, other, limit in (("checkpoint.json", snapshot, journal, len(snapshot)),
                                             ("checkpoint.json.journal", journal, snapshot,
                                              len(journal.rstrip(b"\0")) + SECTOR)):
            other_name = "checkpoint.json.journal" if name == "checkpoint.json" else "checkpoint.json"
            for position in range(limit):
                mask = (0x01, 0x20, 0x80)[position % 3]
                mutated = bytearray(original)
                mutated[position] ^= mask
                (work / name).write_bytes(bytes(mutated))
                (work / other_name).write_bytes(other)
                counts["mutations"] += 1
                errors.count = 0
                try:
                    loaded = target.read()
                except CheckpointError:
                    counts["errors"] += 1
                    continue
                where = f"{name} byte {position} ^ {mask:#x}"
                if loaded == expected:
                    counts["unchanged"] += 1
                    continue
                assert errors.count, f"{where} changed the claims silently"
                assert set(expected) <= set(loaded), f"{where} dropped a claim"
                for u, c in loaded.items():
                    assert c == expected.get(u) or c == every[u].with_state(ClaimState.PREPARE_STARTED), where
                counts["left to the API server"] += 1
    finally:
        logging.getLogger("neuron_dra.driver.daemon.claims.checkpoint").removeHandler(errors)
    print(f"single-byte mutations: {counts}")
    assert counts["errors"] > 0 and counts["left to the API server"] > 0
