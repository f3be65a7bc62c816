"""Errors of the claim templates: construction errors name the field, the value and what is allowed."""

from __future__ import annotations

from neuron_dra.driver.model.errors import NotAllowed


class TemplateError(NotAllowed):
    """Bad input to a typed claim template class, found at construction; `field` names the class and argument."""
