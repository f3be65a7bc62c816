"""What the components need from a claim template object, and how they name one (`namespace/name`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ClaimTemplateLike(Protocol):
    """What the component needs from a claim template object."""

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    def to_manifest(self) -> Mapping[str, Any]: ...


def template_key(template: ClaimTemplateLike) -> str:
    return f"{template.namespace}/{template.name}"
