"""CDI (Container Device Interface) spec files: one per prepared claim, written atomically.

Kind `aws.amazon.com/neuron`, the vendor/class of the Neuron device plugin's resource name (AWS's DRA driver does
not document its own). Device names embed the claim UID: runtimes cache specs, so a name is never reused for other
contents. Each spec declares the lowest `cdiVersion` covering its fields (runtimes reject a version too low).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_dra.driver.errortext import shown
from neuron_dra.driver.kubeletplugin.toolkit import remove_temp_files, write_atomic

CDI_KIND = "aws.amazon.com/neuron"
SPEC_FILE_MODE = 0o644  # read by the container runtime; holds no secrets

# CDI device names: start and end with a letter or digit; letters, digits, '-', '_', '.', ':' inside.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
# Claim UIDs become part of file and device names: nothing that could leave the directory. Both are checked with
# fullmatch: the `$` of match also matches before a final line feed, which would reach the CDI id.
_CLAIM_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


class CdiError(ValueError):
    pass


def check_claim_uid(uid: str) -> str:
    if not isinstance(uid, str) or not _CLAIM_UID.fullmatch(uid):
        raise CdiError(f"claim uid {shown(uid)} is not allowed: letters, digits and '-' only, at most 128 characters")
    return uid


@dataclass(frozen=True)
class DeviceNode:
    path: str  # inside the container
    host_path: str  # on the host, as the runtime sees it
    major: int
    minor: int
    permissions: str = "rw"  # no "m": containers may not mknod

    def to_cdi(self) -> dict[str, Any]:
        return {"path": self.path, "hostPath": self.host_path, "type": "c", "major": self.major,
                "minor": self.minor, "permissions": self.permissions}


@dataclass(frozen=True)
class CdiDevice:
    name: str
    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[str, ...] = ()  # NAME=value

    def __post_init__(self) -> None:
        if not _DEVICE_NAME.fullmatch(self.name):
            raise CdiError(f"CDI device name {self.name!r} is not allowed: letters, digits, '-', '_', '.', ':', "
                           "starting and ending with a letter or digit")

    def to_cdi(self) -> dict[str, Any]:
        edits: dict[str, Any] = {}
        if self.env:
            edits["env"] = list(self.env)
        if self.device_nodes:
            edits["deviceNodes"] = [n.to_cdi() for n in self.device_nodes]
        return {"name": self.name, "containerEdits": edits}


def qualified_id(name: str, kind: str = CDI_KIND) -> str:
    """The fully qualified CDI device id (`vendor/class=name`) that goes into `cdi_device_ids`."""
    return f"{kind}={name}"


def _edits(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    if "containerEdits" in spec:
        yield spec["containerEdits"]
    for dev in spec.get("devices") or ():
        yield dev.get("containerEdits") or {}


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion whose schema covers what `spec` uses (the rules of the CDI spec's version
    history for the fields this driver can emit): 0.3.0 base; 0.4.0 mount `type`; 0.5.0 `hostPath` on
    device nodes or a device name starting with a digit; 0.6.0 annotations; 0.7.0 `additionalGids`."""
    edits = list(_edits(spec))
    if any("additionalGids" in e for e in edits):
        return "0.7.0"
    if "annotations" in spec or any("annotations" in d for d in spec.get("devices") or ()):
        return "0.6.0"
    if any(n.get("hostPath") for e in edits for n in e.get("deviceNodes") or ()):
        return "0.5.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices") or ()):
        return "0.5.0"
    if any("type" in m for e in edits for m in e.get("mounts") or ()):
        return "0.4.0"
    return "0.3.0"


def build_spec(devices: Sequence[CdiDevice], kind: str = CDI_KIND) -> dict[str, Any]:
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise CdiError(f"duplicate CDI device names in one spec: {sorted(n for n in names if names.count(n) > 1)}")
    body: dict[str, Any] = {"kind": kind, "devices": [d.to_cdi() for d in devices]}
    return {"cdiVersion": minimum_version(body), **body}


def spec_text(spec: Mapping[str, Any]) -> str:
    """The exact text written for a spec: canonical (sorted keys, compact), so a rewrite from the checkpoint
    reproduces the file byte for byte. Not indented: that JSON encoder is pure Python and would cost more
    than the rest of a prepare."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n"


class CdiStore:
    """This driver's spec files in the CDI directory: `<cdi root>/<driver>_<claim uid>.json`."""

    def __init__(self, root: Path, driver_name: str) -> None:
        self.root = root
        self.prefix = f"{driver_name}_"
        self._root_text = os.fspath(root)  # prepare and unprepare name files as str: no Path per call

    def ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, claim_uid: str) -> Path:
        return Path(self._file(claim_uid))

    def _file(self, claim_uid: str) -> str:
        return os.path.join(self._root_text, f"{self.prefix}{check_claim_uid(claim_uid)}.json")

    def write(self, claim_uid: str, text: str) -> None:
        # Not fsynced: /var/run/cdi is tmpfs, and every prepare rewrites the spec anyway.
        write_atomic(self._file(claim_uid), text.encode("utf-8"), mode=SPEC_FILE_MODE, durable=False)

    def read(self, claim_uid: str) -> str | None:
        """The spec file's text; None when there is none; CdiError when it cannot be read as UTF-8 text."""
        path = self.path_for(claim_uid)
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (UnicodeDecodeError, OSError) as e:  # invalid UTF-8, a directory in its place, no permission
            raise CdiError(f"{path}: unreadable ({type(e).__name__}: {str(e)[:200]})") from None

    def quarantine(self, claim_uid: str) -> Path | None:
        """Move an unreadable spec aside (a hidden name: runtimes read only *.json/*.yaml files) so it can be
        rewritten or left behind; returns where it went, None when there was nothing."""
        path = self.path_for(claim_uid)
        if not os.path.lexists(path):
            return None
        target = self.root / f".{path.name}.unreadable-{time.time_ns()}"
        os.replace(path, target)
        return target

    def remove(self, claim_uid: str) -> bool:
        try:
            os.unlink(self._file(claim_uid))
        except FileNotFoundError:
            return False
        except (IsADirectoryError, PermissionError):  # not a file we wrote: moved aside instead
            return self.quarantine(claim_uid) is not None
        return True

    def claim_uids(self) -> set[str]:
        """Claims that have a spec file of this driver (used to find orphans after a crash)."""
        if not self.root.is_dir():
            return set()
        out = set()
        for p in self.root.iterdir():
            if p.name.startswith(self.prefix) and p.name.endswith(".json"):
                uid = p.name[len(self.prefix):-len(".json")]
                if _CLAIM_UID.fullmatch(uid):
                    out.add(uid)
        return out

    def remove_temp_files(self) -> list[Path]:
        return remove_temp_files(self.root, self.prefix)
