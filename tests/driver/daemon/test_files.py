"""The Neuron driver's files: CDI specs and the checkpoint format. (The layer's generated code, wire contract
and atomic writes: tests/driver/kubeletplugin/test_files.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims.cdi import (
    CDI_KIND,
    CdiDevice,
    CdiError,
    CdiStore,
    DeviceNode,
    build_spec,
    minimum_version,
    spec_text,
)
from neuron_dra.driver.daemon.claims.checkpoint import (
    CHECKPOINT_VERSION,
    JOURNAL_SIZE,
    SECTOR,
    Checkpoint,
    CheckpointError,
    ClaimState,
    PreparedClaim,
    PreparedDevice,
    decode_snapshot,
    encode,
)
from neuron_dra.driver.model.neuron_env import core_ranges

# --- CDI -------------------------------------------------------------------------------------------------------


def test_minimum_cdi_version_follows_the_fields_used() -> None:
    plain = {"kind": CDI_KIND, "devices": [{"name": "a", "containerEdits": {"env": ["X=1"]}}]}
    assert minimum_version(plain) == "0.3.0"
    digit = {"kind": CDI_KIND, "devices": [{"name": "1a", "containerEdits": {"env": ["X=1"]}}]}
    assert minimum_version(digit) == "0.5.0"
    host_path = build_spec([CdiDevice("a", device_nodes=(DeviceNode("/dev/neuron0", "/dev/neuron0", 239, 0),))])
    assert host_path["cdiVersion"] == "0.5.0"
    mount_type = {"kind": CDI_KIND, "devices": [{"name": "a", "containerEdits": {
        "mounts": [{"hostPath": "/x", "containerPath": "/x", "type": "bind"}]}}]}
    assert minimum_version(mount_type) == "0.4.0"
    assert minimum_version({**plain, "annotations": {"a": "b"}}) == "0.6.0"
    assert minimum_version({"kind": CDI_KIND, "containerEdits": {"additionalGids": [5]}, "devices": []}) == "0.7.0"


@pytest.mark.parametrize("name", ["-a", "a-", "a/b", "a b", "", "ä"])
def test_cdi_device_names_are_checked(name: str) -> None:
    with pytest.raises(CdiError, match="CDI device name"):
        CdiDevice(name)


def test_duplicate_names_in_one_spec_are_refused() -> None:
    with pytest.raises(CdiError, match="duplicate"):
        build_spec([CdiDevice("a"), CdiDevice("a")])


def test_store_names_files_by_driver_and_claim_and_refuses_path_tricks(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, "neuron.aws.com")
    text = spec_text(build_spec([CdiDevice("u1-x", env=("A=1",))]))
    store.write("u1", text)
    path = store.path_for("u1")
    assert path == tmp_path / "neuron.aws.com_u1.json" and path.read_text() == text
    assert path.stat().st_mode & 0o777 == 0o644
    (tmp_path / "other_u2.json").write_text("{}")
    assert store.claim_uids() == {"u1"}
    with pytest.raises(CdiError, match="not allowed"):
        store.path_for("../u1")
    assert store.remove("u1") and not store.remove("u1")


def test_spec_text_is_canonical() -> None:
    spec = build_spec([CdiDevice("x", env=("B=2", "A=1"))])
    assert spec_text(json.loads(spec_text(spec))) == spec_text(spec)


# --- checkpoint ------------------------------------------------------------------------------------------------

def entry(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> PreparedClaim:
    spec = spec_text(build_spec([CdiDevice(f"{uid}-d", env=("A=1",))]))
    return PreparedClaim(uid, "ns", "name", state, (PreparedDevice(("r",), "pool", "neuron-device-0",
                                                                   (f"{CDI_KIND}={uid}-d",)),), (0,), spec, 1.5)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    assert cp.load() == {}
    claims = {"u1": entry("u1"), "u2": entry("u2", ClaimState.PREPARE_STARTED)}
    cp.save(claims)
    assert cp.load() == claims
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["version"] == CHECKPOINT_VERSION and doc["journal"]  # the claims are in the journal
    assert doc["checksum"].startswith("sha256:")
    assert (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600
    cp.close()  # a clean stop: the snapshot alone, version 1
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["version"] == 1 and "journal" not in doc
    assert encode(cp.read(), None, doc["bootId"]) == (tmp_path / "checkpoint.json").read_bytes()


def test_checkpoint_journal_one_record_per_save_and_replay(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.load()  # a snapshot and a journal, also on a node that had none
    snapshot = cp.path.read_bytes()
    started = entry("u1", ClaimState.PREPARE_STARTED)
    cp.save({"u1": started}, durable=False)
    cp.save({"u1": started.with_state(ClaimState.PREPARE_COMPLETED)})
    cp.save({"u1": started.with_state(ClaimState.PREPARE_COMPLETED), "u2": entry("u2")})
    cp.save({"u2": entry("u2")})
    assert cp.path.read_bytes() == snapshot  # the saves only wrote the journal
    assert cp.journal_path.stat().st_size == JOURNAL_SIZE  # written in place: size and blocks never change
    records = cp.journal_path.read_bytes().rstrip(b"\0").split(b"\n")[:-1]
    # A change of state is the whole entry again: each record says all it changes.
    assert len(records) == 4 and b'["put","u1",{' in records[1] and b'"PrepareCompleted"' in records[1]
    assert b'"delete","u1"' in records[3]
    assert Checkpoint(cp.path).read() == {"u2": entry("u2")}  # what a crash leaves: snapshot + journal
    cp.close()  # folds the journal into the snapshot
    assert decode_snapshot(cp.path, cp.path.read_bytes()).claims == {"u2": entry("u2")}
    assert cp.journal_path.read_bytes().rstrip(b"\0") == b""


def test_checkpoint_journal_torn_tail_is_not_replayed_and_cleared(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.load()
    cp.save({"u1": entry("u1")})
    cp.save({"u1": entry("u1"), "u2": entry("u2")})
    raw = cp.journal_path.read_bytes()
    end = len(raw.rstrip(b"\0"))
    cp.save({"u2": entry("u2")}, durable=False)
    with cp.journal_path.open("r+b") as f:  # a power loss tore the unsynced record: its first sector reached the disk
        torn = f.read()[end:len(cp.journal_path.read_bytes().rstrip(b"\0"))]
        kept = SECTOR - end % SECTOR
        assert kept < len(torn)
        f.seek(end)
        f.write(torn[:kept] + bytes(len(torn) - kept))
    restarted = Checkpoint(cp.path)
    unfinished = {u: entry(u, ClaimState.PREPARE_STARTED) for u in ("u1", "u2")}
    assert restarted.load() == unfinished  # left to the API server (DriverState.resolve_unfinished)
    assert cp.journal_path.read_bytes().strip(b"\0") == b""  # a new snapshot, the journal zeroed
    restarted.save({})
    assert Checkpoint(cp.path).read() == {}


def test_checkpoint_journal_damage_before_a_synced_record_replays_only_the_valid_records(tmp_path: Path) -> None:
    """A flipped byte in the first record; records after it are valid: they apply (each says all it changes),
    the damaged one never does."""
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.load()
    cp.save({"u1": entry("u1")})
    cp.save({"u1": entry("u1"), "u2": entry("u2")})
    cp.save({"u2": entry("u2")})
    with cp.journal_path.open("r+b") as f:
        f.seek(30)
        f.write(b"X")
    assert Checkpoint(cp.path).load() == {"u2": entry("u2")}


def test_checkpoint_journal_full_compacts_into_the_snapshot(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", journal_size=4096)
    cp.load()
    state: dict[str, PreparedClaim] = {}
    for i in range(40):  # a few records fill 4 KiB: several compactions
        state = {f"u{i}": entry(f"u{i}")} if i % 2 == 0 else {}
        cp.save(state)
        assert Checkpoint(cp.path).read() == state
    assert len(json.loads(cp.path.read_text())["preparedClaims"]) <= 1


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["preparedClaims"]["u1"].update(namespace="other"), "integrity digest mismatch"),
    (lambda d: [d.pop(k) for k in ("bootId", "format", "integrity")] + [d.update(version=1),
                d["preparedClaims"]["u1"].update(namespace="other")], "checksum mismatch"),  # a format-1 file
    (lambda d: d.update(version=3), "version 3 is not supported"),
    (lambda d: d.update(preparedClaims=[]), "must be an object"),
])
def test_checkpoint_errors_name_the_file_and_problem(tmp_path: Path, mutate: object, message: str) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.save({"u1": entry("u1")})
    doc = json.loads(cp.path.read_text())
    mutate(doc)  # type: ignore[operator]
    cp.path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=message) as info:
        cp.load()
    assert str(cp.path) in str(info.value)


def test_truncated_checkpoint_is_reported(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.save({"u1": entry("u1")})
    cp.path.write_bytes(cp.path.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="not JSON"):
        cp.load()


def test_core_ranges() -> None:
    assert core_ranges([]) == ""
    assert core_ranges([5]) == "5"
    assert core_ranges([3, 0, 1, 2, 8, 9, 11]) == "0-3,8-9,11"
