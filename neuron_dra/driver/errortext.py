"""One rule for echoing a value in an error message: a bounded repr, cut to a bounded length.

Errors name the offending value, but the value may be huge (a 1 MB string in a config file or a request), nested
past any recursion limit, or small on disk and huge in memory (YAML aliases referring to each other). Printed
whole it floods logs and terminals, and building `repr()` of it first can take gigabytes. `shown` builds the repr
with `reprlib` limits (depth, items per container, characters per string, digits per integer), so its cost is
bounded whatever the value, then keeps the start and says how long the rest was.

Also the one wording of pydantic's refusals for every model of the project (`rule`, `checked`, `restate`): the
stack's settings, node groups and pools, and the driver's deployment options.
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

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
    import difflib  # only on the error path: not part of the daemon's start-up memory

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


C = TypeVar("C", bound=type)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def refuse_unknown_keywords(cls: C, make: Callable[[str, object, str], Exception],
                            after: Callable[[Any, tuple[Any, ...], dict[str, Any]], None] | None = None) -> C:
    """Wrap `cls.__init__` so that a keyword it does not take raises `make(field, keyword, allowed)`, the allowed
    part listing its keywords and the closest one (`did_you_mean`), where Python would only say "unexpected keyword
    argument"; `after(self, args, kwargs)` runs once the constructor has. The one rule behind the claim classes'
    and the components' Args' `keyword_hints` (claim_templates/keywords.py, components/inputs.py)."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    keywords = tuple(name for name, p in inspect.signature(init).parameters.items()
                     if name != "self" and p.kind in _NAMED)

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in keywords:
                raise make(f"{cls.__name__}() keyword", name, f"{', '.join(keywords)}{did_you_mean(name, keywords)}")
        init(self, *args, **kwargs)
        if after is not None:
            after(self, args, kwargs)

    cls.__init__ = checked_init  # type: ignore[misc]
    return cls


# --- pydantic's refusals in these words (every model of the project: settings, node groups and pools, the driver's
# deployment options). pydantic is imported inside the functions: the daemon imports this module and, without a
# catalog file, never loads pydantic (driver/model/catalog_schema.py).

# What a value of the wrong type is refused with, by pydantic's error type.
TYPE_ERRORS: dict[str, str] = {
    "string_type": "a string", "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number", "bool_type": "true or false", "bool_parsing": "true or false",
    "tuple_type": "a list of strings", "list_type": "a list", "dict_type": "an object"}


def rule(test: Callable[[Any], object], allowed: str) -> Any:
    """A field's check beyond its type (an `AfterValidator`): `test`, else a refusal naming `allowed` that
    `restate` words under the field's name."""
    from pydantic import AfterValidator
    from pydantic_core import PydanticCustomError

    def check(value: Any) -> Any:
        if not test(value):
            raise PydanticCustomError("not_allowed", "{allowed}", {"allowed": allowed})
        return value

    return AfterValidator(check)


def checked(check: Callable[[str, object], object]) -> Any:
    """A field's check written as `check(field, value)` raising NotAllowed (k8s_names' checks), before pydantic's
    type check (a `BeforeValidator`); `restate` names the field."""
    from pydantic import BeforeValidator

    return BeforeValidator(lambda value: value if value is None else check("", value))


def restate(error: Any, make: Callable[[str, object, str], Exception], *, name: Callable[[str], str] = str,
            allowed: Mapping[str, str] | None = None,
            unknown: Callable[[str, object], Exception] | None = None) -> Exception:
    """pydantic's first refusal (a `ValidationError`) as the model's NotAllowed (`make(field, value, allowed)`):
    the field as `name(key)` says, the value, and what is allowed: a refusal a check raised under its own name as
    it is; one raised with no name (`checked`, `rule`) or by pydantic's types under the field's name, with the
    rule's text, else `allowed[key]`, else the type's; an unknown key as `unknown` words it."""
    first = error.errors()[0]
    ctx = first.get("ctx") or {}
    cause = ctx.get("error")
    key = str(first["loc"][0]) if first["loc"] else ""
    # A NotAllowed (driver/model/errors.py, known by its parts: this module is below every other).
    if cause is not None and all(hasattr(cause, a) for a in ("field", "value", "allowed")):
        return cause if cause.field else make(name(key), cause.value, cause.allowed)
    if first["type"] == "extra_forbidden" and unknown is not None:
        return unknown(name(key), first["input"])
    what = ctx.get("allowed") or (allowed or {}).get(key) or TYPE_ERRORS.get(first["type"], first["msg"])
    return make(name(key), first["input"], what)
