"""Args fields that take `pulumi.Input[...]`: a value known now is checked at construction, a value known only at
deploy time (an Output of another resource or a StackReference) is checked inside `apply`, with the same check and
so the same message (field, value, what is allowed); `pulumi preview` then fails with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pulumi

from neuron_dra.components.settings import SettingError
from neuron_dra.driver.errortext import refuse_unknown_keywords

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


class UnknownKeywordError(SettingError, TypeError):
    """A keyword argument a component's Args do not take (a TypeError too, as Python's own would be)."""


A = TypeVar("A", bound=type)
ArgsT = TypeVar("ArgsT")


def component_args(component: str, make: Callable[..., ArgsT], args: ArgsT | None, kwargs: Mapping[str, Any]
                   ) -> ArgsT:
    """A component's Args, given whole (`args`) or as keywords (`make(**kwargs)`), not both."""
    if args is not None and kwargs:
        raise TypeError(f"{component}: give either args or keyword arguments, not both")
    return args if args is not None else make(**kwargs)


def on_cluster(cluster: Any, opts: pulumi.ResourceOptions | None) -> pulumi.ResourceOptions | None:
    """`opts` with the Kubernetes provider of `cluster` (a TrainiumCluster, or None: `opts` as given) as the
    default; a provider in `opts` wins."""
    if cluster is None:
        return opts
    return pulumi.ResourceOptions.merge(pulumi.ResourceOptions(provider=cluster.provider), opts)


def keyword_hints(cls: A) -> A:
    """Wrap a dataclass Args' `__init__` (put it above `@dataclass`) so that an unknown keyword, given to the Args
    or to the component (`TrainiumCluster(name, **kwargs)`), is refused naming the closest field, where Python
    would only say "unexpected keyword argument" (the claim classes do the same: claim_templates/keywords.py)."""
    return refuse_unknown_keywords(cls, UnknownKeywordError)
