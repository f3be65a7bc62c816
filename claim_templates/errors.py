"""Errors of the claim templates: construction errors name the field, the value and what is allowed."""

from __future__ import annotations

from neuron_dra.driver.errortext import shown


class TemplateError(ValueError):
    """Bad input to a typed claim template class, found at construction."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: {shown(value)} is not allowed; allowed: {allowed}")
