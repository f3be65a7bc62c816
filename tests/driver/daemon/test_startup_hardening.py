"""Issue 14 items 4 and 9 (daemon side): bad files at start-up end in a log line or a clear start-up error, never a
traceback: a CDI spec with invalid UTF-8 (or a directory in its place), deeply nested or bad-uid checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims.checkpoint import (
    JOURNAL_SUFFIX,
    Checkpoint,
    ClaimState,
    PreparedClaim,
    _canonical,
    _checksum,
    _line,
    encode,
)
from tests.support import pluginclient
from tests.support.driver import DRIVER, DaemonDirs, DaemonProcess, claim, devices, uid, wait_until
from tests.support.pluginclient import ClaimRef

pytestmark = [pytest.mark.attacks, pytest.mark.process]


def prepared_once(dirs: DaemonDirs, host_root: Path, *refs: ClaimRef) -> None:
    for i, r in enumerate(refs):
        dirs.put_claim(claim(r.name, r.uid, devices(i)))
    d = DaemonProcess(dirs, host_root).wait_ready()
    client = pluginclient.DraClient(dirs.dra_socket)
    try:
        assert all(not x.error for x in client.prepare(refs, timeout=20).values())
    finally:
        client.close()
        assert d.terminate() == 0


def test_cdi_spec_with_invalid_utf8_is_quarantined_and_rewritten(dirs: DaemonDirs, host_root: Path) -> None:
    c1, c2 = ClaimRef("default", "c1", uid(1)), ClaimRef("default", "c2", uid(2))
    prepared_once(dirs, host_root, c1, c2)
    spec1, spec2 = dirs.cdi / f"{DRIVER}_{uid(1)}.json", dirs.cdi / f"{DRIVER}_{uid(2)}.json"
    good = spec1.read_text()
    spec1.write_bytes(b'{"cdiVersion": "\xff\xfe"}')  # invalid UTF-8
    spec2.unlink()
    spec2.mkdir()  # not even a file
    orphan = dirs.cdi / f"{DRIVER}_{uid(3)}.json"
    orphan.write_bytes(b"\xff\xff")  # no checkpoint entry, unreadable: removed
    d = DaemonProcess(dirs, host_root).wait_ready()
    try:
        assert spec1.read_text() == good
        assert spec2.is_file() and json.loads(spec2.read_text())["kind"]
        assert not orphan.exists()
        quarantined = sorted(p.name for p in dirs.cdi.iterdir() if ".unreadable-" in p.name)
        assert len(quarantined) == 2 and all(q.startswith(".") for q in quarantined), quarantined
        warnings = [r for r in d.log_records() if r["msg"].startswith("unreadable CDI spec")]
        assert {r["claim"] for r in warnings} == {uid(1), uid(2)}
        assert "UnicodeDecodeError" in next(r["error"] for r in warnings if r["claim"] == uid(1))
        assert "Traceback" not in d.log()
    finally:
        assert d.terminate() == 0


def write_checkpoint(dirs: DaemonDirs, claims: object) -> None:
    dirs.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    doc = {"checksum": _checksum(_canonical(claims)), "preparedClaims": claims, "version": 1}
    dirs.checkpoint.write_text(json.dumps(doc))


@pytest.mark.parametrize(("case", "expected"), [
    ("deeply nested", "nested deeper"),
    ("bad uid, valid checksum", "is not allowed"),
    ("huge uid, valid checksum", "characters)"),
    ("entry not an object", "malformed entry"),
])
def test_bad_checkpoints_stop_start_up_with_a_reason_not_a_traceback(dirs: DaemonDirs, host_root: Path, case: str,
                                                                      expected: str) -> None:
    if case == "deeply nested":
        dirs.checkpoint.parent.mkdir(parents=True)
        dirs.checkpoint.write_text('{"version": 1, "preparedClaims": ' + "[" * 100000 + "]" * 100000 + "}")
    elif case == "bad uid, valid checksum":
        write_checkpoint(dirs, {"../../etc/passwd": {"namespace": "a", "name": "b"}})
    elif case == "huge uid, valid checksum":
        write_checkpoint(dirs, {"x" * 1_000_000: {}})
    else:
        write_checkpoint(dirs, {uid(1): [1, 2, 3]})
    d = DaemonProcess(dirs, host_root)
    assert d.wait_exit() == 1
    log = d.log()
    assert "Traceback" not in log
    error = next(r for r in d.log_records() if r["msg"] == "start-up failed")["error"]
    assert str(dirs.checkpoint) in error and expected in error, error
    assert len(error) < 1000, len(error)  # values are echoed capped


def test_a_crafted_journal_record_with_a_bad_uid_stops_start_up_with_the_reason(dirs: DaemonDirs,
                                                                                 host_root: Path) -> None:
    """The journal's records are checksummed like the snapshot: a valid checksum over a uid that names no claim
    (it would name a file outside the CDI dir) is refused as corruption, not a traceback."""
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_bytes(encode({}, "g1"))
    record = _line({"generation": "g1", "ops": [["put", "../../etc/x" * 1000, {}]], "synced": True})
    journal = dirs.checkpoint.with_name(dirs.checkpoint.name + JOURNAL_SUFFIX)
    journal.write_bytes(record + bytes(4096))
    d = DaemonProcess(dirs, host_root)
    assert d.wait_exit() == 1
    assert "Traceback" not in d.log()
    error = next(r for r in d.log_records() if r["msg"] == "start-up failed")["error"]
    assert "malformed journal record" in error and "is not allowed" in error and len(error) < 1000, error


@pytest.mark.parametrize("case", ["allocation a list", "nested 100,000 deep", "results a string"])
def test_a_malformed_claim_of_an_unfinished_prepare_does_not_stop_start_up(dirs: DaemonDirs, host_root: Path,
                                                                            case: str) -> None:
    """An unfinished prepare in the checkpoint (an earlier release killed between its two records, or a claim
    that damaged journal bytes demoted); by the restart the claim's answer is malformed. The daemon serves and
    keeps running (a raise here was an exit 1 on every restart: a crash loop), logs which claim could not be
    checked and why, and kubelet's retry of that claim gets a clear per-claim error."""
    c1 = ClaimRef("default", "c1", uid(1))
    dirs.put_claim(claim("c1", uid(1), devices(4)))
    dirs.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    recorded = Checkpoint(dirs.checkpoint)
    recorded.load()
    recorded.save({uid(1): PreparedClaim(uid(1), "default", "c1", ClaimState.PREPARE_STARTED, (), (4,), "{}", 0.0)})
    recorded.close(compact=False)
    path = dirs.claims / "default_c1.json"
    if case == "nested 100,000 deep":
        path.write_text('{"metadata": {"uid": "' + uid(1) + '"}, "status": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        doc = claim("c1", uid(1), devices(4))
        if case == "allocation a list":
            doc["status"]["allocation"] = [doc["status"]["allocation"]]
        else:
            doc["status"]["allocation"]["devices"]["results"] = "neuron-device-4"
        path.write_text(json.dumps(doc))
    d = DaemonProcess(dirs, host_root).wait_ready()
    try:
        warning = wait_until(lambda: next((r for r in d.log_records()
                                           if r["msg"].startswith("cannot check an unfinished prepare")), None),
                             what="the warning about the unfinished prepare")
        assert warning["claim"] == uid(1) and len(warning["error"]) < 1000
        assert ("status.allocation" in warning["error"]) or ("RecursionError" in warning["error"])
        client = pluginclient.DraClient(dirs.dra_socket)
        try:
            error = client.prepare([c1], timeout=20)[uid(1)].error
        finally:
            client.close()
        assert ("status.allocation" in error or "RecursionError" in error) and len(error) < 1000, error
        assert d.proc.poll() is None and "Traceback" not in d.log()
    finally:
        assert d.terminate() == 0
