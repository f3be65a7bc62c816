"""Opaque device configuration (`config[].opaque.parameters` for this driver), decoded strictly.

The same code decodes configs at prepare time in the daemon and in the claim checks before deploy,
so a typo such as `logicalNeuronCoreCount` fails `neuron-dra claims check` / `pulumi preview`
instead of leaving a pod in ContainerCreating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.driver.model.catalog import InstanceSpec
from neuron_dra.driver.model.errors import NotAllowed

API_VERSION = "neuron.aws.com/v1"
NEURON_CONFIG = "NeuronConfig"
ULTRASERVER_CONFIG = "UltraServerConfig"
KINDS = (NEURON_CONFIG, ULTRASERVER_CONFIG)
LNC_VALUES = (1, 2)  # Logical NeuronCore config: physical cores per logical core (docs/neuron-cores.md §2)
LNC_ALLOWED = " or ".join(map(str, LNC_VALUES))  # how a refusal says it
ULTRASERVER_MODES = (1, 2, 4)


class ConfigError(NotAllowed):
    """An opaque config this driver cannot accept; `field` is the config's own field name (e.g. logicalNeuronCore)."""

    def where(self) -> str:
        return f"opaque config field {self.field!r}"


@dataclass(frozen=True)
class NeuronConfig:
    logical_neuron_core: int | None = None  # None: the host's default (2 on Trainium2)


@dataclass(frozen=True)
class UltraServerConfig:
    ultraserver_mode: int


OpaqueConfig = NeuronConfig | UltraServerConfig


def _strict_int(field: str, value: object, allowed: Sequence[int]) -> int:
    # bool is an int in Python; JSON true must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise ConfigError(field, value, " or ".join(map(str, allowed)))
    return value


def _check_fields(kind: str, params: Mapping[str, Any], known: Sequence[str]) -> None:
    for key in params:
        if key not in ("apiVersion", "kind", *known):
            raise ConfigError(key, params[key], f"the fields of {kind}: apiVersion, kind, {', '.join(known)}")


def decode(parameters: object) -> OpaqueConfig:
    """Decode one opaque config's parameters; unknown kinds, fields and values are errors."""
    if not isinstance(parameters, Mapping):
        raise ConfigError("parameters", parameters, f"an object with apiVersion {API_VERSION} and kind")
    api_version = parameters.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError("apiVersion", api_version, API_VERSION)
    kind = parameters.get("kind")
    if kind == NEURON_CONFIG:
        _check_fields(kind, parameters, ("logicalNeuronCore",))
        lnc = parameters.get("logicalNeuronCore")
        return NeuronConfig(None if lnc is None else _strict_int("logicalNeuronCore", lnc, LNC_VALUES))
    if kind == ULTRASERVER_CONFIG:
        _check_fields(kind, parameters, ("ultraserverMode",))
        if "ultraserverMode" not in parameters:
            raise ConfigError("ultraserverMode", None, " or ".join(map(str, ULTRASERVER_MODES)))
        return UltraServerConfig(_strict_int("ultraserverMode", parameters["ultraserverMode"], ULTRASERVER_MODES))
    raise ConfigError("kind", kind, " or ".join(KINDS))


def check_applies(config: OpaqueConfig, spec: InstanceSpec) -> None:
    """A valid config may still not fit the host: LNC needs Trainium2+, UltraServerConfig an UltraServer."""
    if isinstance(config, NeuronConfig) and config.logical_neuron_core is not None and not spec.lnc_supported:
        raise ConfigError(
            "logicalNeuronCore", config.logical_neuron_core,
            f"no logicalNeuronCore on {spec.instance_type} ({spec.family.device_name}): LNC applies to Trainium2 and "
            "later only",
        )
    if isinstance(config, UltraServerConfig) and not spec.ultraserver:
        raise ConfigError(
            "ultraserverMode", config.ultraserver_mode,
            f"no UltraServerConfig on {spec.instance_type}: UltraServer instance types only (trn2u.48xlarge, "
            "trn3p.48xlarge, or a catalog-file type with ultraServer)",
        )
    if isinstance(config, UltraServerConfig) and spec.ultraserver and \
            config.ultraserver_mode not in spec.ultraserver.modes:
        raise ConfigError(
            "ultraserverMode", config.ultraserver_mode,
            f"{' or '.join(map(str, spec.ultraserver.modes))} on {spec.instance_type} "
            f"({spec.ultraserver.servers} servers per UltraServer)",
        )


@dataclass(frozen=True)
class EffectiveConfig:
    """The config that applies to one request after merging (later entries win)."""

    logical_neuron_core: int | None = None
    ultraserver_mode: int | None = None

    def merged(self, config: OpaqueConfig) -> EffectiveConfig:
        if isinstance(config, NeuronConfig):
            if config.logical_neuron_core is None:
                return self
            return EffectiveConfig(config.logical_neuron_core, self.ultraserver_mode)
        return EffectiveConfig(self.logical_neuron_core, config.ultraserver_mode)
