"""One rule for echoing a value in an error message: its repr, cut to a bounded length.

Errors name the offending value, but the value may be huge (a 1 MB string in a config file or a request): printed
whole it floods logs and terminals. `shown` keeps the start and says how long the rest was.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

MAX_SHOWN = 200  # characters of a value's repr in an error message


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """`repr(value)`, at most about `limit` characters: longer ones end with '...' and the full length."""
    try:
        text = repr(value)
    except RecursionError:  # a structure nested deeper than repr can go
        return f"<{type(value).__name__} nested too deeply to show>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def capped(text: str, limit: int = 4 * MAX_SHOWN) -> str:
    """A message of another error, quoted inside ours: at most about `limit` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def did_you_mean(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """`"; did you mean 'x'?"` for the candidate closest to a misspelt `name` (difflib's ratio at least `cutoff`),
    else ''. One wording for every unknown name: instance types, families, attributes."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""
