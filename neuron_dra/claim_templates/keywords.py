"""Unknown keyword arguments to the typed claim classes: a TemplateError naming the closest keyword, where
Python would only say "unexpected keyword argument" (`Neuron(1, instance_type=...)`: did you mean
'instance_types'?)."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.driver.errortext import refuse_unknown_keywords

T = TypeVar("T", bound=type)

_GIVEN = "_given_arguments"


def given(obj: object) -> frozenset[str]:
    """The arguments (by name) the caller passed to a `keyword_hints` class's constructor, defaults left out."""
    return getattr(obj, _GIVEN, frozenset())


class UnknownKeywordError(TemplateError, TypeError):
    """A keyword argument the class does not take (a TypeError too, as Python's own would be)."""


def keyword_hints(cls: T) -> T:
    """Wrap `cls.__init__` (put it above `@dataclass`) so that an unknown keyword raises UnknownKeywordError
    with the class's keywords and the closest one, and the arguments the caller gave are known (`given`)."""
    parameters = inspect.signature(cls.__init__).parameters.items()  # type: ignore[misc]
    positional = tuple(name for name, p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
                       and name != "self")
    # Positional arguments past the named ones go to a *args parameter, if any.
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for _, p in parameters):
        positional = positional[:next(i for i, (_, p) in enumerate(parameters)
                                      if p.kind is inspect.Parameter.VAR_POSITIONAL) - 1]

    def record(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Not a dataclass field: equality, hashing and rendering ignore it.
        object.__setattr__(self, _GIVEN, frozenset((*positional[:len(args)], *kwargs)))

    return refuse_unknown_keywords(cls, UnknownKeywordError, record)
