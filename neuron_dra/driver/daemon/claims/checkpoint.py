"""The crash-safe record of prepared claims: `<plugins dir>/<driver>/checkpoint.json` and its journal.

Unprepare must work after a restart from these files alone (the claim may be gone), so they hold the answer given
to kubelet, the devices held and the CDI spec text (rewritten at start: the CDI directory is tmpfs). The snapshot
is versioned, checksummed and replaced atomically; changes between snapshots are journal records written in place
(`Checkpoint`), one fdatasync each. A prepare writes its CDI spec, then one record, PrepareCompleted, synced,
before kubelet gets the answer: a crash in between leaves a spec that no entry knows, which the next start removes
(the orphan scan), as the Go example driver's (docs/durability.md). PrepareStarted entries still load (written by
earlier releases, or claims that damaged journal bytes may have changed) and are resolved against the API server.
Removals are synced. Unprepares are noted in the records too (`unprepared`), so that the other instance of a
rolling update refuses a prepare that began before one of them (docs/upgrades.md).
Guarantees per system call: docs/durability.md; the format and its versions: docs/checkpoint-format.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from neuron_dra.driver.daemon.claims.cdi import CdiError, check_claim_uid
from neuron_dra.driver.errortext import shown
from neuron_dra.driver.kubeletplugin.toolkit import remove_temp_files, write_atomic
from neuron_dra.driver.model import k8s_names

log = logging.getLogger(__name__)

# `format`: what this release writes. `version`: the oldest reader that can load the file and verify all of it.
# Format 1's reader (the previous release) checks `version` and the checksum over preparedClaims but trusts the
# `journal` field unchecked (a changed digit there drops the journal), so a snapshot that names a journal is
# version 2, which that reader refuses as a future version; the journal-less snapshot written at a clean stop and
# at a hand-over to the previous release (`hand_over`) is version 1, all of which format 1 verifies.
CHECKPOINT_FORMAT = 3
CHECKPOINT_VERSION = 2  # a snapshot with a journal
JOURNAL_LESS_VERSION = 1  # a snapshot alone: what the previous release can read
READ_VERSIONS = (JOURNAL_LESS_VERSION, CHECKPOINT_VERSION)
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_FORMAT_1_KEYS = frozenset({"checksum", "journal", "preparedClaims", "version"})
_FORMAT_2_KEYS = _FORMAT_1_KEYS | {"bootId", "format", "integrity"}
_FORMAT_3_KEYS = _FORMAT_2_KEYS  # "journal" only with version 2
SECTOR = 512  # the unit a power loss can leave unwritten (what the tests tear)
# Pods recorded per claim (status.reservedFor allows 256): bounds a record and the metrics' series per claim.
MAX_CONSUMERS = 32


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
    # The pods the claim was reserved for when it was prepared (status.reservedFor, in the claim's namespace), at
    # most MAX_CONSUMERS of them, and how many more there were: what the attribution metrics name.
    consumers: tuple[str, ...] = ()
    consumers_omitted: int = 0

    def with_state(self, state: ClaimState) -> PreparedClaim:
        return dataclasses.replace(self, state=state)

    @cached_property
    def canonical_json(self) -> str:
        """This entry as canonical JSON (sorted keys, no spaces): what the checkpoint file holds."""
        return _canonical(self.to_json())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace": self.namespace, "name": self.name, "state": self.state.value,
            "devices": [d.to_json() for d in self.devices], "neuronDevices": list(self.neuron_indexes),
            "cdiSpec": self.cdi_spec, "preparedAt": self.prepared_at,
        }
        if self.neuron_cores is not None:
            out["neuronCores"] = list(self.neuron_cores)
        if self.consumers:
            out["consumers"] = list(self.consumers)
        if self.consumers_omitted:
            out["consumersOmitted"] = self.consumers_omitted
        return out

    @classmethod
    def from_json(cls, uid: str, d: Mapping[str, Any]) -> PreparedClaim:
        cores = d.get("neuronCores")
        consumers = tuple(_consumer(c) for c in d.get("consumers", ()))
        if len(consumers) > MAX_CONSUMERS:
            raise ValueError(f"consumers lists {len(consumers)} pods, more than the {MAX_CONSUMERS} ever recorded")
        return cls(uid, d["namespace"], d["name"], ClaimState(d["state"]),
                   tuple(PreparedDevice.from_json(x) for x in d["devices"]), tuple(int(i) for i in d["neuronDevices"]),
                   _spec(d["cdiSpec"]), float(d["preparedAt"]), None if cores is None else tuple(int(c) for c in cores),
                   consumers, int(d.get("consumersOmitted", 0)))


def _consumer(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > k8s_names.DNS_SUBDOMAIN_MAX:
        raise ValueError(f"consumers: {shown(value)} is not a pod name")
    return value


def _spec(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"cdiSpec must be the spec file's text, got {type(value).__name__}")
    return value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _checksum(canonical_claims: str) -> str:
    return "sha256:" + hashlib.sha256(canonical_claims.encode("utf-8")).hexdigest()


def _integrity(doc: Mapping[str, Any]) -> str:
    """SHA-256 over the canonical JSON of every field but itself: everything that decides what loads."""
    return _checksum(_canonical({k: v for k, v in doc.items() if k != "integrity"}))


def encode(claims: Mapping[str, PreparedClaim], journal: str | None = None, boot_id: str = "") -> bytes:
    """The file: {"bootId", "checksum", "format", "integrity", "journal", "preparedClaims", "version"}, in canonical
    JSON (sorted keys, no spaces). `checksum` covers preparedClaims (what format 1 checks); `integrity` covers every
    other field too, the journal generation included. `journal` names the generation of the journal records that
    apply on top; without it the file is version 1 (the previous release can read and verify all of it), with it
    version 2. Each claim's canonical text is computed once per entry, so a save costs a join and two hashes, not
    a re-encoding of every claim."""
    canonical = "{" + ",".join(f"{json.dumps(uid)}:{claims[uid].canonical_json}" for uid in sorted(claims)) + "}"
    head = {"bootId": boot_id, "checksum": _checksum(canonical), "format": CHECKPOINT_FORMAT}
    if journal is not None:
        head["journal"] = journal
    fields = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in head.items())
    tail = f'"version":{JOURNAL_LESS_VERSION if journal is None else CHECKPOINT_VERSION}'
    # The integrity digest over the same canonical text, with the claims spliced in rather than re-encoded.
    covered = "{" + fields + f',"preparedClaims":{canonical},' + tail + "}"
    integrity = _checksum(covered)
    return (f'{{{fields},"integrity":"{integrity}","preparedClaims":{canonical},{tail}}}\n').encode()


@dataclass(frozen=True)
class Snapshot:
    claims: dict[str, PreparedClaim]
    journal: str | None  # the generation of the journal records that apply, or None
    boot_id: str  # the node's boot id when it was written ("" in format 1)
    format: int


def decode_snapshot(path: Path, raw: bytes) -> Snapshot:
    """The snapshot of format 1 (the previous release), 2 or 3; CheckpointError for anything else, including any
    field that is not exactly what one of them writes (a damaged key must not pass for an absent one)."""
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not JSON ({str(e)[:200]}); the file is corrupt") from None
    except RecursionError:
        raise CheckpointError(path, "nested deeper than any checkpoint this driver writes; corrupt") from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, "expected a JSON object")
    version = doc.get("version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise CheckpointError(path, f"checkpoint version {shown(version)} is not supported; this driver reads versions "
                                    f"{READ_VERSIONS[0]}-{READ_VERSIONS[-1]} (formats 1-{CHECKPOINT_FORMAT}; was it "
                                    "written by a newer driver? roll forward, or drain the node before rolling back)")
    fmt = doc.get("format", 1)
    expected = {1: _FORMAT_1_KEYS, 2: _FORMAT_2_KEYS, 3: _FORMAT_3_KEYS}.get(fmt) if type(fmt) is int else None
    if expected is None:
        raise CheckpointError(path, f"checkpoint format {shown(fmt)} is not supported; this driver reads formats 1-"
                                    f"{CHECKPOINT_FORMAT}")
    if fmt < 3 and version != JOURNAL_LESS_VERSION:
        raise CheckpointError(path, f"checkpoint version {version} with format {fmt}: formats 1 and 2 are version "
                                    f"{JOURNAL_LESS_VERSION}; the file is corrupt")
    if fmt == 3:  # version 2 exactly when a journal applies
        expected = expected if version == CHECKPOINT_VERSION else expected - {"journal"}
    keys = set(doc)
    if not keys <= expected or (fmt >= 2 and keys != expected) or "preparedClaims" not in keys:
        raise CheckpointError(path, f"fields {shown(sorted(keys))} are not those of a format-{fmt} version-{version} "
                                    f"checkpoint ({sorted(expected)}); the file is corrupt")
    data = doc["preparedClaims"]
    if not isinstance(data, dict):
        raise CheckpointError(path, "field 'preparedClaims' must be an object")
    if fmt >= 2 and doc["integrity"] != _integrity(doc):
        raise CheckpointError(path, f"integrity digest mismatch (recorded {shown(doc['integrity'])}); the file is "
                                    "corrupt")
    if doc.get("checksum") != _checksum(_canonical(data)):
        raise CheckpointError(path, f"checksum mismatch (recorded {shown(doc.get('checksum'))}); the file is corrupt")
    journal, boot_id = doc.get("journal"), doc.get("bootId", "")
    if not (journal is None or isinstance(journal, str)) or not isinstance(boot_id, str):
        raise CheckpointError(path, "fields 'journal' and 'bootId' must be strings")
    claims = {}
    for uid, entry in data.items():
        try:
            # The uid names files (CDI specs): one that could not have been written by prepare is refused here.
            check_claim_uid(uid)
            claims[uid] = PreparedClaim.from_json(uid, entry)
        except CdiError as e:
            raise CheckpointError(path, f"bad claim entry: {e}") from e
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise CheckpointError(path, f"malformed entry of claim {shown(uid)}: {shown(e)}") from None
    return Snapshot(claims, journal, boot_id, fmt)


_REFRESH_READ = 64 * 1024  # what a refresh reads first of the other instance's records
_HEAD = 512  # bootId, checksum, format, integrity and journal come first (sorted keys): all within this
_JOURNAL_FIELD = re.compile(rb'"journal":"([0-9a-f]{16})"')


def _generation_of(head: bytes) -> str | None:
    """The journal generation named in the first bytes of a snapshot, or None."""
    found = _JOURNAL_FIELD.search(head.split(b'"preparedClaims"', 1)[0])
    return found.group(1).decode() if found else None


def current_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """The kernel's boot id (changes at every boot), or "" where there is none."""
    try:
        return path.read_text().strip()[:64]
    except OSError:
        return ""


JOURNAL_SUFFIX = ".journal"
# Unprepares noted (claim uid -> when the unprepare call arrived, time.monotonic_ns, which both instances on one node
# share): the newest UNPREPARED_MEMORY are remembered; a compaction carries those of the last UNPREPARED_CARRY ns.
UNPREPARED_MEMORY = 10_000
UNPREPARED_CARRY = 300 * 10**9  # kubelet gives a call 45 s: no prepare still in flight began earlier than this
UNPREPARED_CARRIED = 4096  # at most this many (the newest): ~250 KB of the journal
JOURNAL_SIZE = 4 * 1024 * 1024  # zero-filled once; hundreds of prepare/unprepare cycles of 8-device claims
_SCAN_PIECE = 64 * 1024  # what `_used_end` reads at a time


def _used_end(fd: int, size: int | None = None) -> int:
    """The offset after the last non-zero byte of the file (within its first `size` bytes): the end of the
    journal's used part, zeros after it. Read backwards a piece at a time: the journal is zero-filled to its full
    size, and reading all of it at once held that much memory (the daemon's peak at start, docs/benchmarks.md
    §1)."""
    end = os.fstat(fd).st_size if size is None else min(size, os.fstat(fd).st_size)
    while end > 0:
        start = max(0, end - _SCAN_PIECE)
        used = len(os.pread(fd, end - start, start).rstrip(b"\0"))  # all zeros: b"", nothing allocated
        if used:
            return start + used
        end = start
    return 0


def _read_used(fd: int, size: int | None = None) -> bytes:
    """The file's bytes up to its last non-zero one (within its first `size`): all that `read_journal` reads."""
    return os.pread(fd, _used_end(fd, size), 0)


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
class Damage:
    """Bytes of the journal that are neither a record of the snapshot's generation nor unused (zero): a write
    cut short by a power loss, or corruption. What they changed is unknown, so nothing in them is replayed."""

    offset: int  # file offset of the first damaged byte's record
    later: tuple[dict[str, Any], ...]  # valid records of the generation found after the damage, in order
    named: tuple[str, ...]  # claim uids that the damaged bytes name (for the log; a damaged byte may be in one)


@dataclass(frozen=True)
class JournalContent:
    records: tuple[dict[str, Any], ...]  # the valid records of the generation asked for, up to any damage
    end: int  # offset after the last of them
    dirty_end: int  # offset after the last non-zero byte (beyond `end`: damage or stale records)
    damage: Damage | None = None


_RECORD_START = rb"[0-9a-f]{16} \{\"generation\":\"%s\""
_NAMED_UID = re.compile(rb'\["(?:put|state|delete)","([A-Za-z0-9][A-Za-z0-9-]{0,127})"')
_NAMED_MAX = 64  # uids a damage report names


def read_journal(path: Path, raw: bytes, generation: str, start: int = 0, base: int = 0) -> JournalContent:
    """The records of `generation` from `start`. Reading stops at a valid record of another generation (stale
    bytes of an earlier one, zeroed afterwards) or at damage: anything else that is not zero, except what a clearing
    cut short leaves (no record of the generation, none named: `_names_generation`), which is stale. Damage is not
    dropped: it is returned with the valid records of the generation found after it (a damaged newline can join
    two records, so every place where one can start is tried) for the caller to resolve. `raw` holds the file's
    bytes from offset `base` on (offsets in and out are the file's)."""
    dirty_end = len(raw.rstrip(b"\0"))
    records: list[dict[str, Any]] = []
    offset = start - base
    while offset < dirty_end:
        newline = raw.find(b"\n", offset, dirty_end)
        payload = _parse_line(raw[offset:newline]) if newline >= 0 else None
        if payload is None:
            damage = _damage(raw, offset, dirty_end, generation, base)
            if offset + base == 0 and not damage.later and not _names_generation(raw, dirty_end, generation):
                return JournalContent((), 0, dirty_end + base)  # an interrupted clearing: stale bytes
            return JournalContent(tuple(records), offset + base, dirty_end + base, damage)
        if payload.get("generation") != generation:
            later = _records_after(raw, offset + 1, dirty_end, generation)
            if later:  # records of this generation after stale bytes: they were written over damage
                return JournalContent(tuple(records), offset + base, dirty_end + base,
                                      _damage(raw, offset, dirty_end, generation, base))
            break
        records.append(payload)
        offset = newline + 1
    return JournalContent(tuple(records), offset + base, dirty_end + base)


_NEAR = 2  # differing characters up to which a generation named in the journal counts as a damaged copy of it
_NEAR_CANDIDATES = 4096  # places checked before the bytes are judged to name it (bounds the search)


def _names_generation(raw: bytes, end: int, generation: str) -> bool:
    """Whether raw[:end] holds `generation` or a text differing from it in at most `_NEAR` characters: a record of
    the generation, whole or damaged. A journal without one, and without a valid record of it, holds only what a
    clearing cut short left of earlier generations (`_compact` zeroes them only after the snapshot naming the new
    generation is durable, and writes the first record of it only after the zeros are): not damage. A random
    earlier generation comes this close with odds of about 1e-15. Searched by pigeonhole: with at most `_NEAR`
    differences, one of `_NEAR + 1` pieces of the generation occurs unchanged."""
    target = generation.encode()
    cuts = [len(target) * i // (_NEAR + 1) for i in range(_NEAR + 2)]
    checked = 0
    for lo, hi in itertools.pairwise(cuts):
        piece = target[lo:hi]
        position = raw.find(piece, 0, end)
        while position >= 0:
            start = position - lo
            window = raw[start:start + len(target)] if start >= 0 else b""
            if len(window) == len(target) and sum(a != b for a, b in zip(window, target, strict=True)) <= _NEAR:
                return True
            checked += 1
            if checked > _NEAR_CANDIDATES:
                return True  # more look-alikes than records of earlier generations hold: not judged stale
            position = raw.find(piece, position + 1, end)
    return False


def _records_after(raw: bytes, offset: int, end: int, generation: str) -> list[dict[str, Any]]:
    """The valid records of `generation` that start anywhere in raw[offset:end], in order."""
    found = []
    pattern = re.compile(_RECORD_START % re.escape(generation.encode()))
    position = offset
    while (match := pattern.search(raw, position, end)) is not None:
        newline = raw.find(b"\n", match.start(), end)
        payload = _parse_line(raw[match.start():newline]) if newline >= 0 else None
        if payload is not None and payload.get("generation") == generation:
            found.append(payload)
            position = newline + 1
        else:
            position = match.start() + 1
    return found


def _damage(raw: bytes, offset: int, end: int, generation: str, base: int) -> Damage:
    named = dict.fromkeys(m.group(1).decode() for m in _NAMED_UID.finditer(raw, offset, end))
    return Damage(offset + base, tuple(_records_after(raw, offset + 1, end, generation)),
                  tuple(list(named)[:_NAMED_MAX]))


def resolve_damage(claims: dict[str, PreparedClaim], damage: Damage, path: Path) -> dict[str, PreparedClaim]:
    """The claims after damaged journal bytes, none of which replays: a claim the damage may have changed (every
    claim recorded before it, as a record names its claims only in its damaged text) becomes an unfinished
    prepare, which the daemon resolves against the API server (kept while the claim exists and is allocated
    these devices, dropped with its CDI spec when not); what valid records after the damage set (a whole entry,
    or a removal) holds as they set it. Logged as an error naming the claims."""
    out = dict(claims)
    doubtful = set(out)
    lost: set[str] = set()
    for record in damage.later:
        for op in record.get("ops") or []:
            if isinstance(op, list) and len(op) >= 2 and op[0] == "state" and op[1] not in out:
                lost.add(str(op[1]))  # a state change of an entry the damage held: nothing to apply it to
                continue
            _apply(out, [op], path)
            if isinstance(op, list) and len(op) >= 2 and op[0] in ("put", "delete"):
                doubtful.discard(op[1])
    for uid in doubtful:
        if uid in out:
            out[uid] = out[uid].with_state(ClaimState.PREPARE_STARTED)
    log.error("the checkpoint journal is damaged (a power loss cut a write short, or the file is corrupt); "
              "nothing in the damaged bytes is replayed: the claims it may have changed are kept as unfinished "
              "prepares and resolved against the API server", extra={
                  "journal": str(path), "offset": damage.offset, "records_after_it": len(damage.later),
                  "unfinished": sorted(doubtful & set(out)), "named_in_damage": list(damage.named),
                  "unknown": sorted(lost - set(out))})
    return out


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
    size and blocks do not change), and no temp file, rename or directory fsync. When the journal is full and
    at start, the whole state becomes the new snapshot (atomic replace, fsynced with its directory) naming a new
    random journal generation, and the journal's records are zeroed. Only records of the snapshot's generation
    replay, so a reset cut short or stale bytes never do; damaged bytes never replay (`resolve_damage`). At a
    clean stop the state becomes a snapshot without a journal, which the previous release can read (version 1).
    """

    def __init__(self, path: Path, journal_size: int = JOURNAL_SIZE, boot_id: str | None = None) -> None:
        self.path = path
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.journal_path = path.with_name(path.name + JOURNAL_SUFFIX)
        self._journal_size = journal_size
        self._fd: int | None = None
        self._limit = journal_size
        self._offset = 0
        self._generation = ""
        self._saved: dict[str, PreparedClaim] = {}
        self._loaded: Snapshot | None = None
        self._snapshot_only = False  # after `hand_over`: every save is a journal-less snapshot
        self._written: tuple[int, int, int] | None = None  # the snapshot file this instance wrote last then
        self._closed = False  # by `close`: the clean stop's snapshot stays as it is
        # Unprepares noted by either instance (claim uid -> arrival, time.monotonic_ns): `unprepared_since`.
        self._unprepared: OrderedDict[str, int] = OrderedDict()

    def read(self) -> dict[str, PreparedClaim]:
        """The recorded claims (snapshot plus journal) without changing any file; absent files are empty. Claims
        that damaged journal bytes may have changed are unfinished prepares (`resolve_damage`)."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, PreparedClaim], JournalContent | None]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._loaded = None
            return {}, None
        snapshot = decode_snapshot(self.path, raw)
        claims, generation = snapshot.claims, snapshot.journal
        self._loaded = snapshot
        if generation is None:
            return claims, None
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return claims, None
        try:
            journal_raw = _read_used(fd)
        finally:
            os.close(fd)
        journal = read_journal(self.journal_path, journal_raw, generation)
        this_boot = snapshot.boot_id == self.boot_id  # arrivals are monotonic_ns: of this boot only
        for record in journal.records:
            _apply(claims, record.get("ops") or [], self.journal_path)
            if this_boot:
                self._note(record)
        if journal.damage is not None:
            claims = resolve_damage(claims, journal.damage, self.journal_path)
        return claims, journal

    def load(self) -> dict[str, PreparedClaim]:
        """The recorded claims; removes temp files of interrupted writes and, unless the snapshot's journal can
        go on as it is, writes a new snapshot with a journal of its own, so that this instance always holds the
        journal open (and `refresh` sees the other instance's records), even on a node that had no files yet."""
        remove_temp_files(self.path.parent, self.path.name)
        self.close(compact=False)
        self._snapshot_only = False
        self._closed = False
        claims, journal = self._read()
        self._saved = dict(claims)
        loaded = self._loaded
        if loaded is not None and loaded.boot_id != self.boot_id:
            self._unprepared.clear()  # arrivals of another boot's clock: never compared with this one's
        if loaded is not None and loaded.boot_id != self.boot_id and claims:
            # kubelet prepares its pods' claims again after a reboot: the entries stay, their CDI specs (tmpfs) are
            # written again at start, and unprepare still finds what each claim held.
            log.info("the node booted since the checkpoint was written; prepared claims kept",
                     extra={"claims": len(claims), "written_at_boot": loaded.boot_id or "unknown (format 1)",
                            "boot": self.boot_id})
        if (journal is None or journal.damage is not None or loaded is None or loaded.format != CHECKPOINT_FORMAT
                or loaded.boot_id != self.boot_id):
            self._compact(claims)  # a new snapshot in this format for this boot, with a journal of its own
            return claims
        assert loaded.journal is not None
        self._fd = os.open(self.journal_path, os.O_RDWR | os.O_CLOEXEC)
        self._limit = os.fstat(self._fd).st_size
        self._generation = loaded.journal
        self._offset = journal.end
        if journal.dirty_end > journal.end:  # stale records: cleared, never mistaken for records
            if journal.end == 0:
                log.info("the journal held bytes of earlier generations only (a clearing cut short); cleared",
                         extra={"journal": str(self.journal_path), "bytes": journal.dirty_end})
            os.pwrite(self._fd, bytes(journal.dirty_end - journal.end), journal.end)
            os.fdatasync(self._fd)
        return claims

    def refresh(self) -> dict[str, PreparedClaim] | None:
        """The recorded claims if another instance of the driver changed the files since this one last read or
        wrote them, else None. For two instances side by side during a rolling update, each call holds the
        instances' lock (`InstanceLock`) and refreshes first: a new snapshot shows as a new journal generation
        (random at every compaction, read from the head of the file), new records as data where this instance
        would write its next one. Both checks are exact and cost one short read each. Not loaded yet: the files
        are loaded (never a snapshot written blind over the other instance's records); closed: None."""
        if self._snapshot_only:
            return self._refresh_snapshot()
        if self._fd is None:
            return None if self._closed else self.load()
        try:  # os-level: on every call, so no file object (bench/profile_prepare.py)
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            head = b""
        else:
            try:
                head = os.read(fd, _HEAD)  # a regular file: all of it unless shorter
            finally:
                os.close(fd)
        if _generation_of(head) != self._generation:
            return self.load()
        if os.pread(self._fd, 1, self._offset) in (b"", b"\0"):
            return None
        # The other instance's new records: usually a few hundred bytes, so read a piece from this instance's
        # offset; the whole journal only when that piece does not end in unused (zero) bytes or holds more
        # than whole records (damage is judged with everything after it).
        tail = os.pread(self._fd, min(_REFRESH_READ, self._limit - self._offset), self._offset)
        partial: JournalContent | None = None
        if tail.endswith(b"\0"):  # else a record may go on past the piece
            partial = read_journal(self.journal_path, tail, self._generation, self._offset, self._offset)
        if partial is not None and partial.end == partial.dirty_end:
            journal = partial
        else:
            raw = _read_used(self._fd, self._limit)
            journal = read_journal(self.journal_path, raw, self._generation, self._offset)
        if journal.damage is not None:
            return self.load()  # resolved, and written as a new snapshot
        claims = dict(self._saved)
        for record in journal.records:
            _apply(claims, record.get("ops") or [], self.journal_path)
            self._note(record)
        self._offset = journal.end
        self._saved = claims
        return dict(claims)

    def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True,
             before_rename: Callable[[], None] | None = None, unprepared: tuple[str, int] | None = None,
             twice: bool = False) -> None:
        """Record `claims` as the new state; `durable` makes it survive a power loss, not only a crash of the
        daemon. `before_rename` is a crash-injection hook, called before anything changes on disk. `unprepared`:
        (claim uid, arrival) of the unprepare this save belongs to, noted in the same record (`note_unprepared`).
        `twice`: the record is written twice in the one write (a prepare's: one damaged byte leaves a valid
        copy, docs/checkpoint-format.md "Damage")."""
        if before_rename is not None:
            before_rename()
        if unprepared is not None:
            self._remember(*unprepared)
        if self._snapshot_only:
            self._write_journal_less(claims)
            return
        if self._fd is None:
            self._compact(claims)
            return
        ops: list[Any] = []
        saved = self._saved
        for uid, claim in claims.items():
            old = saved.get(uid)
            if old is claim:
                continue
            # The whole entry, also for a change of state: every record says all it changes, so records after
            # damaged ones apply on their own (`resolve_damage`).
            ops.append(["put", uid, claim.to_json()])
        ops.extend(["delete", uid] for uid in saved if uid not in claims)
        payload: dict[str, Any] = {"generation": self._generation, "ops": ops, "synced": durable}
        if unprepared is not None:
            payload["unprepared"] = [list(unprepared)]
        line = _line(payload)
        if twice:
            line += line
        if self._offset + len(line) > self._limit:
            self._compact(claims)
            return
        self._append(line, durable)
        self._saved = dict(claims)

    def _append(self, line: bytes, durable: bool) -> None:
        assert self._fd is not None
        try:
            os.pwrite(self._fd, line, self._offset)
            if durable:
                os.fdatasync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):  # best effort: a record that failed must not replay
                os.pwrite(self._fd, bytes(len(line)), self._offset)
            raise
        self._offset += len(line)

    # --- unprepares, shared by the instances of a rolling update ----------------------------------------------

    def note_unprepared(self, uid: str, arrived: int) -> None:
        """An unprepare of a claim with no entry (nothing to remove): noted in memory and, while the journal is
        open, in a record of its own, not synced (the other instance reads it from the page cache; a power loss
        ends both instances and every prepare in flight). The caller holds the instances' lock and refreshed."""
        self._remember(uid, arrived)
        if self._fd is None or self._snapshot_only:
            return
        line = _line({"generation": self._generation, "ops": [], "synced": False, "unprepared": [[uid, arrived]]})
        if self._offset + len(line) > self._limit:
            self._compact(self._saved)  # carries the unprepares noted
            return
        self._append(line, False)

    def unprepared_since(self, uid: str, arrived: int) -> bool:
        """Whether an unprepare of `uid` that arrived after `arrived` (time.monotonic_ns) was noted by either
        instance (as of the last refresh)."""
        return self._unprepared.get(uid, 0) > arrived

    def _remember(self, uid: str, arrived: int) -> None:
        if arrived > self._unprepared.get(uid, 0):
            self._unprepared[uid] = arrived
            self._unprepared.move_to_end(uid)
            while len(self._unprepared) > UNPREPARED_MEMORY:
                self._unprepared.popitem(last=False)

    def _note(self, record: Mapping[str, Any]) -> None:
        """The unprepares a record notes. Read leniently: they only ever refuse a prepare, so an entry of
        another shape is skipped, never an error."""
        noted = record.get("unprepared")
        for entry in noted if isinstance(noted, list) else ():
            if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and type(entry[1]) is int):
                self._remember(entry[0], entry[1])

    def hand_over(self) -> None:
        """For the previous release starting beside this one (a rollback, docs/upgrades.md): from now on every
        save is a journal-less snapshot (version 1), which that release can read and verify, and the journal
        is folded in now. The caller holds the instances' lock and has refreshed."""
        if self._snapshot_only:
            return
        self._write_journal_less(self._saved)
        self._snapshot_only = True
        log.warning("writing the checkpoint as snapshots the previous release can read (version 1) from now on",
                    extra={"checkpoint": str(self.path)})

    def _write_journal_less(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomic(self.path, encode(claims, None, self.boot_id), mode=0o600, durable=True)
        self._written = _identity(self.path)
        self._saved = dict(claims)
        if self._fd is not None:
            try:
                if self._offset:
                    os.pwrite(self._fd, bytes(min(self._offset, self._limit)), 0)  # tidiness: no generation names them
                    os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None
                self._offset = 0

    def _refresh_snapshot(self) -> dict[str, PreparedClaim] | None:
        if _identity(self.path) == self._written:
            return None
        claims, _ = self._read()
        self._written = _identity(self.path)
        self._saved = dict(claims)
        return dict(claims)

    def _compact(self, claims: Mapping[str, PreparedClaim]) -> None:
        """`claims` as the snapshot (durable) under a new journal generation, then the journal's records zeroed."""
        if self._fd is None:
            if not self.journal_path.exists():
                write_atomic(self.journal_path, bytes(self._journal_size), mode=0o600, durable=True)
            self._fd = os.open(self.journal_path, os.O_RDWR | os.O_CLOEXEC)
            self._limit = os.fstat(self._fd).st_size
            # Records of an earlier snapshot are zeroed below with the rest: new records must follow only zeros.
            self._offset = _used_end(self._fd, self._limit)
        generation = secrets.token_hex(8)
        write_atomic(self.path, encode(claims, generation, self.boot_id), mode=0o600, durable=True)
        self._generation = generation
        used = min(self._offset, self._limit)
        if used:
            # Tidiness only: old records are of another generation. Cut short (kill -9 inside the pwrite, a power
            # loss before the fdatasync) it leaves zeros and fragments of old records, and no record of the new
            # generation: `read_journal` reads that as stale, not damage (docs/checkpoint-format.md).
            os.pwrite(self._fd, bytes(used), 0)
            os.fdatasync(self._fd)
        self._offset = 0
        self._saved = dict(claims)
        self._carry_unprepared()

    def _carry_unprepared(self) -> None:
        """After a compaction: the recent unprepares as the new journal's first record (not synced), so that the
        other instance, which reloads at the new generation, still refuses prepares that began before them."""
        assert self._fd is not None
        horizon = time.monotonic_ns() - UNPREPARED_CARRY
        recent = [[u, t] for u, t in self._unprepared.items() if t > horizon][-UNPREPARED_CARRIED:]
        if not recent:
            return
        line = _line({"generation": self._generation, "ops": [], "synced": False, "unprepared": recent})
        if len(line) <= self._limit // 2:  # never more than half the journal (a burst: the newest)
            self._append(line, False)

    def close(self, *, compact: bool = True) -> None:
        """Fold the journal into a snapshot without one (checkpoint.json alone is then complete, and the
        previous release can read it) and close it; `compact=False` only closes."""
        if compact:
            self._closed = True
        if self._fd is None:
            return
        try:
            if compact:
                self._write_journal_less(self._saved)  # closes the journal
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
