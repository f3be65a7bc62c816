"""The one "not allowed" error: a refusal that names the field, the value and what is allowed.

Each part specialises it with where the field lives (`ConfigError`: an opaque config field, `DeployOptionError`: a
driver option, `TemplateError`: a claim template argument, `SettingError`: a stack setting), so a caller can catch
`NotAllowed` for all of them and a part can restate another part's refusal under its own field name with
`restated` instead of copying the parts by hand.
"""

from __future__ import annotations

from typing import TypeVar

from neuron_dra.driver.errortext import shown

E = TypeVar("E", bound="NotAllowed")


class NotAllowed(ValueError):
    """`field`: what was given wrong, `value`: what was given, `allowed`: what would be accepted."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        # The value capped: a 1 MB value in a config file must not come back whole (errortext.shown).
        where = self.where()
        if len(where) > 300:  # field names come from input too (a config's keys)
            where = f"{where[:300]}... ({len(where)} characters)"
        super().__init__(f"{where}: {shown(value)} is not allowed; allowed: {allowed}")

    def where(self) -> str:
        """How the message names the field; subclasses say whose field it is."""
        return self.field

    def restated(self, error: type[E], field: str | None = None) -> E:
        """The same refusal as another part's error, under that part's name for the field."""
        return error(self.field if field is None else field, self.value, self.allowed)
