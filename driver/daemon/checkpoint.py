"""The crash-safe record of prepared claims: `<plugins dir>/<driver>/checkpoint.json` and its journal.

Unprepare must work after a restart from these files alone (the claim object may be gone), so they hold
everything: the answer given to kubelet, the devices the claim holds, and the CDI spec text (rewritten at start
and on every repeated prepare, since the CDI directory is tmpfs). The snapshot is versioned and checksummed and
replaced atomically; changes between snapshots are records in a journal written in place (see `Checkpoint`):
one fdatasync makes a change durable. A prepare is recorded twice: as PrepareStarted before its CDI spec is
written and as PrepareCompleted, synced, before kubelet gets the answer, so a crash in between leaves an entry
the next start can clean up. The PrepareStarted record is not synced: it survives a crash of the daemon (it is
in the page cache), and what a power loss could cost is a spec in /var/run/cdi, which is tmpfs and gone as well
(specs elsewhere are found by the orphan scan at start). Removals are synced. What each system call guarantees:
docs/durability.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from neuron_dra.driver.daemon.atomicfile import remove_temp_files, write_atomic
from neuron_dra.driver.daemon.cdi import CdiError, check_claim_uid
from neuron_dra.driver.model import k8s_names
from neuron_dra.driver.model.errortext import shown

CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = k8s_names.CHECKPOINT_FILE


class CheckpointError(RuntimeError):
    """The checkpoint cannot be read; names the file and the problem. The daemon refuses to start rather
    than forget prepared claims."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedDevice:
    """One entry of the answer to kubelet."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"requestNames": list(self.request_names), "poolName": self.pool_name,
                "deviceName": self.device_name, "cdiDeviceIds": list(self.cdi_device_ids)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PreparedDevice:
        return cls(tuple(d["requestNames"]), d["poolName"], d["deviceName"], tuple(d["cdiDeviceIds"]))


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...]
    neuron_indexes: tuple[int, ...]  # Neuron devices held exclusively (admin-access devices are not)
    cdi_spec: str  # the exact spec file text (stored as a string: rewrites reproduce the file byte for byte)
    prepared_at: float  # unix time of the prepare that recorded it
    # Physical NeuronCores held (global ids: device d owns d*c .. d*c+c-1, c = physical cores per device); None
    # (entries written before core partitions): every core of neuron_indexes.
    neuron_cores: tuple[int, ...] | None = None

    def with_state(self, state: ClaimState) -> PreparedClaim:
        return PreparedClaim(self.uid, self.namespace, self.name, state, self.devices, self.neuron_indexes,
                             self.cdi_spec, self.prepared_at, self.neuron_cores)

    @cached_property
    def canonical_json(self) -> str:
        """This entry as canonical JSON (sorted keys, no spaces): what the checkpoint file holds."""
        return _canonical(self.to_json())

    def to_json(self) -> dict[str, Any]:
        out = {
            "namespace": self.namespace, "name": self.name, "state": self.state.value,
            "devices": [d.to_json() for d in self.devices], "neuronDevices": list(self.neuron_indexes),
            "cdiSpec": self.cdi_spec, "preparedAt": self.prepared_at,
        }
        if self.neuron_cores is not None:
            out["neuronCores"] = list(self.neuron_cores)
        return out

    @classmethod
    def from_json(cls, uid: str, d: Mapping[str, Any]) -> PreparedClaim:
        cores = d.get("neuronCores")
        return cls(uid, d["namespace"], d["name"], ClaimState(d["state"]),
                   tuple(PreparedDevice.from_json(x) for x in d["devices"]), tuple(int(i) for i in d["neuronDevices"]),
                   _spec(d["cdiSpec"]), float(d["preparedAt"]), None if cores is None else tuple(int(c) for c in cores))


def _spec(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"cdiSpec must be the spec file's text, got {type(value).__name__}")
    return value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _checksum(canonical_claims: str) -> str:
    return "sha256:" + hashlib.sha256(canonical_claims.encode("utf-8")).hexdigest()


def encode(claims: Mapping[str, PreparedClaim], journal: str | None = None) -> bytes:
    """The file: {"checksum", "journal", "preparedClaims", "version"}, the checksum taken over the canonical JSON
    of preparedClaims (sorted keys, no spaces), which is also exactly how it is written; `journal` (optional)
    names the generation of the journal records that apply on top. Each claim's canonical text is computed once
    per entry, so a save costs a join and a hash, not a re-encoding of every claim."""
    canonical = "{" + ",".join(f"{json.dumps(uid)}:{claims[uid].canonical_json}" for uid in sorted(claims)) + "}"
    generation = f'"journal":{json.dumps(journal)},' if journal is not None else ""
    return (f'{{"checksum":"{_checksum(canonical)}",{generation}"preparedClaims":{canonical},'
            f'"version":{CHECKPOINT_VERSION}}}\n').encode()


def decode(path: Path, raw: bytes) -> dict[str, PreparedClaim]:
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not JSON ({str(e)[:200]}); the file is corrupt") from None
    except RecursionError:
        raise CheckpointError(path, "nested deeper than any checkpoint this driver writes; corrupt") from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, "expected a JSON object")
    version = doc.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(path, f"checkpoint version {shown(version)} is not supported; this driver reads version "
                                    f"{CHECKPOINT_VERSION} (was it written by a newer driver?)")
    data = doc.get("preparedClaims")
    if not isinstance(data, dict):
        raise CheckpointError(path, "field 'preparedClaims' must be an object")
    if doc.get("checksum") != _checksum(_canonical(data)):
        raise CheckpointError(path, f"checksum mismatch (recorded {shown(doc.get('checksum'))}); the file is corrupt")
    claims = {}
    for uid, entry in data.items():
        try:
            # The uid names files (CDI specs): one that could not have been written by prepare is refused here.
            check_claim_uid(uid)
            claims[uid] = PreparedClaim.from_json(uid, entry)
        except CdiError as e:
            raise CheckpointError(path, f"bad claim entry: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise CheckpointError(path, f"malformed entry of claim {shown(uid)}: {shown(e)}") from None
    return claims


JOURNAL_SUFFIX = ".journal"
JOURNAL_SIZE = 4 * 1024 * 1024  # zero-filled once; ~1,000 prepare/unprepare cycles of 8-device claims per compaction


def _line(payload: dict[str, Any]) -> bytes:
    """One journal record: 16 hex digits of SHA-256 over the canonical JSON, a space, the JSON, a newline."""
    text = _canonical(payload)
    return f"{hashlib.sha256(text.encode()).hexdigest()[:16]} {text}\n".encode()


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The payload of a record `_line` wrote, or None when it is torn or damaged."""
    digest, _, text = line.partition(b" ")
    if len(digest) != 16 or hashlib.sha256(text).hexdigest()[:16].encode() != digest:
        return None
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


@dataclass(frozen=True)
class JournalContent:
    records: tuple[dict[str, Any], ...]  # the valid records of the generation asked for
    end: int  # offset after the last of them
    dirty_end: int  # offset after the last non-zero byte (beyond `end`: a torn tail or stale records)


def read_journal(path: Path, raw: bytes, generation: str) -> JournalContent:
    """The records of `generation` from the start of the journal. Reading stops at the first record that is
    damaged or of another generation (stale bytes of an earlier one): only what follows the last fdatasync can be
    torn by a power loss, and every record before a synced one was synced with it, so a damaged record followed
    by a synced record of this generation means corruption."""
    dirty_end = len(raw.rstrip(b"\0"))
    records: list[dict[str, Any]] = []
    offset = 0
    while offset < dirty_end:
        newline = raw.find(b"\n", offset, dirty_end)
        payload = _parse_line(raw[offset:newline]) if newline >= 0 else None
        if payload is None or payload.get("generation") != generation:
            break
        records.append(payload)
        offset = newline + 1
    for line in raw[offset:dirty_end].split(b"\n")[1:]:
        later = _parse_line(line)
        if later is not None and later.get("generation") == generation and later.get("synced"):
            raise CheckpointError(path, f"journal record at offset {offset} is damaged and synced records follow "
                                        "it; the file is corrupt")
    return JournalContent(tuple(records), offset, dirty_end)


def _apply(claims: dict[str, PreparedClaim], ops: list[Any], path: Path) -> None:
    try:
        for op in ops:
            kind, uid = op[0], op[1]
            check_claim_uid(uid)  # names CDI files: a crafted record must not (CdiError is a ValueError)
            if kind == "put":
                claims[uid] = PreparedClaim.from_json(uid, op[2])
            elif kind == "state":
                claims[uid] = claims[uid].with_state(ClaimState(op[2]))
            elif kind == "delete":
                claims.pop(uid, None)
            else:
                raise ValueError(f"unknown journal operation {kind!r}")
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise CheckpointError(path, f"malformed journal record: {type(e).__name__}: {str(e)[:500]}") from None


class Checkpoint:
    """A snapshot (`checkpoint.json`, replaced atomically) and a journal beside it (`checkpoint.json.journal`).

    Every save writes one record of what changed into the journal, in place, into a file that was zero-filled
    and fsynced when it was created: a durable save needs one fdatasync, which flushes data only (the file's
    size and blocks do not change), and no temp file, rename or directory fsync. When the journal is full, at
    start and at close, the whole state becomes the new snapshot (atomic replace, fsynced with its directory)
    naming a new random journal generation, and the journal's records are zeroed. Only records of the
    snapshot's generation replay, so a reset cut short, stale bytes or a torn tail never do.
    """

    def __init__(self, path: Path, journal_size: int = JOURNAL_SIZE) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + JOURNAL_SUFFIX)
        self._journal_size = journal_size
        self._fd: int | None = None
        self._limit = journal_size
        self._offset = 0
        self._generation = ""
        self._saved: dict[str, PreparedClaim] = {}

    def read(self) -> dict[str, PreparedClaim]:
        """The recorded claims (snapshot plus journal) without changing any file; absent files are empty."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, PreparedClaim], JournalContent | None]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, None
        claims = decode(self.path, raw)
        generation = json.loads(raw).get("journal")
        if not isinstance(generation, str):
            return claims, None
        try:
            journal_raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            return claims, None
        journal = read_journal(self.journal_path, journal_raw, generation)
        for record in journal.records:
            _apply(claims, record.get("ops") or [], self.journal_path)
        return claims, journal

    def load(self) -> dict[str, PreparedClaim]:
        """The recorded claims; removes temp files of interrupted writes and clears a torn journal tail, so that
        new records follow the valid ones."""
        remove_temp_files(self.path.parent, self.path.name)
        self.close(compact=False)
        claims, journal = self._read()
        self._saved = dict(claims)
        if journal is None:
            if self.path.exists() or self.journal_path.exists():
                self._compact(claims)  # no journal of this snapshot yet: start one
            return claims
        self._fd = os.open(self.journal_path, os.O_RDWR | os.O_CLOEXEC)
        self._limit = os.fstat(self._fd).st_size
        self._generation = json.loads(self.path.read_bytes())["journal"]
        self._offset = journal.end
        if journal.dirty_end > journal.end:  # a torn tail or stale records: cleared, never mistaken for records
            os.pwrite(self._fd, bytes(journal.dirty_end - journal.end), journal.end)
            os.fdatasync(self._fd)
        return claims

    def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True,
             before_rename: Callable[[], None] | None = None) -> None:
        """Record `claims` as the new state; `durable` makes it survive a power loss, not only a crash of the
        daemon. `before_rename` is a crash-injection hook, called before anything changes on disk."""
        if before_rename is not None:
            before_rename()
        if self._fd is None:
            self._compact(claims)
            return
        ops: list[Any] = []
        saved = self._saved
        for uid, claim in claims.items():
            old = saved.get(uid)
            if old is claim:
                continue
            if old is not None and old.with_state(claim.state) == claim:
                ops.append(["state", uid, claim.state.value])
            else:
                ops.append(["put", uid, claim.to_json()])
        ops.extend(["delete", uid] for uid in saved if uid not in claims)
        line = _line({"generation": self._generation, "ops": ops, "synced": durable})
        if self._offset + len(line) > self._limit:
            self._compact(claims)
            return
        try:
            os.pwrite(self._fd, line, self._offset)
            if durable:
                os.fdatasync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):  # best effort: a record that failed must not replay
                os.pwrite(self._fd, bytes(len(line)), self._offset)
            raise
        self._offset += len(line)
        self._saved = dict(claims)

    def _compact(self, claims: Mapping[str, PreparedClaim]) -> None:
        """`claims` as the snapshot (durable) under a new journal generation, then the journal's records zeroed."""
        if self._fd is None:
            if not self.journal_path.exists():
                write_atomic(self.journal_path, bytes(self._journal_size), mode=0o600, durable=True)
            self._fd = os.open(self.journal_path, os.O_RDWR | os.O_CLOEXEC)
            self._limit = os.fstat(self._fd).st_size
        generation = secrets.token_hex(8)
        write_atomic(self.path, encode(claims, generation), mode=0o600, durable=True)
        self._generation = generation
        used = min(self._offset, self._limit)
        if used:
            os.pwrite(self._fd, bytes(used), 0)  # tidiness only: old records are of another generation
            os.fdatasync(self._fd)
        self._offset = 0
        self._saved = dict(claims)

    def close(self, *, compact: bool = True) -> None:
        """Fold the journal into the snapshot (checkpoint.json alone is then complete) and close it."""
        if self._fd is None:
            return
        try:
            if compact and self._offset:
                self._compact(self._saved)
        finally:
            os.close(self._fd)
            self._fd = None
