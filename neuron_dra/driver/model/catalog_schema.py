"""The catalog file's document as frozen pydantic models (docs/catalog-file.md): keys, types and ranges.

Imported by catalog_file.py only when a file is read, so a daemon without one never loads pydantic. What needs
the catalog it extends (basedOn, known families, shapes) is checked there. A field left out is None ("keep the
base's value"); numbers are strict (not a bool, not 2.0).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from neuron_dra.driver.model.catalog import TopologyKind
from neuron_dra.driver.model.config import LNC_ALLOWED, LNC_VALUES, ULTRASERVER_MODES

API_VERSION = "neuron-dra/v1"
KIND = "NeuronCatalog"
MAX_DEVICES = 127  # one ResourceSlice holds 128 devices; an UltraServer node adds its pseudo-device
MAX_CORES = 64
MAX_HBM_GIB = 4096
MAX_EFA = 64
ULTRASERVER_SERVERS = (2, 4)  # UltraServerConfig modes 1, 2, 4 and the sysfs node_id_2/4 files address these
INSTANCE_TYPE_MAX = 63  # it is an attribute and a label value

FAMILY_NAME = r"^[a-z][a-z0-9-]{0,30}$"
INSTANCE_TYPE = r"^[a-z][a-z0-9-]*\.[a-z0-9]+$"
_TEXT = r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$"
_BDF = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"


def _hex(value: object) -> object:
    return int(value, 16) if isinstance(value, str) and re.fullmatch(r"0x[0-9a-fA-F]+", value) else value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _one_of(*allowed: int) -> AfterValidator:
    def check(value: int) -> int:
        if value not in allowed:
            raise ValueError(f"not one of {allowed}")
        return value

    return AfterValidator(check)


Text = Annotated[str, Field(strict=True, pattern=_TEXT)]
Devices = Annotated[int, Field(strict=True, ge=1, le=MAX_DEVICES)]
Cores = Annotated[int, Field(strict=True, ge=1, le=MAX_CORES)]
HbmGiB = Annotated[int, Field(strict=True, ge=1, le=MAX_HBM_GIB)]
EfaCount = Annotated[int, Field(strict=True, ge=0, le=MAX_EFA)]
PciId = Annotated[int, BeforeValidator(_hex), Field(strict=True, ge=0, le=0xFFFF)]
Lnc = Annotated[int, Field(strict=True), _one_of(*LNC_VALUES)]
Servers = Annotated[int, Field(strict=True), _one_of(*ULTRASERVER_SERVERS)]
Bdf = Annotated[str, BeforeValidator(_lower), Field(strict=True, pattern=_BDF)]
Flag = Annotated[bool, Field(strict=True)]
FamilyName = Annotated[str, Field(pattern=FAMILY_NAME)]
InstanceType = Annotated[str, Field(pattern=INSTANCE_TYPE, max_length=INSTANCE_TYPE_MAX)]


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel)


class LncDoc(_Doc):
    supported: Flag | None = None
    default: Lnc | None = None


class FamilyDoc(_Doc):
    based_on: str | None = None
    device_name: Text | None = None
    arch_type: Text | None = None
    arch_instance_type: Text | None = None
    pci_device_id: PciId | None = None
    core_generation: Text | None = None
    cores_per_device: Cores | None = None
    hbm_gib: HbmGiB | None = Field(None, alias="hbmGiB")
    lnc: LncDoc | None = None


class UltraServerDoc(_Doc):
    servers: Servers
    generation: Annotated[str, Field(strict=True, max_length=40)] = ""


class InstanceDoc(_Doc):
    based_on: str | None = None
    family: str | None = None
    devices: Devices | None = None
    topology: TopologyKind | None = None
    efa_count: EfaCount | None = None
    efa_map: list[Bdf] | None = None
    ultra_server: UltraServerDoc | None = None  # null: not an UltraServer type (left out: the base's)
    capacity_blocks: Flag | None = None
    cores_per_device: Cores | None = None
    hbm_gib: HbmGiB | None = Field(None, alias="hbmGiB")
    lnc: LncDoc | None = None


class CatalogDoc(_Doc):
    api_version: Literal["neuron-dra/v1"]
    kind: Literal["NeuronCatalog"]
    families: dict[FamilyName, FamilyDoc] | None = None
    instance_types: dict[InstanceType, InstanceDoc] | None = None


def _range(low: int, high: int) -> str:
    return f"an integer from {low} to {high}"


# What is allowed, by the key an error is about ("efaMap[]": an item of efaMap).
ALLOWED = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "families": "a mapping of family name -> family",
    "instanceTypes": "a mapping of instance type -> instance type",
    "basedOn": "a known name",
    "family": "a family name",
    "deviceName": "a short name like Trainium3",
    "archType": "sysfs arch_type, e.g. NDv4",
    "archInstanceType": "sysfs instance_type, e.g. Trn3",
    "coreGeneration": "e.g. NeuronCore-v4",
    "pciDeviceId": _range(0, 0xFFFF),
    "coresPerDevice": _range(1, MAX_CORES),
    "hbmGiB": _range(1, MAX_HBM_GIB),
    "devices": _range(1, MAX_DEVICES),
    "efaCount": _range(0, MAX_EFA),
    "supported": "true or false",
    "capacityBlocks": "true or false",
    "default": LNC_ALLOWED,
    "topology": ", ".join(k.value for k in TopologyKind),
    "efaMap": "a list with one EFA PCI address (like 0000:c9:00.0) per Neuron device, or []",
    "efaMap[]": "a PCI address like 0000:c9:00.0",
    "servers": f"{' or '.join(map(str, ULTRASERVER_SERVERS))} (UltraServerConfig modes "
               f"{', '.join(map(str, ULTRASERVER_MODES))} address at most {max(ULTRASERVER_SERVERS)} servers)",
    "generation": "a short label",
    "families[]": "a family name: lowercase letters, digits and '-', starting with a letter",
    "instanceTypes[]": "an EC2 instance type name like trn3.48xlarge",
    "instanceTypes[]string_too_long": f"at most {INSTANCE_TYPE_MAX} characters (it is an attribute and a label "
                                      "value)",
}
# The model of a mapping, by the key it is under ("families[]": an entry of families).
MODELS: dict[str, type[_Doc]] = {"": CatalogDoc, "families[]": FamilyDoc, "instanceTypes[]": InstanceDoc,
                                 "lnc": LncDoc, "ultraServer": UltraServerDoc}


def keys(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items())
