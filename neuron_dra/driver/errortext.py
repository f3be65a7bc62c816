"""One rule for echoing a value in an error message: a bounded repr, cut to a bounded length.

Errors name the offending value, but the value may be huge (a 1 MB string in a config file or a request), nested
past any recursion limit, or small on disk and huge in memory (YAML aliases referring to each other). Printed
whole it floods logs and terminals, and building `repr()` of it first can take gigabytes. `shown` builds the repr
with `reprlib` limits (depth, items per container, characters per string, digits per integer), so its cost is
bounded whatever the value, then keeps the start and says how long the rest was.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

MAX_SHOWN = 200  # characters of a value's repr in an error message
MAX_DIGITS = 40  # digits of an integer shown whole; longer ones are shown by their size only


class _Bounded(reprlib.Repr):
    """reprlib's limits, plus integers whose repr would be long (or raise: Python refuses > 4300 digits)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 4
        self.maxtuple = self.maxlist = self.maxarray = self.maxset = self.maxfrozenset = self.maxdeque = 8
        self.maxdict = 8
        self.maxstring = self.maxother = limit
        self.maxlong = MAX_DIGITS

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > MAX_DIGITS * 3.33:  # more than about MAX_DIGITS decimal digits: never converted
            return f"<int of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)

    def repr_str(self, x: str, level: int) -> str:
        if len(x) <= self.maxstring:
            return repr(x)
        return f"{x[:self.maxstring]!r}... ({len(x)} characters)"

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            return super().repr_instance(x, level)
        except (RecursionError, ValueError):
            return f"<{type(x).__name__}>"


_REPRS: dict[int, _Bounded] = {}


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """The value's repr, bounded: at most about `limit` characters. A longer string ends with '...' and its length;
    a container shows its first items, then '...'."""
    bounded = _REPRS.get(limit)
    if bounded is None:
        bounded = _REPRS.setdefault(limit, _Bounded(limit))
    try:
        text = bounded.repr(value)
    except RecursionError:  # an object whose own __repr__ nests deeper than Python can follow
        return f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= 2 * limit else f"{text[:limit]}..."


def capped(text: str, limit: int = 4 * MAX_SHOWN) -> str:
    """A message of another error, quoted inside ours: at most about `limit` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def did_you_mean(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """`"; did you mean 'x'?"` for the candidate closest to a misspelt `name` (difflib's ratio at least `cutoff`),
    else ''. One wording for every unknown name: instance types, families, attributes."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""
