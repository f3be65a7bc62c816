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


class UnknownKeywordError(TemplateError, TypeError):
    """A keyword argument the class does not take (a TypeError too, as Python's own would be)."""


def keyword_hints(cls: T) -> T:
    """Wrap `cls.__init__` (put it above `@dataclass`) so that an unknown keyword raises UnknownKeywordError
    with the class's keywords and the closest one."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    keywords = tuple(name for name, p in inspect.signature(init).parameters.items()
                     if p.kind in _NAMED and name != "self")

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in keywords:
                raise UnknownKeywordError(f"{cls.__name__}() keyword", name,
                                          f"{', '.join(keywords)}{did_you_mean(name, keywords)}")
        init(self, *args, **kwargs)

    cls.__init__ = checked_init  # type: ignore[misc]
    return cls
