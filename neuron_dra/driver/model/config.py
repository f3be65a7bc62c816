"""Opaque device configuration (`config[].opaque.parameters` for this driver), decoded strictly.

The same code decodes configs at prepare time in the daemon and in the claim checks before deploy,
so a typo such as `logicalNeuronCoreCount` fails `neuron-dra claims check` / `pulumi preview`
instead of leaving a pod in ContainerCreating.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_dra.driver.model.catalog import InstanceSpec
from neuron_dra.driver.model.errors import NotAllowed

API_VERSION = "neuron.aws.com/v1"
NEURON_CONFIG = "NeuronConfig"
ULTRASERVER_CONFIG = "UltraServerConfig"
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


@dataclass(frozen=True)
class ConfigField:
    """One field of a config kind besides apiVersion and kind: its JSON name, the model's attribute, the whole
    numbers allowed, and whether it must be given (an optional field may be absent or null: the host's default)."""

    name: str
    attribute: str
    allowed: tuple[int, ...]
    required: bool

    @property
    def allowed_text(self) -> str:
        return " or ".join(map(str, self.allowed))


@dataclass(frozen=True)
class ConfigKind:
    kind: str
    model: type[NeuronConfig] | type[UltraServerConfig]
    fields: tuple[ConfigField, ...]

    @property
    def known_fields(self) -> tuple[str, ...]:
        return ("apiVersion", "kind", *(f.name for f in self.fields))

    @property
    def fields_text(self) -> str:
        """What an unknown field's refusal allows."""
        return f"the fields of {self.kind}: {', '.join(self.known_fields)}"


# The kinds this driver accepts, in the order a refusal lists them: the one table `decode` reads and the
# claim admission policy (deploy/admission.py) is generated from.
CONFIG_KINDS: tuple[ConfigKind, ...] = (
    ConfigKind(NEURON_CONFIG, NeuronConfig, (ConfigField("logicalNeuronCore", "logical_neuron_core", LNC_VALUES,
                                                         required=False),)),
    ConfigKind(ULTRASERVER_CONFIG, UltraServerConfig, (ConfigField("ultraserverMode", "ultraserver_mode",
                                                                   ULTRASERVER_MODES, required=True),)),
)
KINDS = tuple(k.kind for k in CONFIG_KINDS)
KINDS_TEXT = " or ".join(KINDS)  # what a refused kind allows
PARAMETERS_TEXT = f"an object with apiVersion {API_VERSION} and kind"  # what parameters that are no object allow


def _strict_int(field: ConfigField, value: object) -> int:
    # bool is an int in Python; JSON true must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int) or value not in field.allowed:
        raise ConfigError(field.name, value, field.allowed_text)
    return value


def decode(parameters: object) -> OpaqueConfig:
    """Decode one opaque config's parameters; unknown kinds, fields and values are errors. Checked in this order:
    parameters, apiVersion, kind, unknown fields, then each field of the kind in CONFIG_KINDS order."""
    if not isinstance(parameters, Mapping):
        raise ConfigError("parameters", parameters, PARAMETERS_TEXT)
    api_version = parameters.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError("apiVersion", api_version, API_VERSION)
    kind = parameters.get("kind")
    spec = next((k for k in CONFIG_KINDS if k.kind == kind), None)
    if spec is None:
        raise ConfigError("kind", kind, KINDS_TEXT)
    for key in parameters:
        if key not in spec.known_fields:
            raise ConfigError(key, parameters[key], spec.fields_text)
    values: dict[str, Any] = {}
    for f in spec.fields:
        value = parameters.get(f.name)  # absent and null alike
        if value is None and not f.required:
            values[f.attribute] = None
        else:
            values[f.attribute] = _strict_int(f, value)
    return spec.model(**values)


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
