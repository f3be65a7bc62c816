"""The crash-safe record of prepared claims: `<plugins dir>/<driver>/checkpoint.json`.

Unprepare must work after a restart from this file alone (the claim object may be gone), so it
holds everything: the answer given to kubelet, the devices the claim holds, and the CDI spec text
(rewritten at start and on every repeated prepare, since the CDI directory is tmpfs). The file is
versioned and checksummed, and always replaced atomically (temp file + rename). A prepare is recorded
twice: as PrepareStarted before its CDI spec is written and as PrepareCompleted, fsynced, before kubelet
gets the answer, so a crash in between leaves an entry the next start can clean up. The PrepareStarted
write is not fsynced: it survives a crash of the daemon (the rename is in the page cache), and what a
power loss could cost is a spec in /var/run/cdi, which is tmpfs and gone as well (specs elsewhere are
found by the orphan scan at start). Removals are fsynced.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from neuron_dra.driver.atomicfile import remove_temp_files, write_atomic

CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = "checkpoint.json"


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


def encode(claims: Mapping[str, PreparedClaim]) -> bytes:
    """The file: {"checksum", "preparedClaims", "version"}, the checksum taken over the canonical JSON of
    preparedClaims (sorted keys, no spaces), which is also exactly how it is written. Each claim's canonical
    text is computed once per entry, so a save costs a join and a hash, not a re-encoding of every claim."""
    canonical = "{" + ",".join(f"{json.dumps(uid)}:{claims[uid].canonical_json}" for uid in sorted(claims)) + "}"
    return (f'{{"checksum":"{_checksum(canonical)}","preparedClaims":{canonical},'
            f'"version":{CHECKPOINT_VERSION}}}\n').encode()


def decode(path: Path, raw: bytes) -> dict[str, PreparedClaim]:
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not JSON ({e}); the file is corrupt") from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, "expected a JSON object")
    version = doc.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(path, f"checkpoint version {version!r} is not supported; this driver reads version "
                                    f"{CHECKPOINT_VERSION} (was it written by a newer driver?)")
    data = doc.get("preparedClaims")
    if not isinstance(data, dict):
        raise CheckpointError(path, "field 'preparedClaims' must be an object")
    if doc.get("checksum") != _checksum(_canonical(data)):
        raise CheckpointError(path, f"checksum mismatch (recorded {doc.get('checksum')!r}); the file is corrupt")
    try:
        return {uid: PreparedClaim.from_json(uid, entry) for uid, entry in data.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(path, f"malformed claim entry: {e!r}") from None


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """The recorded claims; an absent file is an empty checkpoint."""
        remove_temp_files(self.path.parent, self.path.name)
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        return decode(self.path, raw)

    def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True,
             before_rename: Callable[[], None] | None = None) -> None:
        """Replace the file with `claims`, atomically; `durable` also fsyncs file and directory (survives a power
        loss, not only a crash). `before_rename` is a crash-injection hook."""
        write_atomic(self.path, encode(claims), mode=0o600, durable=durable, before_rename=before_rename)
