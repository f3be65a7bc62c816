"""No test asserts an elapsed time under 2 s: such a bound fails on a loaded machine, not when the code breaks.

Tests wait on events (the thing happened, or did not, in order) or read a fake clock; where the timing is the feature,
the test keeps a bound of at least 2 s and the precise figure is a benchmark's (bench/). This scans tests/ and fails
on what it defines as an elapsed-time assertion under 2 s:

- a *clock call* is a call of `time.monotonic`, `time.perf_counter`, `time.time` (their `_ns` forms too; imported
  bare too but `time()`), an event loop's `time()`, or of a function of tests/ that returns a clock-derived value;
- a *clock-derived* expression contains a clock call or a name (or attribute) assigned from a clock-derived
  expression in the same scope or one enclosing it (assignments, augmented assignments, `for` targets,
  `with ... as`, a container filled with one: `timings.append(...)`, `timings[i] = ...`);
- a *measured* expression is clock-derived or names a duration measured elsewhere (a program's `r["nanos"]`, a
  helper's `took`: a name, attribute or string key such as elapsed, took, duration, latency, nanos, seconds, or one
  ending `_ms`, `_ns`, `_seconds`, ...);
- an `assert` whose test compares a measured expression against a numeric literal (or arithmetic on literals) so
  that the literal bounds it from above (`x < c`, `x <= c`, `c > x`, `c >= x`, either link of a chained comparison,
  `max(...)` of them too) with c under 2 s (2e9 when the expression's names say nanoseconds, 2000 milliseconds)
  is a finding.

A lower bound (`x > 0.9`) is not: a loaded machine makes a run slower, never faster. Comparisons against a name
(`time.monotonic() < deadline`) are loops' deadlines, not assertions of a duration.
"""

from __future__ import annotations

import ast
import operator
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"})
LIMIT_SECONDS = 2.0


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def _key(node: ast.expr) -> str | None:
    """A name or dotted attribute (self.t0) an assignment can taint; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and _key(node.value) is not None:
        return ast.unparse(node)
    return None


def _targets(node: ast.expr) -> Iterator[str]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, (ast.Starred, ast.Subscript)):  # *rest; timings[i] = ...: the container holds readings
        yield from _targets(node.value)
    elif (key := _key(node)) is not None:
        yield key


@dataclass(frozen=True)
class _Refs:
    """What an expression refers to, read once: a clock call in it, the names it reads, the functions it calls."""

    clock: bool
    names: frozenset[str]
    calls: frozenset[str]

    @classmethod
    def of(cls, node: ast.AST) -> _Refs:
        clock, names, calls = False, set(), set()
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)) and (key := _key(sub)) is not None:
                names.add(key)
            if not isinstance(sub, ast.Call):
                continue
            func = sub.func
            if isinstance(func, ast.Name):  # `from time import monotonic`; a bare time() is too ambiguous to count
                clock |= func.id in CLOCKS - {"time"}
                calls.add(func.id)
            elif isinstance(func, ast.Attribute):
                owner = ast.unparse(func.value)
                if owner == "time":  # the time module: a fake clock object is not it
                    clock |= func.attr in CLOCKS
                elif func.attr == "time":  # an asyncio event loop's clock
                    clock |= owner.endswith(("loop", "loop()"))
                calls |= {func.attr, f"{owner}.{func.attr}"}  # self.timed(), helpers.timed()
        return cls(clock, frozenset(names), frozenset(calls))

    def derived(self, tainted: set[str], functions: frozenset[str]) -> bool:
        return self.clock or not self.names.isdisjoint(tainted) or not self.calls.isdisjoint(functions)


# A duration measured elsewhere (a program's JSON, a helper's result) by its name: `r["nanos"]`, `took`, `x.elapsed_ms`.
DURATION = re.compile(r"^(elapsed|took|duration|latency|nanos|millis|seconds|ms|ns)$|_(elapsed|took|duration|latency"
                      r"|nanos|millis|seconds|ms|ns)$")


def _names_a_duration(node: ast.expr) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            name = sub.id
        elif isinstance(sub, ast.Attribute):
            name = sub.attr
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant):
            name = str(sub.slice.value)
        else:
            continue
        if DURATION.search(name):
            return True
    return False


DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_FILLS = frozenset({"append", "extend", "add", "insert", "update", "setdefault", "put", "put_nowait"})


def _own(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a module's or a function's own scope: not those inside the functions it defines."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        sub = todo.pop()
        yield sub
        if not isinstance(sub, DEFS):
            todo.extend(ast.iter_child_nodes(sub))


def _binding(node: ast.AST) -> Iterator[tuple[list[str], ast.AST]]:
    """(names bound, the expression they are bound from) of a node, for the bindings the taint follows."""
    if isinstance(node, ast.Assign):
        yield [k for t in node.targets for k in _targets(t)], node.value
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
        yield list(_targets(node.target)), node.value
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        yield list(_targets(node.target)), node.iter
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _FILLS
          and (key := _key(node.func.value)) is not None):  # timings.append(elapsed)
        yield [key], node
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        for item in node.items:
            if item.optional_vars is not None:
                yield list(_targets(item.optional_vars)), item.context_expr


@dataclass
class _Scope:
    """A module's or a function's own scope, read once: its bindings, its asserts, its returns, the scopes it nests."""

    name: str
    bindings: list[tuple[frozenset[str], _Refs]] = field(default_factory=list)
    asserts: list[ast.Assert] = field(default_factory=list)
    returns: list[_Refs] = field(default_factory=list)
    nested: list[_Scope] = field(default_factory=list)

    @classmethod
    def of(cls, node: ast.AST) -> _Scope:
        scope = cls(getattr(node, "name", ""))
        for sub in _own(node):
            if isinstance(sub, DEFS):
                scope.nested.append(cls.of(sub))
            elif isinstance(sub, ast.Assert):
                scope.asserts.append(sub)
            elif isinstance(sub, ast.Return) and sub.value is not None:
                scope.returns.append(_Refs.of(sub.value))
            for names, value in _binding(sub):
                scope.bindings.append((frozenset(names), _Refs.of(value)))
        if isinstance(node, ast.Lambda):
            scope.returns.append(_Refs.of(node.body))
        return scope

    def tainted(self, functions: frozenset[str], inherited: frozenset[str] = frozenset()) -> frozenset[str]:
        """The names this scope binds from a clock-derived expression (and what it inherits), to a fixpoint."""
        tainted = set(inherited)
        while more := {n for names, refs in self.bindings if refs.derived(tainted, functions) for n in names} - tainted:
            tainted |= more
        return frozenset(tainted)

    def walk(self, functions: frozenset[str], inherited: frozenset[str] = frozenset(),
             ) -> Iterator[tuple[_Scope, frozenset[str]]]:
        """Each scope with its clock-derived names, this one first."""
        tainted = self.tainted(functions, inherited)
        yield self, tainted
        for scope in self.nested:
            yield from scope.walk(functions, tainted)


@dataclass
class _Module:
    path: str
    scope: _Scope
    imports: list[tuple[str, str, str]]  # (module, name, bound): from tests.m import name as bound; ("", m, bound)

    @classmethod
    def parse(cls, source: str, path: str) -> _Module:
        tree = ast.parse(source, path)
        imports = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                imports += [(node.module, a.name, a.asname or a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                imports += [("", a.name, a.asname or a.name) for a in node.names]
        return cls(path, _Scope.of(tree), imports)

    def imported(self, exported: dict[str, frozenset[str]]) -> frozenset[str]:
        """The clock functions of the other modules this one imports, by the names it calls them."""
        names = set()
        for module, name, bound in self.imports:
            if module and name in exported.get(module, ()):  # from tests.support.m import timed
                names.add(bound)
            qualified = f"{module}.{name}" if module else name  # from tests.support import m / import m: m.timed
            names |= {f"{bound}.{f}" for f in exported.get(qualified, ())}
        return frozenset(names)

    def clock_functions(self, imported: frozenset[str]) -> frozenset[str]:
        """The functions this module defines whose return value is clock-derived (helpers that time a call)."""
        functions = imported
        while True:
            found = {s.name for s, tainted in self.scope.walk(functions)
                     if s.name and any(r.derived(set(tainted), functions) for r in s.returns)}
            if found <= functions:
                return functions - imported
            functions |= found

    def findings(self, functions: frozenset[str]) -> list[Finding]:
        found = []
        for scope, tainted in self.scope.walk(functions):
            for node in scope.asserts:
                for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                    for bounded, bound in _upper_bounds(compare):
                        measured = _Refs.of(bounded).derived(set(tainted), functions) or _names_a_duration(bounded)
                        if measured and bound < _limit(bounded):
                            found.append(Finding(self.path, node.lineno, ast.unparse(compare)))
        return sorted(found, key=lambda f: f.line)


def clock_functions(modules: dict[str, _Module]) -> dict[str, frozenset[str]]:
    """Per module (dotted name), the clock functions it can call: its own and those it imports from the others."""
    exported: dict[str, frozenset[str]] = {}
    while True:
        now = {m: module.clock_functions(module.imported(exported)) for m, module in modules.items()}
        if now == exported:
            return {m: exported[m] | module.imported(exported) for m, module in modules.items()}
        exported = now


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.Pow: operator.pow}


def _number(node: ast.expr) -> float | None:
    """The value of a numeric literal or of arithmetic on literals (`1.0 + 3`, `0.4e9`); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and (value := _number(node.operand)) is not None:
        return -value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _number(node.left), _number(node.right)
        if left is not None and right is not None:
            try:
                return float(_ARITHMETIC[type(node.op)](left, right))
            except ArithmeticError:
                return None
    return None


def _limit(expr: ast.expr) -> float:
    """2 s in the unit the bounded expression's names say: nanoseconds, milliseconds or (by default) seconds."""
    text = ast.unparse(expr)
    if "_ns" in text or "nanos" in text:
        return LIMIT_SECONDS * 1e9
    if "_ms" in text or "millis" in text:
        return LIMIT_SECONDS * 1e3
    return LIMIT_SECONDS


def _upper_bounds(compare: ast.Compare) -> Iterator[tuple[ast.expr, float]]:
    """(bounded expression, literal) for each `expr < literal`-like link of a (chained) comparison."""
    operands = [compare.left, *compare.comparators]
    for left, op, right in zip(operands[:-1], compare.ops, operands[1:], strict=True):
        if isinstance(op, (ast.Lt, ast.LtE)) and (bound := _number(right)) is not None:
            yield left, bound
        elif isinstance(op, (ast.Gt, ast.GtE)) and (bound := _number(left)) is not None:
            yield right, bound


def findings(source: str, path: str = "<source>") -> list[Finding]:
    """The elapsed-time asserts under 2 s of one module's source."""
    module = _Module.parse(source, path)
    return module.findings(clock_functions({"<source>": module})["<source>"])


def scan(root: Path = TESTS) -> list[Finding]:
    """The elapsed-time asserts under 2 s of every module under root (a tests/ folder; its modules are tests.*)."""
    modules = {".".join(f.relative_to(root.parent).with_suffix("").parts):
               _Module.parse(f.read_text(), str(f.relative_to(root.parent))) for f in sorted(root.rglob("*.py"))}
    functions = clock_functions(modules)
    return [x for m, module in modules.items() for x in module.findings(functions[m])]


def test_no_test_asserts_an_elapsed_time_under_2_s() -> None:
    bad = scan()
    assert not bad, "elapsed-time asserts under 2 s (wait on an event or a fake clock; timings go to bench/):\n" + (
        "\n".join(map(str, bad)))


# Each a module of its own; the bad ones hold exactly one elapsed-time assert under 2 s.
BAD_EXAMPLES = {
    "direct": """
        start = time.monotonic()
        work()
        assert time.monotonic() - start < 1
    """,
    "named": """
        t0 = time.perf_counter()
        work()
        elapsed = time.perf_counter() - t0
        assert elapsed < 0.25
    """,
    "reversed": """
        t0 = time.time()
        assert 1.5 > time.time() - t0
    """,
    "chained": """
        start = time.monotonic()
        assert 0.9 < time.monotonic() - start < 1.9
    """,
    "max of a list": """
        timings = []
        for _ in range(3):
            s = time.monotonic()
            timings.append(time.monotonic() - s)
        assert max(timings) < 0.25, "GetInfo"
    """,
    "through a helper": """
        def timed(f):
            s = time.perf_counter()
            f()
            return time.perf_counter() - s
        def test():
            assert timed(print) <= 1
    """,
    "an attribute": """
        class T:
            def test(self):
                self.t0 = time.monotonic()
                assert time.monotonic() - self.t0 < 1e-1
    """,
    "nanoseconds": """
        s = time.monotonic_ns()
        assert time.monotonic_ns() - s < 400_000_000
    """,
    "in a boolean": """
        from time import perf_counter
        s = perf_counter()
        assert ok and perf_counter() - s < 1 + 0.5
    """,
    "a program's figure": """
        result = json.loads(run())
        assert result["error"] == "" and result["nanos"] < 0.4e9
    """,
    "a helper's result by its name": """
        took = stopwatch(work)
        assert took <= 1.5
    """,
    "in a nested function": """
        def test():
            start = time.monotonic()
            def check():
                assert time.monotonic() - start < 1
    """,
}

GOOD_EXAMPLES = {
    "a bound of 2 s": """
        s = time.monotonic()
        assert time.monotonic() - s < 2
    """,
    "a lower bound": """
        s = time.monotonic()
        assert time.monotonic() - s > 0.9
    """,
    "a deadline": """
        deadline = time.monotonic() + 1
        assert time.monotonic() < deadline, "late"
    """,
    "a fake clock's reading": """
        s = clock.monotonic()
        clock.advance(0.5)
        assert clock.monotonic() - s < 1
    """,
    "a program's figure over 2 s": """
        assert 0.4e9 < json.loads(run())["nanos"] < 5e9
    """,
    "a timeout setting": """
        assert options.timeout < 1
    """,
    "no clock": """
        n = len([1])
        assert n < 1.5
    """,
    "another function's start": """
        def first():
            start = time.monotonic()
        def second(start):
            assert start < 1
    """,
}


def _module(example: str) -> str:
    return "import time\n" + textwrap.dedent(example).lstrip("\n")


def test_the_scan_catches_each_fabricated_elapsed_time_assert() -> None:
    for name, example in BAD_EXAMPLES.items():
        assert len(findings(_module(example))) == 1, name


def test_the_scan_leaves_bounds_of_2_s_lower_bounds_deadlines_and_fake_clocks_alone() -> None:
    for name, example in GOOD_EXAMPLES.items():
        assert findings(_module(example)) == [], name


def test_a_finding_names_the_file_and_line_and_helpers_are_followed_across_modules(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "support").mkdir(parents=True)
    (tests / "test_bad.py").write_text(_module(BAD_EXAMPLES["named"]))
    (tests / "support" / "timing.py").write_text(_module("""
        def timed(f):
            start = time.perf_counter()
            f()
            return time.perf_counter() - start
    """))
    (tests / "test_helper.py").write_text(textwrap.dedent("""
        from tests.support import timing
        from tests.support.timing import timed as took
        def test():
            assert took(print) < 1
            assert timing.timed(print) < 0.5
            assert took(print) < 2
    """))
    assert [str(f) for f in scan(tests)] == [
        "tests/test_bad.py:5: elapsed < 0.25", "tests/test_helper.py:5: took(print) < 1",
        "tests/test_helper.py:6: timing.timed(print) < 0.5"]
