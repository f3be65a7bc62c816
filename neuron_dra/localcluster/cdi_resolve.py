"""Resolve fully qualified CDI device ids (`vendor/class=name`) against the spec files in a CDI directory,
as a container runtime does before it starts a container."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class CDIResolveError(LookupError):
    pass


@dataclass(frozen=True)
class ResolvedDevice:
    cdi_id: str
    spec_file: Path
    env: tuple[str, ...]
    device_nodes: tuple[Mapping[str, Any], ...]


def _load(path: Path) -> Mapping[str, Any] | None:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return data if isinstance(data, Mapping) else None


def load_specs(cdi_root: Path) -> list[tuple[Path, Mapping[str, Any]]]:
    if not cdi_root.is_dir():
        return []
    specs = []
    for path in sorted(cdi_root.iterdir()):
        # temp files of an atomic write start with '.' or end in .tmp; runtimes ignore them too
        if path.name.startswith(".") or path.suffix not in (".json", ".yaml", ".yml"):
            continue
        data = _load(path)
        if data is not None:
            specs.append((path, data))
    return specs


def resolve(cdi_root: Path, cdi_ids: Iterable[str]) -> list[ResolvedDevice]:
    """Every id must name exactly one device of one spec; the edits of spec and device are combined."""
    specs = load_specs(cdi_root)
    out = []
    for cdi_id in cdi_ids:
        kind, sep, name = cdi_id.partition("=")
        if not sep or "/" not in kind or not name:
            raise CDIResolveError(f"{cdi_id!r} is not a fully qualified CDI device id (vendor/class=name)")
        matches = []
        for path, spec in specs:
            if spec.get("kind") != kind:
                continue
            for dev in spec.get("devices") or ():
                if dev.get("name") == name:
                    matches.append((path, spec, dev))
        if len(matches) != 1:
            where = ", ".join(str(m[0]) for m in matches) or f"no spec in {cdi_root}"
            raise CDIResolveError(f"CDI device {cdi_id!r} resolves to {len(matches)} devices ({where})")
        path, spec, dev = matches[0]
        env: list[str] = []
        nodes: list[Mapping[str, Any]] = []
        for edits in (spec.get("containerEdits") or {}, dev.get("containerEdits") or {}):
            env.extend(edits.get("env") or ())
            nodes.extend(edits.get("deviceNodes") or ())
        out.append(ResolvedDevice(cdi_id, path, tuple(env), tuple(nodes)))
    return out
