"""The CEL environment of DRA device selectors, on a real CEL implementation (cel-python, `celpy`).

As in Kubernetes (k8s.io/dynamic-resource-allocation/cel): one variable `device` with `driver`,
`attributes[domain][name]` and `capacity[domain][name]` (an unprefixed name is in the driver's domain, an
unknown domain an empty map, an unknown name an evaluation error); the quantity and semver functions and
methods, `cel.bind`, the strings extension, the list library and regex `find`/`findAll` (FUNCTIONS, METHODS);
compile errors for undeclared functions, variables and device fields, expressions over 10 KiB and non-bool
results. cel-python has no `cel.bind`: it is rewritten to `[init].map(var, body)[0]`. Evaluations are memoised
per selector and per the values of the attributes it reads (cel_analysis).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

import celpy
import lark
import re2  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from neuron_dra.claim_templates.cel_analysis import (
    AnalysisError,
    DeviceRef,
    RefKind,
    SelectorAnalysis,
    analyze,
    conjuncts,
    without_binds,
)
from neuron_dra.claim_templates.cel_cost import COST_LIMIT, CostTooDeep, estimate
from neuron_dra.claim_templates.cel_types import INT64_MAX, INT64_MIN, CelValueError, Quantity, Semver
from neuron_dra.driver.errortext import capped

MAX_EXPRESSION_BYTES = 10 * 1024  # resource.k8s.io/v1 CELSelectorExpressionMaxLength
# Wall-clock bound of one evaluation (the cost estimate bounds the work; this catches what it cannot see).
EVALUATION_SECONDS = 5.0
TOO_DEEP = ("nested too deeply for this checker's CEL implementation (Python recursion); Kubernetes may accept it: "
            "remove redundant parentheses or split the selector")

# celpy logs every evaluation error at ERROR level; a selector that errors is a normal check outcome.
logging.getLogger("celpy").setLevel(logging.CRITICAL)


CARET_WINDOW = 60  # characters of the expression shown either side of a syntax error's caret


def syntax_error_text(expression: str, line: int | None, column: int | None) -> str:
    """`syntax error at line L, column C`, then the line (cut to a window around C) with a caret under column C,
    and a hint for the commonest slip: a single `=` where CEL compares with `==`."""
    head = f"syntax error at line {line}, column {column}"
    lines = expression.splitlines() or [expression]
    if line is None or column is None or not 1 <= line <= len(lines):
        return head
    text = lines[line - 1]
    at = min(max(column - 1, 0), len(text))
    start = max(0, at - CARET_WINDOW)
    shown_text = ("..." if start else "") + text[start:at + CARET_WINDOW] + ("..." if at + CARET_WINDOW < len(text)
                                                                          else "")
    caret = " " * (at - start + (3 if start else 0)) + "^"
    out = f"{head}:\n    {shown_text}\n    {caret}"
    if (text[at:at + 1] == "=" and text[at - 1:at] not in ("=", "!", "<", ">")) or text[at - 2:at + 1] == "===":
        out += "\n    `=` is not a CEL operator: use == to compare"
    return out


class CelCompileError(ValueError):
    """A selector that Kubernetes would reject at admission; names the expression."""

    def __init__(self, expression: str, message: str) -> None:
        self.expression = expression
        self.message = message
        super().__init__(f"CEL compile error in `{capped(expression, 200)}`: {message}")  # selectors may be 10 KiB


class CelEvaluationError(ValueError):
    """A selector that fails on a device (Kubernetes aborts allocation for the node)."""

    def __init__(self, expression: str, device: str, message: str) -> None:
        self.expression = expression
        self.device = device
        self.message = message
        super().__init__(f"CEL runtime error in `{capped(expression, 200)}` on device {device}: {message}")


# --- the device input -------------------------------------------------------------------------------

_MISSING = ("missing",)


@dataclass(frozen=True)
class CelDevice:
    """A published device as a selector sees it. Attribute values keep the API form ({"int": 1})."""

    name: str
    driver: str
    attributes: Mapping[str, Mapping[str, Mapping[str, Any]]]  # domain -> name -> {"int": 1}
    capacity: Mapping[str, Mapping[str, str]]  # domain -> name -> quantity string

    @classmethod
    def from_api(cls, driver: str, device: Mapping[str, Any], pool: str = "") -> CelDevice:
        """From a ResourceSlice device (`{"name", "attributes", "capacity": {n: {"value": q}}}`)."""
        attrs: dict[str, dict[str, Mapping[str, Any]]] = {}
        for qname, value in (device.get("attributes") or {}).items():
            domain, name = split_qualified_name(qname, driver)
            attrs.setdefault(domain, {})[name] = value
        caps: dict[str, dict[str, str]] = {}
        for qname, value in (device.get("capacity") or {}).items():
            domain, name = split_qualified_name(qname, driver)
            caps.setdefault(domain, {})[name] = str(value["value"])
        label = f"{driver}/{pool}/{device['name']}" if pool else f"{driver}/{device['name']}"
        return cls(label, driver, attrs, caps)

    def lookup(self, ref: DeviceRef) -> tuple[Any, ...]:
        """The value a reference reads, hashable; presence references read only presence."""
        if ref.kind is RefKind.ATTRIBUTE:
            value: Any = self.attributes.get(ref.domain, {}).get(ref.name)
        else:
            value = self.capacity.get(ref.domain, {}).get(ref.name)
        if value is None:
            return _MISSING
        if ref.presence:
            return ("present",)
        if isinstance(value, str):
            return ("quantity", value)
        return tuple(sorted(value.items()))

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """Everything a selector can observe about this device."""
        attrs = tuple(sorted((d, n, tuple(sorted(v.items()))) for d, m in self.attributes.items()
                             for n, v in m.items()))
        caps = tuple(sorted((d, n, q) for d, m in self.capacity.items() for n, q in m.items()))
        return (self.driver, attrs, caps)


def split_qualified_name(qname: str, driver: str) -> tuple[str, str]:
    """`domain/name` -> (domain, name); an unprefixed name belongs to the driver's domain."""
    domain, sep, name = qname.partition("/")
    return (domain, name) if sep else (driver, qname)


class _DomainMap(celtypes.MapType):
    """`device.attributes` / `device.capacity`: an unknown domain reads as an empty map (as in Kubernetes)."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


_ATTRIBUTE_TYPES: Mapping[str, Callable[[Any], Any]] = {
    "int": celtypes.IntType, "bool": celtypes.BoolType, "string": celtypes.StringType,
    "version": lambda v: Semver.parse(str(v)),
}


def _attribute_value(value: Mapping[str, Any]) -> Any:
    kind = next((k for k in _ATTRIBUTE_TYPES if k in value), None)
    if kind is None:
        raise CelValueError(f"unsupported attribute value {dict(value)!r}")
    return _ATTRIBUTE_TYPES[kind](value[kind])


def _cel_device(device: CelDevice) -> celtypes.MapType:
    s = celtypes.StringType
    attrs = _DomainMap({s(d): celtypes.MapType({s(n): _attribute_value(v) for n, v in m.items()})
                        for d, m in device.attributes.items()})
    caps = _DomainMap({s(d): celtypes.MapType({s(n): Quantity.parse(q) for n, q in m.items()})
                       for d, m in device.capacity.items()})
    return celtypes.MapType({s("driver"): s(device.driver), s("attributes"): attrs, s("capacity"): caps})


# --- functions ---------------------------------------------------------------------------------------

_Fn = Callable[..., Any]


def _cel_function(name: str, fn: _Fn) -> _Fn:
    """Turn Python errors of a library function into CEL error values, as cel-go reports them."""

    def wrapper(*args: Any) -> Any:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        try:
            return fn(*args)
        except (CelValueError, ValueError, IndexError) as e:
            return CELEvalError(str(e), type(e), e.args)
        except TypeError as e:
            kinds = ", ".join(type(a).__name__ for a in args)
            return CELEvalError(f"no such overload: {name}({kinds})", TypeError, e.args)

    wrapper.__name__ = name
    return wrapper


def _typed(kind: type, label: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    """A checker that converts a value of `kind` and raises TypeError (no such overload) for others."""

    def check(v: Any) -> Any:
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise TypeError(f"{type(v).__name__} is not {label}")
        return convert(v)

    return check


_str = _typed(str, "a string", str)
_int = _typed(int, "an int", int)
_quantity = _typed(Quantity, "a Quantity")
_semver = _typed(Semver, "a Semver")
_list = _typed(list, "a list", list)
_B, _I, _S = celtypes.BoolType, celtypes.IntType, celtypes.StringType


def _order(a: Any, b: Any) -> int:
    if isinstance(a, Quantity):
        return a.compare(_quantity(b))
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    raise TypeError("compareTo needs two Quantities or two Semvers")


def _delta(v: Any) -> Fraction:
    return v.value if isinstance(v, Quantity) else Fraction(_int(v))


def _in_range(index: int, length: int) -> int:
    if index < 0 or index > length:
        raise IndexError(f"index out of range: {index}")
    return index


# strings extension (cel-go ext.Strings, version 2 as in the Kubernetes base environment)

def _list_index(items: list[Any], sub: Any, positions: Iterable[int]) -> int:
    return next((i for i in positions if type(items[i]) is type(sub) and items[i] == sub), -1)


def _fn_index_of(target: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    if isinstance(target, list):
        return _I(_list_index(target, sub, range(len(target))))
    text = _str(target)
    return _I(text.find(_str(sub), _in_range(_int(start), len(text))))


def _fn_last_index_of(target: Any, sub: Any, *start: Any) -> celtypes.IntType:
    if isinstance(target, list):
        return _I(_list_index(target, sub, range(len(target) - 1, -1, -1)))
    text, needle = _str(target), _str(sub)
    end = _in_range(_int(start[0]), len(text)) if start else len(text)
    return _I(text.rfind(needle, 0, end + len(needle)))


def _fn_replace(s: Any, old: Any, new: Any, n: Any = -1) -> celtypes.StringType:
    count = _int(n)
    return _S(_str(s).replace(_str(old), _str(new), count if count >= 0 else -1))


def _fn_split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    text, separator, limit = _str(s), _str(sep), _int(n)
    if limit == 0:
        return celtypes.ListType()
    if separator == "":
        parts = list(text)
        if limit > 0 and len(parts) > limit:
            parts = [*parts[:limit - 1], "".join(parts[limit - 1:])]
    else:
        parts = text.split(separator, limit - 1 if limit > 0 else -1)
    return celtypes.ListType([_S(p) for p in parts])


def _fn_substring(s: Any, start: Any, *end: Any) -> celtypes.StringType:
    text, a = _str(s), _int(start)
    b = _int(end[0]) if end else len(text)
    if a < 0 or b > len(text) or a > b:
        raise IndexError(f"substring range [{a}, {b}) out of range for length {len(text)}")
    return _S(text[a:b])


def _fn_find_all(s: Any, pattern: Any, *n: Any) -> celtypes.ListType:
    found = [m.group(0) for m in re2.finditer(_str(pattern), _str(s))]
    if n and _int(n[0]) >= 0:
        found = found[:_int(n[0])]
    return celtypes.ListType([_S(f) for f in found])


def _ascii(s: Any, change: Callable[[str], str]) -> celtypes.StringType:
    return _S("".join(change(c) if c.isascii() else c for c in _str(s)))


# Kubernetes list library

def _fn_sum(items: Any) -> Any:
    total: Any = _I(0)
    for x in _list(items):
        total = total + x
    if isinstance(total, int) and not INT64_MIN <= total <= INT64_MAX:
        raise ValueError("integer overflow")
    return total


def _fn_max(items: Any) -> Any:
    xs = _list(items)
    if not xs:
        raise ValueError("max of an empty list")
    return max(xs)


def _fn_join(items: Any, sep: Any = "") -> celtypes.StringType:
    if not isinstance(items, list):
        raise TypeError("join needs a list of strings")
    return _S(_str(sep).join(_str(i) for i in items))


def _fn_find(s: Any, pattern: Any) -> celtypes.StringType:
    m = re2.search(_str(pattern), _str(s))
    return _S(m.group(0) if m else "")


FUNCTIONS: Mapping[str, _Fn] = {
    "quantity": lambda s: Quantity.parse(_str(s)),
    "isQuantity": lambda s: _B(Quantity.is_valid(_str(s))),
    "semver": lambda s, normalize=False: Semver.parse(_str(s), bool(normalize)),
    "isSemver": lambda s, normalize=False: _B(Semver.is_valid(_str(s), bool(normalize))),
}
METHODS: Mapping[str, _Fn] = {
    # Quantity and Semver
    "compareTo": lambda a, b: _I(_order(a, b)),
    "isGreaterThan": lambda a, b: _B(_order(a, b) > 0),
    "isLessThan": lambda a, b: _B(_order(a, b) < 0),
    "sign": lambda q: _I(_quantity(q).sign()),
    "isInteger": lambda q: _B(_quantity(q).is_integer()),
    "asInteger": lambda q: _I(_quantity(q).as_integer()),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_quantity(q).value)),
    "add": lambda q, v: _quantity(q).plus(_delta(v)),
    "sub": lambda q, v: _quantity(q).plus(-_delta(v)),
    "major": lambda v: _I(_semver(v).major),
    "minor": lambda v: _I(_semver(v).minor),
    "patch": lambda v: _I(_semver(v).patch),
    # strings extension
    "charAt": lambda s, i: _S(_str(s)[_in_range(_int(i), len(_str(s))):][:1]),
    "indexOf": _fn_index_of,
    "lastIndexOf": _fn_last_index_of,
    "lowerAscii": lambda s: _ascii(s, str.lower),
    "upperAscii": lambda s: _ascii(s, str.upper),
    "replace": _fn_replace,
    "split": _fn_split,
    "substring": _fn_substring,
    "trim": lambda s: _S(_str(s).strip()),
    "join": _fn_join,
    "find": _fn_find,
    "findAll": _fn_find_all,
    # list library
    "isSorted": lambda items: _B(all(a <= b for a, b in itertools.pairwise(_list(items)))),
    "sum": _fn_sum,
    "max": _fn_max,
}
_LIBRARY = {name: _cel_function(name, fn) for name, fn in {**FUNCTIONS, **METHODS}.items()}
# celpy's own functions: the CEL standard library (`min` is built into celpy's evaluator).
_STANDARD_FUNCTIONS = frozenset({"size", "int", "uint", "double", "string", "bool", "bytes", "type", "duration",
                                 "timestamp", "matches", "dyn", "has"})
_STANDARD_METHODS = frozenset({"size", "contains", "startsWith", "endsWith", "matches", "min", "getDate",
                               "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
                               "getMilliseconds", "getMinutes", "getMonth", "getSeconds"})
KNOWN_FUNCTIONS = frozenset(FUNCTIONS) | _STANDARD_FUNCTIONS
KNOWN_METHODS = frozenset(METHODS) | _STANDARD_METHODS


# --- compile and evaluate -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CompiledSelector:
    """A compiled selector and what it reads from `device`."""

    expression: str
    analysis: SelectorAnalysis
    program: celpy.Runner = field(compare=False, repr=False)
    ordered_refs: tuple[DeviceRef, ...] = field(compare=False, repr=False, default=())

    @property
    def refs(self) -> frozenset[DeviceRef]:
        return self.analysis.refs


@dataclass(frozen=True)
class _Outcome:
    value: bool
    error: str | None


_OPERATORS = {"relation_eq": "_==_", "relation_ne": "_!=_", "relation_lt": "_<_", "relation_le": "_<=_",
              "relation_gt": "_>_", "relation_ge": "_>=_", "relation_in": "@in", "addition_add": "_+_",
              "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
              "multiplication_mod": "_%_"}


def _describe(err: CELEvalError) -> str:
    message = str(err.args[0]) if err.args else "evaluation error"
    if message == "evaluation error" and len(err.args) > 2 and err.args[2]:
        inner = err.args[2]
        message = str(inner[0]) if isinstance(inner, tuple) and inner else str(inner)
    m = re.match(r"no such member in mapping: '?(.*?)'?$", message)
    if m:
        return f"no such key: {m.group(1)}"
    m = re.match(r"found no matching overload for Token\('RULE', '(\w+)'\) applied to '\((.*)\)'$", message)
    if m:
        op = _OPERATORS.get(m.group(1), m.group(1))
        kinds = ", ".join(k.rsplit(".", 1)[-1].rstrip("'>").replace("Type", "").lower()
                          for k in m.group(2).split(", "))
        return f"found no matching overload for '{op}' applied to ({kinds})"
    if message in ("no such key", "no such overload") and len(err.args) > 2 and err.args[2]:
        return f"{message}: {', '.join(map(str, err.args[2]))}"
    return message


class _EvaluationTimeout(BaseException):
    """Raised by SIGALRM anywhere inside cel-python, which turns an `Exception` raised during evaluation into a
    CELEvalError ("evaluation error"): deriving from BaseException keeps the timeout recognisable."""


@dataclass
class _Expiry:
    """Whether the alarm fired: then whatever the interrupted evaluation returned or raised is not its answer
    (cel-python's cleanup can raise its own error, e.g. a wrong overload, over the interrupted state)."""

    expired: bool = False


@contextlib.contextmanager
def _time_limit(seconds: float, expiry: _Expiry) -> Iterator[None]:
    """Interrupt the block after `seconds` (SIGALRM; only in the main thread, where the claims CLI evaluates;
    elsewhere the cost estimate is the only bound). The previous handler and timer are restored."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        expiry.expired = True
        raise _EvaluationTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    # Then again every few ms until the block ends: one interruption that lands where it is lost (in a C call,
    # or turned into a value by the evaluator) must not let the evaluation run on unbounded.
    signal.setitimer(signal.ITIMER_REAL, seconds, max(0.001, min(seconds, 0.05)))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CelEnvironment:
    """Compiles selectors (cached by text) and evaluates them on devices (memoised)."""

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._compiled: dict[str, CompiledSelector] = {}
        self._parts: dict[str, tuple[CompiledSelector, ...]] = {}
        self._outcomes: dict[tuple[str, tuple[Any, ...]], _Outcome] = {}
        # (expression, id(device)) -> (device, outcome); holding the device keeps its id from being reused
        self._by_device: dict[tuple[str, int], tuple[CelDevice, _Outcome]] = {}
        self._values: dict[tuple[Any, ...], celtypes.MapType | str] = {}
        self.evaluations = 0  # real CEL evaluations (the rest were answered from the memo)

    def compile(self, expression: str) -> CompiledSelector:
        cached = self._compiled.get(expression)
        if cached is not None:
            return cached
        if not isinstance(expression, str) or not expression.strip():
            raise CelCompileError(str(expression), "an expression is required")
        if len(expression.encode("utf-8")) > MAX_EXPRESSION_BYTES:
            raise CelCompileError(expression[:80] + "...", f"longer than {MAX_EXPRESSION_BYTES} bytes")
        try:
            tree = self._env.compile(expression)
            analysis = analyze(tree, KNOWN_FUNCTIONS, KNOWN_METHODS)
            cost = estimate(tree)
            if cost > COST_LIMIT:
                raise CelCompileError(expression, f"estimated cost {cost:,} exceeds Kubernetes' per-expression cost "
                                                  f"limit of {COST_LIMIT:,} (the API server refuses it: too complex, "
                                                  "exceeds cost limit); nest fewer comprehensions or range over less")
            # cel-python has no cel.bind: each becomes `([init].map(v, body)[0])` (cel_analysis.without_binds)
            program = self._env.program(self._env.compile(without_binds(expression, tree)), functions=_LIBRARY)
        except (RecursionError, CostTooDeep):
            raise CelCompileError(expression, TOO_DEEP) from None
        except CELParseError as e:
            raise CelCompileError(expression, syntax_error_text(expression, e.line, e.column)) from e
        except lark.exceptions.LarkError as e:
            raise CelCompileError(expression, f"syntax error: {' '.join(str(e).split())}") from e
        except AnalysisError as e:
            raise CelCompileError(expression, str(e)) from None
        compiled = CompiledSelector(expression, analysis, program, tuple(sorted(analysis.refs)))
        self._compiled[expression] = compiled
        return compiled

    def parts(self, compiled: CompiledSelector) -> tuple[CompiledSelector, ...]:
        """The selector's top-level `&&` parts, compiled (cel_analysis.conjuncts); itself when it has one."""
        cached = self._parts.get(compiled.expression)
        if cached is None:
            texts = conjuncts(compiled.expression, self._env.compile(compiled.expression))
            cached = (compiled,) if len(texts) == 1 else tuple(self.compile(t) for t in texts)
            self._parts[compiled.expression] = cached
        return cached

    def evaluate(self, selector: CompiledSelector | str, device: CelDevice) -> bool:
        """Whether the device matches; CelEvaluationError when the selector fails on it."""
        compiled = self.compile(selector) if isinstance(selector, str) else selector
        seen = self._by_device.get((compiled.expression, id(device)))
        if seen is not None:
            outcome = seen[1]
        else:
            analysis = compiled.analysis
            if analysis.opaque:
                key: tuple[Any, ...] = ("device", device.key)
            else:
                key = (device.driver if analysis.reads_driver else None,
                       *(device.lookup(r) for r in compiled.ordered_refs))
            memo_key = (compiled.expression, key)
            found = self._outcomes.get(memo_key)
            if found is None:
                found = self._run(compiled, device)
                self._outcomes[memo_key] = found
            outcome = found
            self._by_device[(compiled.expression, id(device))] = (device, outcome)
        if outcome.error is not None:
            raise CelEvaluationError(compiled.expression, device.name, outcome.error)
        return outcome.value

    def _run(self, compiled: CompiledSelector, device: CelDevice) -> _Outcome:
        self.evaluations += 1
        value = self._values.get(device.key)
        if value is None:
            try:
                value = _cel_device(device)
            except CelValueError as e:
                value = f"attribute value: {e}"
            self._values[device.key] = value
        if isinstance(value, str):
            return _Outcome(False, value)
        expiry = _Expiry()
        outcome: _Outcome | None = None
        try:
            with _time_limit(EVALUATION_SECONDS, expiry):
                result = compiled.program.evaluate({"device": value})
        except CELEvalError as e:
            outcome = _Outcome(False, _describe(e))
        except RecursionError:
            outcome = _Outcome(False, TOO_DEEP)
        except _EvaluationTimeout:
            expiry.expired = True
        else:
            outcome = _Outcome(bool(result), None) if isinstance(result, celtypes.BoolType) else _Outcome(
                False, f"CEL result of type {type(result).__name__} could not be converted to bool")
        if expiry.expired or outcome is None:
            return _Outcome(False, f"evaluation took longer than {EVALUATION_SECONDS} s (this checker's wall-clock "
                                   "limit per evaluation; Kubernetes' runtime cost limit is likely exceeded too)")
        return outcome

