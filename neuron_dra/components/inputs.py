"""Args fields that take `pulumi.Input[...]`: a value known now is checked at construction, a value known only at
deploy time (an Output of another resource or a StackReference) is checked inside `apply`, with the same check and
so the same message (field, value, what is allowed); `pulumi preview` then fails with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pulumi

T = TypeVar("T")


def is_known(value: object) -> bool:
    """No Output or awaitable anywhere in `value` (lists, tuples and mappings are looked into)."""
    if isinstance(value, pulumi.Output) or inspect.isawaitable(value):
        return False
    if isinstance(value, list | tuple):
        return all(is_known(v) for v in value)
    if isinstance(value, Mapping):
        return all(is_known(v) for v in value.values())
    return True


def checked(value: pulumi.Input[T], check: Callable[[Any], object]) -> pulumi.Input[T]:
    """`value` with `check` applied: now when it is known (the value comes back as it is), else once it resolves
    (an Output that fails with `check`'s error)."""
    if is_known(value):
        check(value)
        return value

    def run(resolved: Any) -> Any:
        check(resolved)
        return resolved

    return pulumi.Output.from_input(value).apply(run)
