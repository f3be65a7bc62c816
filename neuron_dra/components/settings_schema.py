"""The decoding of raw Pulumi config into `StackSettings`, and Pulumi.yaml's `config:` section.

The settings are `StackSettings`' fields (`neuron_dra.components.settings`): config key (alias), default,
description and whether only a new cluster uses it. From them come `Pulumi.yaml`'s `config:` section
(`pulumi_project_config`, a test compares them), `Pulumi.example.yaml`'s keys (tested) and the decoding
(`decode_settings`).

The engine treats a `config:` declaration without a `default` as REQUIRED ("Stack ... is missing configuration
values"), so every optional setting is declared with a neutral default ("" or []) that decodes to "unset"
(docs/pulumi-engine.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic.fields import FieldInfo

from neuron_dra.components.settings import (
    NODE_GROUP_FIELD_OF_KEY,
    NODE_POOL_FIELD_OF_KEY,
    PROJECT,
    STACK_FIELD_OF_KEY,
    NodeGroupSettings,
    NodePoolSettings,
    SettingError,
    StackSettings,
    setting_name,
    unknown_key,
)
from neuron_dra.driver.errortext import capped
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog

Kind = Literal["string", "integer", "boolean", "strings", "objects"]

DEFAULT_NODE_GROUPS: tuple[Mapping[str, object], ...] = (
    {"name": "trn2", "instanceType": "trn2.48xlarge", "desiredSize": 1, "minSize": 0, "maxSize": 1},
)


def _kind(name: str, setting: FieldInfo) -> Kind:
    """How Pulumi.yaml declares a setting, and how its config string decodes: by its default's type."""
    if name in ("node_groups", "node_pools"):
        return "objects"
    if isinstance(setting.default, tuple):
        return "strings"
    return {bool: "boolean", int: "integer"}.get(type(setting.default), "string")  # type: ignore[return-value]


def _engine_default(key: str, setting: FieldInfo) -> object:
    """The `default:` Pulumi.yaml declares: the neutral "" or [] for optional settings, so the engine does not
    require them."""
    if key == "nodeGroups":
        return [dict(g) for g in DEFAULT_NODE_GROUPS]
    if setting.default is None:
        return ""
    return list(setting.default) if isinstance(setting.default, tuple) else setting.default


# The settings by config key (the fields' aliases), with their kinds; not the derived `hardware`.
SETTINGS_BY_KEY: Mapping[str, FieldInfo] = {
    f.alias or name: f for name, f in StackSettings.model_fields.items() if not f.exclude
}
_KIND: Mapping[str, Kind] = {key: _kind(STACK_FIELD_OF_KEY[key], f) for key, f in SETTINGS_BY_KEY.items()}
NODE_GROUP_KEYS: tuple[str, ...] = tuple(NODE_GROUP_FIELD_OF_KEY)
NODE_POOL_KEYS: tuple[str, ...] = tuple(NODE_POOL_FIELD_OF_KEY)
_E = TypeVar("_E", NodeGroupSettings, NodePoolSettings)


def _decode_scalar(key: str, raw: object) -> object:
    """Pulumi passes every config value as a string; JSON carries lists, objects, numbers and booleans (the
    model checks the types)."""
    if isinstance(raw, str) and _KIND[key] != "string":
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _decode_entry(index: int, raw: Mapping[str, Any], hardware: Catalog, model: type[_E], key: str,
                  keys: Sequence[str], noun: str) -> _E:
    """A nodeGroups or nodePools entry: its keys known, a name given; the model checks the values."""
    where = f"{setting_name(key)}[{index}]"
    for k, value in raw.items():
        if k not in keys:
            raise unknown_key(f"{where}.{k}", value, keys, f"the {noun} keys")
    if "name" not in raw:
        raise SettingError(f"{where}.name", None, f"a DNS label naming the {noun}")
    return model(**raw, where=where, hardware=hardware)


def _decode_node_group(index: int, raw: Mapping[str, Any], hardware: Catalog = BUILTIN) -> NodeGroupSettings:
    return _decode_entry(index, raw, hardware, NodeGroupSettings, "nodeGroups", NODE_GROUP_KEYS, "node group")


def _decode_node_pool(index: int, raw: Mapping[str, Any], hardware: Catalog = BUILTIN) -> NodePoolSettings:
    return _decode_entry(index, raw, hardware, NodePoolSettings, "nodePools", NODE_POOL_KEYS, "node pool")


def _decode(key: str, raw: object, hardware: Catalog = BUILTIN) -> object:
    """One setting's value; the neutral engine default of an optional setting ("" or []) decodes to unset."""
    decoded = _decode_scalar(key, raw)
    default = SETTINGS_BY_KEY[key].default
    if (default is None or default == ()) and decoded in ("", []):
        return default
    if _KIND[key] != "objects":
        return decoded
    if not isinstance(decoded, list):
        raise SettingError(setting_name(key), raw, "a list of objects")
    for item in decoded:
        if not isinstance(item, dict):
            raise SettingError(setting_name(key), item, "objects")
    if key == "nodePools":
        return tuple(_decode_node_pool(i, p, hardware) for i, p in enumerate(decoded))
    return tuple(_decode_node_group(i, g, hardware) for i, g in enumerate(decoded))


def _hardware(catalog_file: object) -> Catalog:
    """The built-in catalog, extended by the catalogFile setting (loaded once, before the node groups)."""
    if catalog_file is None:
        return BUILTIN
    try:
        return load_catalog(Path(str(catalog_file)).expanduser())
    except CatalogFileError as e:
        raise SettingError(setting_name("catalogFile"), catalog_file, f"a valid catalog file: {capped(str(e))}") from e


def decode_settings(raw: Mapping[str, object]) -> StackSettings:
    """Decode raw config (keys without or with the `neuron-dra:` prefix) into validated settings.

    Unknown keys in the project's namespace are errors (with the closest known key), so a typo cannot
    silently fall back to a default. Keys of other namespaces (aws:region, ...) are ignored.
    """
    values: dict[str, object] = {}
    for full_key, value in raw.items():
        ns, _, key = full_key.rpartition(":")
        if ns not in ("", PROJECT):
            continue
        if key not in SETTINGS_BY_KEY:
            raise unknown_key(setting_name(key), value, list(SETTINGS_BY_KEY), "the settings")
        values[key] = value
    hardware = _hardware(_decode("catalogFile", values["catalogFile"]) if "catalogFile" in values else None)
    decoded: dict[str, Any] = {key: _decode(key, value, hardware) for key, value in values.items()}
    if decoded.get("kubeconfig") is not None:
        for key, value in decoded.items():
            # The engine passes Pulumi.yaml's defaults as values: only a value other than the default is refused.
            extra = SETTINGS_BY_KEY[key].json_schema_extra
            if isinstance(extra, dict) and extra["new_cluster_only"] and \
                    value != _decode(key, _engine_default(key, SETTINGS_BY_KEY[key])):
                raise SettingError(setting_name(key), values[key],
                                   "unset when neuron-dra:kubeconfig selects an existing cluster (the stack then "
                                   "installs only the driver and the claim templates)")
        decoded.pop("nodeGroups", None)
        decoded.pop("nodePools", None)
    elif "nodeGroups" not in decoded and not decoded.get("nodePools"):  # node pools alone: no default node group
        decoded["nodeGroups"] = tuple(_decode_node_group(i, g, hardware) for i, g in enumerate(DEFAULT_NODE_GROUPS))
    return StackSettings(**decoded, hardware=hardware)


def pulumi_project_config() -> dict[str, dict[str, Any]]:
    """The `config:` section of Pulumi.yaml that declares the settings (types, descriptions, defaults).

    Every entry has a default (the engine requires declared settings without one). Pulumi's project config
    types are string, integer, boolean and array; `nodeGroups` (a list of objects) is declared by description
    and default only, which Pulumi accepts untyped.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, s in SETTINGS_BY_KEY.items():
        entry: dict[str, Any] = {}
        if _KIND[key] in ("string", "integer", "boolean"):
            entry["type"] = _KIND[key]
        elif _KIND[key] == "strings":
            entry["type"] = "array"
            entry["items"] = {"type": "string"}
        entry["description"] = s.description
        entry["default"] = _engine_default(key, s)
        out[key] = entry
    return out


def settings_table() -> str:
    """docs/components.md's table of the default stack's settings, from the same fields (a test compares them)."""
    rows = ["| setting | type | default | what it does |", "|---|---|---|---|"]
    for key, entry in pulumi_project_config().items():
        kind = {"array": "list of strings", None: "list of objects"}.get(entry.get("type"), entry.get("type"))
        description = entry["description"].replace("|", "\\|")
        rows.append(f"| `{key}` | {kind} | `{json.dumps(entry['default'])}` | {description} |")
    return "\n".join(rows) + "\n"
