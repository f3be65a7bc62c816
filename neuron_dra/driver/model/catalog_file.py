"""Catalog files: new or overridden instance types in YAML, strictly validated (docs/catalog-file.md).

`load_catalog(path)` returns the built-in catalog extended by the file, as a new `Catalog` value. Every
problem is a `CatalogFileError` naming the file, the key path, the value and what is allowed; nothing is
guessed and no entry is half-applied.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from neuron_dra.driver.errortext import shown
from neuron_dra.driver.model.catalog import (
    BUILTIN,
    GIB,
    Catalog,
    Family,
    InstanceSpec,
    TopologyKind,
    UltraServerShape,
)

API_VERSION = "neuron-dra/v1"
KIND = "NeuronCatalog"
MAX_DEVICES = 127  # one ResourceSlice holds 128 devices; an UltraServer node adds its pseudo-device
MAX_CORES = 64
MAX_HBM_GIB = 4096
MAX_EFA = 64
ULTRASERVER_SERVERS = (2, 4)  # UltraServerConfig modes 1, 2, 4 and the sysfs node_id_2/4 files address these

_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_FAMILY = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_TEXT = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")

TOP_KEYS = ("apiVersion", "kind", "families", "instanceTypes")
FAMILY_KEYS = ("basedOn", "deviceName", "archType", "archInstanceType", "pciDeviceId", "coreGeneration",
               "coresPerDevice", "hbmGiB", "lnc")
LNC_KEYS = ("supported", "default")
INSTANCE_KEYS = ("basedOn", "family", "devices", "topology", "efaCount", "efaMap", "ultraServer", "capacityBlocks",
                 "coresPerDevice", "hbmGiB", "lnc")
ULTRASERVER_KEYS = ("servers", "generation")

T = TypeVar("T")


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


class _Reader:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, value: object, allowed: str) -> CatalogFileError:
        return CatalogFileError(self.file, key, value, allowed)

    def mapping(self, key: str, value: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key, value, f"a mapping with keys {', '.join(keys)}")
        for k in value:
            if k not in keys:
                raise self.fail(f"{key}.{k}" if key else str(k), value[k],
                                f"unknown key; allowed keys{' of ' + key if key else ''}: {', '.join(keys)}")
        return value

    def integer(self, key: str, value: object, low: int, high: int) -> int:
        if isinstance(value, str) and re.fullmatch(r"0x[0-9a-fA-F]+", value):
            value = int(value, 16)
        if type(value) is not int or not low <= value <= high:  # exactly int: not a bool, not 2.0
            raise self.fail(key, value, f"{low} or {high}" if high == low + 1 else f"an integer from {low} to {high}")
        return value

    def boolean(self, key: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    def string(self, key: str, value: object, pattern: re.Pattern[str], what: str) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.fail(key, value, what)
        return value


def _get(m: Mapping[str, Any], key: str, convert: Callable[[object], T], default: T) -> T:
    return convert(m[key]) if key in m else default


def _lnc(r: _Reader, key: str, value: object, supported: bool, default: int) -> tuple[bool, int]:
    m = r.mapping(key, value, LNC_KEYS)
    supported = _get(m, "supported", lambda v: r.boolean(f"{key}.supported", v), supported)
    default = _get(m, "default", lambda v: r.integer(f"{key}.default", v, 1, 2), default)
    if not supported and default != 1:
        raise r.fail(f"{key}.default", default, "1 when LNC is not supported (supported: false)")
    return supported, default


def _check_family(r: _Reader, key: str, f: Family) -> None:
    if f.lnc_supported and f.physical_cores_per_device % 2:
        raise r.fail(f"{key}.coresPerDevice", f.physical_cores_per_device,
                     "an even number of cores when LNC is supported (LNC 2 pairs physical cores)")


def _family(r: _Reader, name: str, value: object, known: Mapping[str, Family]) -> Family:
    key = f"families[{name}]"
    r.string(key, name, _FAMILY, "a family name: lowercase letters, digits and '-', starting with a letter")
    m = r.mapping(key, value, FAMILY_KEYS)
    base_name = m.get("basedOn", name if name in known else None)
    if base_name is None:
        missing = [k for k in FAMILY_KEYS if k not in ("basedOn", "lnc") and k not in m]
        if missing:
            raise r.fail(f"{key}.{missing[0]}", _MISSING,
                         f"required for a new family (or basedOn: one of {', '.join(known)})")
        base = Family(name, "", "", "", 0, 1, GIB, False, 1, "")
    else:
        if base_name not in known:
            raise r.fail(f"{key}.basedOn", base_name, f"a known family: {', '.join(known)}")
        base = known[base_name]
    text = _TEXT
    lnc = _lnc(r, f"{key}.lnc", m["lnc"], base.lnc_supported, base.default_lnc) if "lnc" in m else \
        (base.lnc_supported, base.default_lnc)
    family = Family(
        name=name,
        device_name=_get(m, "deviceName", lambda v: r.string(f"{key}.deviceName", v, text, "a short name like "
                                                             "Trainium3"), base.device_name),
        arch_type=_get(m, "archType", lambda v: r.string(f"{key}.archType", v, text, "sysfs arch_type, e.g. NDv4"),
                       base.arch_type),
        arch_instance_type=_get(m, "archInstanceType", lambda v: r.string(f"{key}.archInstanceType", v, text,
                                                                          "sysfs instance_type, e.g. Trn3"),
                                base.arch_instance_type),
        pci_device_id=_get(m, "pciDeviceId", lambda v: r.integer(f"{key}.pciDeviceId", v, 0, 0xFFFF),
                           base.pci_device_id),
        physical_cores_per_device=_get(m, "coresPerDevice", lambda v: r.integer(f"{key}.coresPerDevice", v, 1,
                                                                                MAX_CORES),
                                       base.physical_cores_per_device),
        hbm_bytes_per_device=_get(m, "hbmGiB", lambda v: r.integer(f"{key}.hbmGiB", v, 1, MAX_HBM_GIB) * GIB,
                                  base.hbm_bytes_per_device),
        lnc_supported=lnc[0],
        default_lnc=lnc[1],
        core_generation=_get(m, "coreGeneration", lambda v: r.string(f"{key}.coreGeneration", v, text,
                                                                     "e.g. NeuronCore-v4"), base.core_generation),
    )
    _check_family(r, key, family)
    return family


def _topology(r: _Reader, key: str, value: object) -> TopologyKind:
    for kind in TopologyKind:
        if value == kind.value:
            return kind
    raise r.fail(key, value, ", ".join(k.value for k in TopologyKind))


def _efa_map(r: _Reader, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise r.fail(key, value, "a list with one EFA PCI address (like 0000:c9:00.0) per Neuron device, or []")
    out = []
    for i, bdf in enumerate(value):
        if not isinstance(bdf, str) or not _BDF.fullmatch(bdf.lower()):
            raise r.fail(f"{key}[{i}]", bdf, "a PCI address like 0000:c9:00.0")
        out.append(bdf.lower())
    return tuple(out)


def _ultraserver(r: _Reader, key: str, value: object) -> UltraServerShape | None:
    if value is None:
        return None
    m = r.mapping(key, value, ULTRASERVER_KEYS)
    if "servers" not in m:
        raise r.fail(f"{key}.servers", _MISSING, " or ".join(map(str, ULTRASERVER_SERVERS)))
    servers = m["servers"]
    if type(servers) is not int or servers not in ULTRASERVER_SERVERS:  # exactly int: not true, not 2.0
        raise r.fail(f"{key}.servers", servers,
                     f"{' or '.join(map(str, ULTRASERVER_SERVERS))} (UltraServerConfig modes 1, 2, 4 address at most "
                     "4 servers)")
    generation = _get(m, "generation", lambda v: r.string(f"{key}.generation", v, re.compile(r"^.{0,40}$"),
                                                          "a short label"), "")
    return UltraServerShape(servers, generation)


def _check_shape(r: _Reader, key: str, s: InstanceSpec) -> None:
    topo, n = s.topology, s.device_count
    if topo is TopologyKind.SINGLE and n != 1:
        raise r.fail(f"{key}.devices", n, "1 with topology single (or choose ring, torus4x4 or all-to-all)")
    if topo is TopologyKind.TORUS_4X4 and n != 16:
        raise r.fail(f"{key}.devices", n, "16 with topology torus4x4 (a 4x4 torus)")
    if topo in (TopologyKind.RING, TopologyKind.ALL_TO_ALL) and n < 2:
        raise r.fail(f"{key}.devices", n, f"2 or more with topology {topo.value} (1 device: topology single)")
    if s.device_efa_bdfs:
        if len(s.device_efa_bdfs) != n:
            raise r.fail(f"{key}.efaMap", list(s.device_efa_bdfs),
                         f"exactly {n} addresses, one per Neuron device (or [] for no per-device EFA)")
        distinct = len(set(s.device_efa_bdfs))
        if s.efa_count < distinct:
            raise r.fail(f"{key}.efaCount", s.efa_count,
                         f"at least {distinct}, the distinct EFA addresses of efaMap")
    if s.ultraserver is not None and n < 2:
        raise r.fail(f"{key}.ultraServer", {"servers": s.ultraserver.servers},
                     "null on single-device types (UltraServer nodes have 16 devices)")
    _check_family(r, key, s.family)


def _instance(r: _Reader, name: str, value: object, catalog: Mapping[str, InstanceSpec],
              families: Mapping[str, Family], source: str) -> InstanceSpec:
    key = f"instanceTypes[{name}]"
    r.string(key, name, _INSTANCE_TYPE, "an EC2 instance type name like trn3.48xlarge")
    if len(name) > 63:
        raise r.fail(key, name, "at most 63 characters (it is an attribute and a label value)")
    m = r.mapping(key, value, INSTANCE_KEYS)
    base_name = m.get("basedOn", name if name in catalog else None)
    if base_name is None:
        missing = [k for k in ("family", "devices", "topology") if k not in m]
        if missing:
            raise r.fail(f"{key}.{missing[0]}", _MISSING,
                         f"required for a new instance type (or basedOn: one of {', '.join(catalog)})")
        base = None
    elif base_name not in catalog:
        raise r.fail(f"{key}.basedOn", base_name, f"a known instance type: {', '.join(catalog)}")
    else:
        base = catalog[base_name]
    if "family" in m:
        fam_name = m["family"]
        if not isinstance(fam_name, str) or fam_name not in families:
            raise r.fail(f"{key}.family", fam_name, f"a known family: {', '.join(families)} (or define it under "
                                                    "families)")
        family = families[fam_name]
    else:
        assert base is not None
        family = base.family
    overrides: dict[str, Any] = {}
    if "coresPerDevice" in m:
        overrides["physical_cores_per_device"] = r.integer(f"{key}.coresPerDevice", m["coresPerDevice"], 1, MAX_CORES)
    if "hbmGiB" in m:
        overrides["hbm_bytes_per_device"] = r.integer(f"{key}.hbmGiB", m["hbmGiB"], 1, MAX_HBM_GIB) * GIB
    if "lnc" in m:
        overrides["lnc_supported"], overrides["default_lnc"] = _lnc(r, f"{key}.lnc", m["lnc"], family.lnc_supported,
                                                                    family.default_lnc)
    if overrides:
        family = dataclasses.replace(family, **overrides)  # same family name, this type's hardware
    spec = InstanceSpec(
        instance_type=name,
        family=family,
        device_count=_get(m, "devices", lambda v: r.integer(f"{key}.devices", v, 1, MAX_DEVICES),
                          base.device_count if base else 0),
        topology=_get(m, "topology", lambda v: _topology(r, f"{key}.topology", v),
                      base.topology if base else TopologyKind.SINGLE),
        efa_count=_get(m, "efaCount", lambda v: r.integer(f"{key}.efaCount", v, 0, MAX_EFA),
                       base.efa_count if base else 0),
        device_efa_bdfs=_get(m, "efaMap", lambda v: _efa_map(r, f"{key}.efaMap", v),
                             base.device_efa_bdfs if base else ()),
        ultraserver=_get(m, "ultraServer", lambda v: _ultraserver(r, f"{key}.ultraServer", v),
                         base.ultraserver if base else None),
        capacity_blocks=_get(m, "capacityBlocks", lambda v: r.boolean(f"{key}.capacityBlocks", v),
                             base.capacity_blocks if base else False),
        source=source,
    )
    if base is not None and "devices" in m and "efaMap" not in m and base.device_efa_bdfs and \
            spec.device_count != base.device_count:
        raise r.fail(f"{key}.efaMap", _MISSING, f"an efaMap of {spec.device_count} addresses (or []): the one of "
                                                f"{base_name} has {base.device_count}")
    _check_shape(r, key, spec)
    return spec


def parse_catalog(data: object, source: str, base: Catalog = BUILTIN) -> Catalog:
    """`base` extended by a parsed catalog document; CatalogFileError names what is wrong."""
    r = _Reader(source)
    top = r.mapping("", data, TOP_KEYS)
    if top.get("apiVersion") != API_VERSION:
        raise r.fail("apiVersion", top.get("apiVersion", _MISSING), API_VERSION)
    if top.get("kind") != KIND:
        raise r.fail("kind", top.get("kind", _MISSING), KIND)
    families = dict(base.family_map)
    new_families = []
    fam_section = top.get("families") or {}
    if not isinstance(fam_section, Mapping):
        raise r.fail("families", fam_section, "a mapping of family name -> family")
    for name, value in fam_section.items():
        family = _family(r, str(name), value, families)
        families[family.name] = family
        new_families.append(family)
    types_section = top.get("instanceTypes") or {}
    if not isinstance(types_section, Mapping):
        raise r.fail("instanceTypes", types_section, "a mapping of instance type -> instance type")
    if not types_section and not new_families:
        raise r.fail("instanceTypes", types_section, "at least one instance type or family")
    specs = dict(base.types)
    new_specs = []
    for name, value in types_section.items():
        spec = _instance(r, str(name), value, specs, families, source)
        specs[spec.instance_type] = spec
        new_specs.append(spec)
    # Built-in types of a redefined family follow its new values (e.g. families.trn3.hbmGiB).
    for t, s in base.types.items():
        if t not in types_section and s.family.name in fam_section:
            refreshed = dataclasses.replace(s, family=families[s.family.name], source=source)
            _check_shape(r, f"instanceTypes[{t}]", refreshed)
            new_specs.append(refreshed)
    return base.extended(new_specs, new_families, source)


def load_catalog(path: Path | str, base: Catalog = BUILTIN) -> Catalog:
    """`base` extended by the catalog file at `path` (YAML within driver/model/bounded_yaml.py's bounds)."""
    from neuron_dra.driver.model import bounded_yaml  # imports yaml: only with a catalog file, not at start-up

    file = str(path)
    try:
        text = bounded_yaml.read(file)
    except OSError as e:
        raise CatalogFileError(file, "", _MISSING, f"a readable catalog file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise CatalogFileError(file, "", _MISSING, f"UTF-8 text ({e.reason} at byte {e.start})") from None
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
