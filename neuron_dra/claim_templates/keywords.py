"""Unknown keyword arguments to the typed claim classes: a TemplateError naming the closest keyword, where
Python would only say "unexpected keyword argument" (`Neuron(1, instance_type=...)`: did you mean
'instance_types'?)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.driver.errortext import did_you_mean

T = TypeVar("T", bound=type)

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


_GIVEN = "_given_arguments"


def given(obj: object) -> frozenset[str]:
    """The arguments (by name) the caller passed to a `keyword_hints` class's constructor, defaults left out."""
    return getattr(obj, _GIVEN, frozenset())


class UnknownKeywordError(TemplateError, TypeError):
    """A keyword argument the class does not take (a TypeError too, as Python's own would be)."""


def keyword_hints(cls: T) -> T:
    """Wrap `cls.__init__` (put it above `@dataclass`) so that an unknown keyword raises UnknownKeywordError
    with the class's keywords and the closest one, and the arguments the caller gave are known (`given`)."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    parameters = inspect.signature(init).parameters.items()
    keywords = tuple(name for name, p in parameters if p.kind in _NAMED and name != "self")
    positional = tuple(name for name, p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
                       and name != "self")
    # Positional arguments past the named ones go to a *args parameter, if any.
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for _, p in parameters):
        positional = positional[:next(i for i, (_, p) in enumerate(parameters)
                                      if p.kind is inspect.Parameter.VAR_POSITIONAL) - 1]

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in keywords:
                raise UnknownKeywordError(f"{cls.__name__}() keyword", name,
                                          f"{', '.join(keywords)}{did_you_mean(name, keywords)}")
        init(self, *args, **kwargs)
        # Not a dataclass field: equality, hashing and rendering ignore it.
        object.__setattr__(self, _GIVEN, frozenset((*positional[:len(args)], *kwargs)))

    cls.__init__ = checked_init  # type: ignore[misc]
    return cls
