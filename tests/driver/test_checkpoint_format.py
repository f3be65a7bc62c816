"""The checkpoint's format versions and what may load: upgrade from and downgrade to the previous release's
format, the integrity digest over every field that decides what loads, torn writes against corruption in the
journal, the node's boot id; and a single-byte mutation over snapshot and journal that must never change the
loaded claims without an error."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from neuron_dra.driver.daemon import checkpoint as current
from neuron_dra.driver.daemon.checkpoint import SECTOR, Checkpoint, CheckpointError, ClaimState, PreparedClaim
from tests.support import previous_checkpoint
from tests.support.checkpoint_claims import claim, uid

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_format1"
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
    assert (doc["format"], doc["version"], doc["bootId"]) == (2, 1, BOOT)  # converted at load
    assert upgraded.journal_path.read_bytes().strip(b"\0") == b""  # the format-1 records are folded in
    upgraded.save({uid(0): claim(current, uid(0), 0)})
    assert Checkpoint(upgraded.path, boot_id=BOOT).load() == {uid(0): claim(current, uid(0), 0)}


def test_downgrade_the_previous_release_reads_what_this_one_writes(upgraded: Checkpoint) -> None:
    """Format 2 keeps `version: 1` and format 1's checksum, and the journal records are unchanged: after a
    rollback, with records still in the journal (a kill -9), the previous release loads the same claims."""
    upgraded.load()
    claims = expected_after_fixture()
    claims[uid(5)] = claim(current, uid(5), 5)
    upgraded.save(claims)
    claims[uid(9)] = claims[uid(9)].with_state(ClaimState.PREPARE_COMPLETED)
    upgraded.save(claims)
    old = previous_checkpoint.load()
    loaded = old.Checkpoint(upgraded.path).load()
    assert {k: v.to_json() for k, v in loaded.items()} == {k: v.to_json() for k, v in claims.items()}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("journal", "0000000000000000", "integrity digest mismatch"),
    ("bootId", "another-boot", "integrity digest mismatch"),
    ("format", 3, "format 3 is not supported"),
    ("format", True, "format True is not supported"),
    ("version", 2, "version 2 is not supported"),
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
        with pytest.raises(CheckpointError, match="are not those of a format"):
            Checkpoint(cp.path, boot_id=BOOT).load()


def _journal_with_records(tmp_path: Path) -> Checkpoint:
    cp = Checkpoint(tmp_path / "checkpoint.json", journal_size=8192, boot_id=BOOT)
    cp.load()
    claims: dict[str, PreparedClaim] = {}
    for i in range(3):
        claims[uid(i)] = claim(current, uid(i), i)
        cp.save(dict(claims))
    return cp


def test_a_damaged_last_record_that_was_written_whole_is_an_error(tmp_path: Path) -> None:
    """The last record was synced and acknowledged to kubelet: a flipped byte in it must not drop it as if a
    power loss had cut it short."""
    cp = _journal_with_records(tmp_path)
    raw = bytearray(cp.journal_path.read_bytes())
    end = len(raw.rstrip(b"\0"))
    raw[end - 40] ^= 0x01
    cp.journal_path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="damaged but was written whole"):
        Checkpoint(cp.path, boot_id=BOOT).load()


def test_a_torn_last_record_is_dropped(tmp_path: Path) -> None:
    """A power loss left a sector of the unsynced last record unwritten (zero): that record is dropped, the ones
    before it load, and the torn bytes are cleared."""
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
    assert Checkpoint(cp.path, boot_id=BOOT).load() == claims
    assert cp.journal_path.read_bytes() == before


def test_a_stray_byte_in_the_unused_journal_changes_nothing(tmp_path: Path) -> None:
    cp = _journal_with_records(tmp_path)
    raw = bytearray(cp.journal_path.read_bytes())
    raw[len(raw.rstrip(b"\0")) + 3 * SECTOR] = 0x41
    cp.journal_path.write_bytes(bytes(raw))
    assert Checkpoint(cp.path, boot_id=BOOT).load() == {uid(i): claim(current, uid(i), i) for i in range(3)}


def test_a_new_boot_keeps_the_claims_and_records_the_boot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cp = _journal_with_records(tmp_path)
    claims = cp.read()
    with caplog.at_level(logging.INFO, logger="neuron_dra.driver.daemon.checkpoint"):
        assert Checkpoint(cp.path, boot_id="second-boot").load() == claims
    assert any("booted since the checkpoint" in r.getMessage() for r in caplog.records)
    assert json.loads(cp.path.read_text())["bootId"] == "second-boot"
    assert current.current_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.slow
def test_single_byte_mutations_never_change_the_loaded_claims_silently(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every byte of the snapshot and of the journal's used part (and one sector beyond), XORed with a mask that
    varies with the position (a low bit, a letter's case bit, the high bit): the load either fails with
    CheckpointError or yields exactly the claims written."""
    source = tmp_path / "source"
    source.mkdir()
    cp = Checkpoint(source / "checkpoint.json", journal_size=8192, boot_id=BOOT)
    cp.load()
    claims: dict[str, PreparedClaim] = {uid(i): claim(current, uid(i), i) for i in range(2)}
    cp.save(dict(claims))  # the snapshot holds two claims; the journal records below change them
    claims[uid(2)] = claim(current, uid(2), 2, "PrepareStarted")
    cp.save(dict(claims), durable=False)
    claims[uid(2)] = claims[uid(2)].with_state(ClaimState.PREPARE_COMPLETED)
    cp.save(dict(claims))
    del claims[uid(0)]
    cp.save(dict(claims))
    expected = Checkpoint(cp.path, boot_id=BOOT).read()
    assert expected == claims
    snapshot, journal = cp.path.read_bytes(), cp.journal_path.read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    counts = {"mutations": 0, "errors": 0, "unchanged": 0}
    target = Checkpoint(work / "checkpoint.json", boot_id=BOOT)
    for name, original, other, limit in (("checkpoint.json", snapshot, journal, len(snapshot)),
                                         ("checkpoint.json.journal", journal, snapshot,
                                          len(journal.rstrip(b"\0")) + SECTOR)):
        other_name = "checkpoint.json.journal" if name == "checkpoint.json" else "checkpoint.json"
        for position in range(limit):
            for mask in ((0x01, 0x20, 0x80)[position % 3],):
                mutated = bytearray(original)
                mutated[position] ^= mask
                (work / name).write_bytes(bytes(mutated))
                (work / other_name).write_bytes(other)
                counts["mutations"] += 1
                try:
                    loaded = target.read()
                except CheckpointError:
                    counts["errors"] += 1
                    continue
                assert loaded == expected, f"{name} byte {position} ^ {mask:#x} changed the claims silently"
                counts["unchanged"] += 1
    print(f"single-byte mutations: {counts}")
    assert counts["errors"] > 0 and counts["unchanged"] > 0
