"""What the checks model one node group's nodes as: an instance type at a node LNC.

`NodeType("trn2.48xlarge", lnc=1)` (the text `trn2.48xlarge:lnc=1` of `claims check --instance-type`) is a node
the driver publishes at LNC=1, with that layout's cores and core groups (driver/model/partitions.py); `lnc=None`
is the family's default. LNC exists on Trainium2 and later only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec
from neuron_dra.driver.model.config import LNC_VALUES
from neuron_dra.driver.model.partitions import CoreLayout

_TEXT = re.compile(r"^(?P<type>[^:]+)(?::lnc=(?P<lnc>[^:]*))?$")
LNC_CHOICES = " or ".join(map(str, LNC_VALUES))
LNC_TEXT_RULE = f"INSTANCE_TYPE or INSTANCE_TYPE:lnc=N (N: {LNC_CHOICES}, Trainium2 and later)"


@dataclass(frozen=True)
class NodeType:
    """An instance type at a node LNC (None: the family's default)."""

    instance_type: str
    lnc: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.instance_type, str) or not self.instance_type:
            raise TemplateError("NodeType.instance_type", self.instance_type, "an instance type name")
        if self.lnc is not None and (isinstance(self.lnc, bool) or self.lnc not in LNC_VALUES):
            raise TemplateError("NodeType.lnc", self.lnc, f"{LNC_CHOICES}, or None for the family's default")

    @classmethod
    def parse(cls, text: str) -> NodeType:
        """`trn2.48xlarge` or `trn2.48xlarge:lnc=1`."""
        m = _TEXT.match(text) if isinstance(text, str) else None
        if m is None:
            raise TemplateError("instance type", text, LNC_TEXT_RULE)
        lnc = m.group("lnc")
        if lnc is None:
            return cls(m.group("type"))
        if lnc not in {str(v) for v in LNC_VALUES}:
            raise TemplateError("instance type", text, LNC_TEXT_RULE)
        return cls(m.group("type"), int(lnc))

    @classmethod
    def of(cls, value: str | NodeType) -> NodeType:
        return value if isinstance(value, NodeType) else cls.parse(value)

    @property
    def label(self) -> str:
        """How reports and tables name it: the instance type, with `:lnc=N` when one was given."""
        return self.instance_type if self.lnc is None else f"{self.instance_type}:lnc={self.lnc}"

    def __str__(self) -> str:
        return self.label

    def spec(self, hardware: Catalog = BUILTIN) -> InstanceSpec:
        """The catalog entry, after checking the type is known and takes this LNC (TemplateError otherwise)."""
        if self.instance_type not in hardware:
            raise TemplateError("NodeType.instance_type", self.instance_type,
                                "a catalog instance type" + hardware.unknown_type_text(self.instance_type))
        spec = hardware.spec(self.instance_type)
        if self.lnc is not None and not spec.lnc_supported:
            raise TemplateError("NodeType.lnc", self.lnc,
                                f"no lnc on {self.instance_type}: {spec.family.device_name} has no Logical "
                                "NeuronCores (Trainium2 and later only); drop lnc")
        return spec

    def effective_lnc(self, hardware: Catalog = BUILTIN) -> int:
        """The LNC the driver publishes this node at: the given one, else the family's default (1 without LNC)."""
        return CoreLayout.for_spec(self.spec(hardware), self.lnc).lnc


NodeTypeInput = str | NodeType
