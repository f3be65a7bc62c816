"""Catalog files: new or overridden instance types in YAML, strictly validated (docs/catalog-file.md).

`load_catalog(path)` returns the built-in catalog extended by the file, as a new `Catalog` value. Every
problem is a `CatalogFileError` naming the file, the key path, the value and what is allowed; nothing is
guessed and no entry is half-applied. Keys, types and ranges are catalog_schema.py's pydantic models; what
depends on the catalog being extended (basedOn, known families, shapes) is checked here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from neuron_dra.driver.errortext import shown
from neuron_dra.driver.model.catalog import BUILTIN, GIB, Catalog, Family, InstanceSpec, TopologyKind, UltraServerShape
from neuron_dra.driver.model.config import LNC_VALUES

if TYPE_CHECKING:
    from pydantic import ValidationError

    from neuron_dra.driver.model.catalog_schema import CatalogDoc, FamilyDoc, InstanceDoc, LncDoc

T = TypeVar("T")
_SECTIONS = ("families", "instanceTypes")


class CatalogFileError(ValueError):
    """A catalog file that cannot be used: names the file, the key path, the value and what is allowed."""

    def __init__(self, file: str, key: str, value: object, allowed: str) -> None:
        self.file = file
        self.key = key
        self.value = value
        self.allowed = allowed
        echo = "(missing)" if value is _MISSING else shown(value)
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {echo}: {allowed}")


_MISSING = object()


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a key path: instanceTypes[x.big].efaMap[0]."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int) or (i == 1 and loc[0] in _SECTIONS):
            out += f"[{part}]"
        elif part != "[key]":
            out += f".{part}" if out else part
    return out


def _refusal(source: str, error: ValidationError) -> CatalogFileError:
    """The first problem pydantic found (an unknown key before anything else), in the file's terms."""
    from neuron_dra.driver.model.catalog_schema import ALLOWED, MODELS, keys

    errors = error.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc, kind, value = tuple(e["loc"]), e["type"], e["input"]
    # What the key is, in ALLOWED's and MODELS' terms: "families[]" for an entry, "efaMap[]" for an item.
    generic = "" if not loc else f"{loc[0]}[]" if len(loc) == 2 and loc[0] in _SECTIONS else str(loc[-1])
    if loc and isinstance(loc[-1], int):
        generic = f"{loc[-2]}[]"
    if kind == "extra_forbidden":
        parent = _path(loc[:-1])
        owner = MODELS[f"{loc[0]}[]" if len(loc) == 3 and loc[0] in _SECTIONS else str(loc[-2]) if loc[:-1] else ""]
        return CatalogFileError(source, _path(loc), value,
                                f"unknown key; allowed keys{' of ' + parent if parent else ''}: {keys(owner)}")
    if loc and loc[-1] == "[key]":
        generic = f"{loc[0]}[]"
        allowed = ALLOWED.get(generic + kind, ALLOWED[generic])
    elif kind == "model_type":
        allowed = f"a mapping with keys {keys(MODELS[generic])}"
    else:
        allowed = ALLOWED[generic]
    return CatalogFileError(source, _path(loc), _MISSING if kind == "missing" else value, allowed)


def _given(value: T | None, default: T) -> T:
    return default if value is None else value


def _lnc(key: str, doc: LncDoc | None, supported: bool, default: int) -> tuple[bool, int]:
    if doc is None:
        return supported, default
    supported, default = _given(doc.supported, supported), _given(doc.default, default)
    if not supported and default != LNC_VALUES[0]:
        raise CatalogFileError("", f"{key}.default", default,
                               f"{LNC_VALUES[0]} when LNC is not supported (supported: false)")
    return supported, default


def _check_family(key: str, f: Family) -> None:
    if f.lnc_supported and f.physical_cores_per_device % 2:
        raise CatalogFileError("", f"{key}.coresPerDevice", f.physical_cores_per_device,
                               "an even number of cores when LNC is supported (LNC 2 pairs physical cores)")


def _missing(key: str, doc: FamilyDoc | InstanceDoc, required: tuple[str, ...], what: str,
             known: Mapping[str, object]) -> None:
    for name in required:
        if getattr(doc, name) is None:
            alias = type(doc).model_fields[name].alias
            raise CatalogFileError("", f"{key}.{alias}", _MISSING,
                                   f"required for a new {what} (or basedOn: one of {', '.join(known)})")


def _family(name: str, doc: FamilyDoc, known: Mapping[str, Family]) -> Family:
    key = f"families[{name}]"
    base_name = doc.based_on or (name if name in known else None)
    if base_name is None:
        _missing(key, doc, tuple(n for n in type(doc).model_fields if n not in ("based_on", "lnc")), "family", known)
        base = Family(name, "", "", "", 0, 1, GIB, False, LNC_VALUES[0], "")
    elif base_name not in known:
        raise CatalogFileError("", f"{key}.basedOn", base_name, f"a known family: {', '.join(known)}")
    else:
        base = known[base_name]
    supported, default = _lnc(f"{key}.lnc", doc.lnc, base.lnc_supported, base.default_lnc)
    family = Family(
        name=name,
        device_name=_given(doc.device_name, base.device_name),
        arch_type=_given(doc.arch_type, base.arch_type),
        arch_instance_type=_given(doc.arch_instance_type, base.arch_instance_type),
        pci_device_id=_given(doc.pci_device_id, base.pci_device_id),
        physical_cores_per_device=_given(doc.cores_per_device, base.physical_cores_per_device),
        hbm_bytes_per_device=base.hbm_bytes_per_device if doc.hbm_gib is None else doc.hbm_gib * GIB,
        lnc_supported=supported,
        default_lnc=default,
        core_generation=_given(doc.core_generation, base.core_generation),
    )
    _check_family(key, family)
    return family


def _check_shape(key: str, s: InstanceSpec) -> None:
    topo, n = s.topology, s.device_count
    if topo is TopologyKind.SINGLE and n != 1:
        raise CatalogFileError("", f"{key}.devices", n, "1 with topology single (or choose ring, torus4x4 or "
                                                         "all-to-all)")
    if topo is TopologyKind.TORUS_4X4 and n != 16:
        raise CatalogFileError("", f"{key}.devices", n, "16 with topology torus4x4 (a 4x4 torus)")
    if topo in (TopologyKind.RING, TopologyKind.ALL_TO_ALL) and n < 2:
        raise CatalogFileError("", f"{key}.devices", n, f"2 or more with topology {topo.value} (1 device: topology "
                                                         "single)")
    if s.device_efa_bdfs:
        if len(s.device_efa_bdfs) != n:
            raise CatalogFileError("", f"{key}.efaMap", list(s.device_efa_bdfs),
                                   f"exactly {n} addresses, one per Neuron device (or [] for no per-device EFA)")
        distinct = len(set(s.device_efa_bdfs))
        if s.efa_count < distinct:
            raise CatalogFileError("", f"{key}.efaCount", s.efa_count,
                                   f"at least {distinct}, the distinct EFA addresses of efaMap")
    if s.ultraserver is not None and n < 2:
        raise CatalogFileError("", f"{key}.ultraServer", {"servers": s.ultraserver.servers},
                               "null on single-device types (UltraServer nodes have 16 devices)")
    _check_family(key, s.family)


def _instance(name: str, doc: InstanceDoc, catalog: Mapping[str, InstanceSpec], families: Mapping[str, Family],
              source: str) -> InstanceSpec:
    key = f"instanceTypes[{name}]"
    base_name = doc.based_on or (name if name in catalog else None)
    base = None
    if base_name is None:
        _missing(key, doc, ("family", "devices", "topology"), "instance type", catalog)
    elif base_name not in catalog:
        raise CatalogFileError("", f"{key}.basedOn", base_name, f"a known instance type: {', '.join(catalog)}")
    else:
        base = catalog[base_name]
    if doc.family is not None and doc.family not in families:
        raise CatalogFileError("", f"{key}.family", doc.family,
                               f"a known family: {', '.join(families)} (or define it under families)")
    if doc.family is not None:
        family = families[doc.family]
    else:
        assert base is not None  # _missing: a new type names its family
        family = base.family
    overrides: dict[str, Any] = {}
    if doc.cores_per_device is not None:
        overrides["physical_cores_per_device"] = doc.cores_per_device
    if doc.hbm_gib is not None:
        overrides["hbm_bytes_per_device"] = doc.hbm_gib * GIB
    if doc.lnc is not None:
        overrides["lnc_supported"], overrides["default_lnc"] = _lnc(f"{key}.lnc", doc.lnc, family.lnc_supported,
                                                                    family.default_lnc)
    if overrides:
        family = dataclasses.replace(family, **overrides)  # same family name, this type's hardware
    ultraserver = doc.ultra_server if "ultra_server" in doc.model_fields_set else _MISSING
    spec = InstanceSpec(
        instance_type=name,
        family=family,
        device_count=_given(doc.devices, base.device_count if base else 0),
        topology=_given(doc.topology, base.topology if base else TopologyKind.SINGLE),
        efa_count=_given(doc.efa_count, base.efa_count if base else 0),
        device_efa_bdfs=tuple(doc.efa_map) if doc.efa_map is not None else base.device_efa_bdfs if base else (),
        ultraserver=(base.ultraserver if base else None) if ultraserver is _MISSING else
        None if doc.ultra_server is None else UltraServerShape(doc.ultra_server.servers, doc.ultra_server.generation),
        capacity_blocks=_given(doc.capacity_blocks, base.capacity_blocks if base else False),
        source=source,
    )
    if base is not None and doc.devices is not None and doc.efa_map is None and base.device_efa_bdfs and \
            spec.device_count != base.device_count:
        raise CatalogFileError("", f"{key}.efaMap", _MISSING, f"an efaMap of {spec.device_count} addresses (or []): "
                                                              f"the one of {base_name} has {base.device_count}")
    _check_shape(key, spec)
    return spec


def parse_catalog(data: object, source: str, base: Catalog = BUILTIN) -> Catalog:
    """`base` extended by a parsed catalog document; CatalogFileError names what is wrong."""
    from pydantic import ValidationError

    from neuron_dra.driver.model.catalog_schema import CatalogDoc

    try:
        doc = CatalogDoc.model_validate(data)
    except ValidationError as e:
        raise _refusal(source, e) from e
    try:
        return _extended(doc, source, base)
    except CatalogFileError as e:
        raise CatalogFileError(source, e.key, e.value, e.allowed) from None  # the same refusal, naming the file


def _extended(doc: CatalogDoc, source: str, base: Catalog) -> Catalog:
    fam_section, types_section = doc.families or {}, doc.instance_types or {}
    if not types_section and not fam_section:
        raise CatalogFileError("", "instanceTypes", types_section, "at least one instance type or family")
    families = dict(base.family_map)
    new_families = []
    for name, fdoc in fam_section.items():
        families[name] = _family(name, fdoc, families)
        new_families.append(families[name])
    specs = dict(base.types)
    new_specs = []
    for name, idoc in types_section.items():
        specs[name] = _instance(name, idoc, specs, families, source)
        new_specs.append(specs[name])
    # Built-in types of a redefined family follow its new values (e.g. families.trn3.hbmGiB).
    for t, s in base.types.items():
        if t not in types_section and s.family.name in fam_section:
            refreshed = dataclasses.replace(s, family=families[s.family.name], source=source)
            _check_shape(f"instanceTypes[{t}]", refreshed)
            new_specs.append(refreshed)
    return base.extended(new_specs, new_families, source)


def load_catalog(path: Path | str, base: Catalog = BUILTIN) -> Catalog:
    """`base` extended by the catalog file at `path` (YAML within driver/model/bounded_yaml.py's bounds)."""
    from neuron_dra.driver.model import bounded_yaml  # imports yaml: only with a catalog file, not at start-up

    file = str(path)
    try:
        text = bounded_yaml.read(file)
    except OSError as e:
        raise CatalogFileError(file, "", _MISSING, f"a readable catalog file ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise CatalogFileError(file, "", _MISSING, f"UTF-8 text ({e.reason} at byte {e.start})") from e
    except bounded_yaml.YamlError as e:
        raise CatalogFileError(file, "", _MISSING, str(e)) from None
    return parse_catalog_text(text, file, base)


def parse_catalog_text(text: str, source: str, base: Catalog = BUILTIN) -> Catalog:
    """`base` extended by the catalog document in `text` (the YAML of a file or of a ConfigMap value)."""
    from neuron_dra.driver.model import bounded_yaml

    try:
        data = bounded_yaml.load(text)
    except bounded_yaml.YamlError as e:
        raise CatalogFileError(source, "", _MISSING, str(e)) from None
    return parse_catalog(data, source, base)
