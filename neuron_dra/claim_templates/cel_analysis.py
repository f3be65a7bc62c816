"""Static analysis of device-selector CEL: what a selector reads from `device`, and what cel-go would reject.

Kubernetes type-checks selectors at admission: an undeclared function or variable, or a field of
`device` other than driver/attributes/capacity, is a compile error there, so it is one here too.
The analysis also lists every attribute and capacity a selector reads (to name unpublished ones and
suggest the closest published name) and whether the selector reads `device` only through those
references; then its result depends only on their values, which lets the environment reuse one
evaluation for every device that agrees on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum

import lark

Tree = lark.Tree[lark.Token]

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


class RefKind(StrEnum):
    ATTRIBUTE = "attributes"
    CAPACITY = "capacity"


@dataclass(frozen=True, order=True)
class DeviceRef:
    """One `device.attributes[domain].name` (or capacity) the selector reads.

    `presence` is True when only the presence is tested (`'name' in ...`, `has(...)`)."""

    kind: RefKind
    domain: str
    name: str
    presence: bool = False

    def __str__(self) -> str:
        return f"device.{self.kind.value}[{self.domain!r}].{self.name}"


class AnalysisError(ValueError):
    """What cel-go's type checker would reject."""


@dataclass
class _Result:
    refs: set[DeviceRef] = field(default_factory=set)
    reads_driver: bool = False
    opaque: bool = False  # reads `device` in a way the references do not capture
    quantity_strings: list[tuple[DeviceRef, str]] = field(default_factory=list)


@dataclass(frozen=True)
class SelectorAnalysis:
    refs: frozenset[DeviceRef]
    reads_driver: bool
    opaque: bool
    # A capacity (a Kubernetes quantity) compared with a string literal, `capacity[...].memory >= "64Gi"`: no
    # such overload exists, so Kubernetes rejects the selector (cel-python would only fail at evaluation).
    quantity_strings: tuple[tuple[DeviceRef, str], ...] = ()


# What an expression node evaluates to, as far as the analysis needs to know.
class _Kind(Enum):
    VALUE = 0
    DEVICE = 1
    DOMAINS = 2  # device.attributes / device.capacity


@dataclass(frozen=True)
class _Domain:
    kind: RefKind
    domain: str


_Node = _Kind | _Domain | tuple[_Kind, RefKind]

_WRAPPERS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
                       "unary", "member", "primary", "paren_expr"})


def unwrap(tree: Tree) -> Tree:
    """Descend through the grammar's single-child precedence levels to the node that does something."""
    while tree.data in _WRAPPERS and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
        tree = tree.children[0]
    return tree


def string_literal(tree: Tree) -> str | None:
    """The value of a plain quoted string literal without escapes; None for anything else."""
    node = unwrap(tree)
    if node.data != "literal" or not isinstance(node.children[0], lark.Token):
        return None
    tok = node.children[0]
    if tok.type != "STRING_LIT":
        return None
    text = str(tok)
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0] or "\\" in text:
        return None
    return text[1:-1]


def ident_name(tree: Tree) -> str | None:
    node = unwrap(tree)
    if node.data == "ident" and isinstance(node.children[0], lark.Token):
        return str(node.children[0])
    return None


def _args(tree: Tree | None) -> list[Tree]:
    if tree is None:
        return []
    return [c for c in tree.children if isinstance(c, lark.Tree)]


class _Analyzer:
    def __init__(self, functions: frozenset[str], methods: frozenset[str]) -> None:
        self.functions = functions
        self.methods = methods
        self.out = _Result()

    def consume(self, kind: _Node) -> None:
        """A device-derived value used by something the references do not describe."""
        if kind != _Kind.VALUE:
            self.out.opaque = True

    def visit(self, tree: Tree, scope: Mapping[str, _Node]) -> _Node:
        node = unwrap(tree)
        handler = getattr(self, f"_{node.data}", None)
        if handler is not None:
            result: _Node = handler(node, scope)
            return result
        for child in node.children:
            if isinstance(child, lark.Tree):
                self.consume(self.visit(child, scope))
        return _Kind.VALUE

    def _ident(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        name = str(node.children[0])
        if name in scope:
            return scope[name]
        if name == "device":
            return _Kind.DEVICE
        raise AnalysisError(f"undeclared reference to {name!r} (the only variable is 'device')")

    def _member_dot(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        base = self.visit(node.children[0], scope)  # type: ignore[arg-type]
        name = str(node.children[1])
        if base == _Kind.DEVICE:
            if name == "driver":
                self.out.reads_driver = True
                return _Kind.VALUE
            if name in ("attributes", "capacity"):
                return (_Kind.DOMAINS, RefKind(name))
            raise AnalysisError(f"undefined field {name!r} of device (fields: driver, attributes, capacity)")
        if isinstance(base, tuple):
            return _Domain(base[1], name)
        if isinstance(base, _Domain):
            self.out.refs.add(DeviceRef(base.kind, base.domain, name))
        return _Kind.VALUE

    def _member_index(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        member, key = node.children[0], node.children[1]
        base = self.visit(member, scope)  # type: ignore[arg-type]
        literal = string_literal(key)  # type: ignore[arg-type]
        if isinstance(base, tuple) and literal is not None:
            return _Domain(base[1], literal)
        if isinstance(base, _Domain) and literal is not None:
            self.out.refs.add(DeviceRef(base.kind, base.domain, literal))
            return _Kind.VALUE
        self.consume(base)
        self.consume(self.visit(key, scope))  # type: ignore[arg-type]
        return _Kind.VALUE

    def _relation(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        op, right = node.children[0], node.children[1]
        assert isinstance(op, lark.Tree) and isinstance(right, lark.Tree)
        left = op.children[0]
        assert isinstance(left, lark.Tree)
        right_kind = self.visit(right, scope)
        literal = string_literal(left) if op.data == "relation_in" else None
        if op.data != "relation_in":
            self._note_quantity_string(left, right, scope)
        if isinstance(right_kind, _Domain) and literal is not None:
            self.out.refs.add(DeviceRef(right_kind.kind, right_kind.domain, literal, presence=True))
            return _Kind.VALUE
        self.consume(right_kind)
        self.consume(self.visit(left, scope))
        return _Kind.VALUE

    def _capacity_ref(self, tree: Tree, scope: Mapping[str, _Node]) -> DeviceRef | None:
        """The capacity `tree` reads directly (`device.capacity['d'].name` or `['name']`), else None."""
        node = unwrap(tree)
        if node.data not in ("member_dot", "member_index"):
            return None
        base = self.visit(node.children[0], scope)  # type: ignore[arg-type]
        if not isinstance(base, _Domain) or base.kind is not RefKind.CAPACITY:
            return None
        name = str(node.children[1]) if node.data == "member_dot" else string_literal(node.children[1])  # type: ignore[arg-type]
        return None if name is None else DeviceRef(RefKind.CAPACITY, base.domain, name)

    def _note_quantity_string(self, left: Tree, right: Tree, scope: Mapping[str, _Node]) -> None:
        for side, other in ((left, right), (right, left)):
            text = string_literal(other)
            ref = self._capacity_ref(side, scope) if text is not None else None
            if ref is not None and text is not None:
                self.out.quantity_strings.append((ref, text))

    def _ident_arg(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        name = str(node.children[0])
        args = _args(node.children[1] if len(node.children) > 1 else None)  # type: ignore[arg-type]
        if name == "has" and len(args) == 1:
            inner = unwrap(args[0])
            if inner.data == "member_dot":
                base = self.visit(inner.children[0], scope)  # type: ignore[arg-type]
                if isinstance(base, _Domain):
                    self.out.refs.add(DeviceRef(base.kind, base.domain, str(inner.children[1]), presence=True))
                    return _Kind.VALUE
                self.consume(base)
                return _Kind.VALUE
            raise AnalysisError("has() needs a field selection such as has(device.attributes['d'].name)")
        if name == "dyn" and len(args) == 1:
            return self.visit(args[0], scope)
        if name not in self.functions:
            raise AnalysisError(f"undeclared reference to function {name!r}")
        for a in args:
            self.consume(self.visit(a, scope))
        return _Kind.VALUE

    def _member_dot_arg(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        target = node.children[0]
        assert isinstance(target, lark.Tree)
        method = str(node.children[1])
        args = _args(node.children[2] if len(node.children) > 2 else None)  # type: ignore[arg-type]
        if method == "bind" and ident_name(target) == "cel" and "cel" not in scope:
            return self._bind(args, scope)
        if method in MACROS:
            var = ident_name(args[0]) if len(args) == 2 else None
            if var is None:
                raise AnalysisError(f"{method}() needs a variable name and an expression")
            self.consume(self.visit(target, scope))
            self.consume(self.visit(args[1], {**scope, var: _Kind.VALUE}))
            return _Kind.VALUE
        if method not in self.methods:
            raise AnalysisError(f"undeclared reference to method {method!r}")
        self.consume(self.visit(target, scope))
        for a in args:
            self.consume(self.visit(a, scope))
        return _Kind.VALUE

    def _bind(self, args: list[Tree], scope: Mapping[str, _Node]) -> _Node:
        var = ident_name(args[0]) if len(args) == 3 else None
        if var is None:
            raise AnalysisError("cel.bind() needs a variable name, an initial value and an expression")
        init = self.visit(args[1], scope)
        # A bound domain map stays a domain map: `cel.bind(a, device.attributes['d'], a.x)` reads d/x.
        if not isinstance(init, _Domain):
            self.consume(init)
            init = _Kind.VALUE
        return self.visit(args[2], {**scope, var: init})

    def _member_object(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        raise AnalysisError("message construction is not available in device selectors")

    def _dot_ident(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        return self._ident(node, {})

    def _dot_ident_arg(self, node: Tree, scope: Mapping[str, _Node]) -> _Node:
        return self._ident_arg(node, {})


def analyze(tree: Tree, functions: frozenset[str], methods: frozenset[str]) -> SelectorAnalysis:
    """What the selector reads from `device`; raises AnalysisError for what cel-go rejects at compile time."""
    a = _Analyzer(functions, methods)
    a.consume(a.visit(tree, {}))
    return SelectorAnalysis(frozenset(a.out.refs), a.out.reads_driver, a.out.opaque, tuple(a.out.quantity_strings))


def without_binds(expression: str, tree: Tree) -> str:
    """`expression` with each `cel.bind(v, init, body)` written as `([init].map(v, body)[0])` (cel-python has no
    cel.bind; a one-element map binds v to init, evaluated once).

    One pass: every bind becomes three replacements ("cel.bind(v," -> "([", the comma after init -> "].map(v,",
    the closing ")" -> ")[0])"). Nested binds sit inside an init or a body, so no two replacements overlap and all
    are applied in one splice: linear in the expression's length (re-parsing after each bind is quadratic)."""
    edits: list[tuple[int, int, str]] = []
    for node in tree.iter_subtrees_topdown():  # type: ignore[no-untyped-call]
        if node.data != "member_dot_arg" or str(node.children[1]) != "bind" or \
                not isinstance(node.children[0], lark.Tree) or ident_name(node.children[0]) != "cel":
            continue  # not a cel.bind(...) call
        args = [c for c in node.children[2].children if isinstance(c, lark.Tree)]
        if len(args) != 3:
            raise AnalysisError(f"cel.bind takes 3 arguments (a name, a value, an expression), got {len(args)}")
        v, init, _ = args
        name = expression[v.meta.start_pos:v.meta.end_pos]
        first = expression.index(",", v.meta.end_pos)
        # A keyword literal (true, false, null) carries no position: it holds no comma, the next one ends it.
        second = expression.index(",", getattr(init.meta, "end_pos", None) or first + 1)
        end = node.meta.end_pos
        edits += [(node.meta.start_pos, first + 1, "(["), (second, second + 1, f"].map({name},"),
                  (end - 1, end, ")[0])")]
    out, at = [], 0
    for start, stop, text in sorted(edits):
        out += [expression[at:start], text]
        at = stop
    out.append(expression[at:])
    return "".join(out)


def _only_child(node: Tree, data: str) -> Tree | None:
    kids = [c for c in node.children if isinstance(c, lark.Tree)]
    return kids[0] if node.data == data and len(kids) == 1 and len(node.children) == 1 else None


def _and_operands(node: Tree) -> list[Tree] | None:
    """The operands of a top-level `a && b && ...` (parentheses around a conjunction opened), or None when the
    node is not one."""
    inner = _only_child(node, "expr")
    inner = _only_child(inner, "conditionalor") if inner is not None else None
    if inner is None or inner.data != "conditionaland":
        return None
    out: list[Tree] = []
    stack = [inner]
    while stack:  # conditionaland is left-nested: [conditionaland, relation] or [relation]
        n = stack.pop()
        kids = [c for c in n.children if isinstance(c, lark.Tree)]
        if n.data == "conditionaland" and len(kids) == 2:
            stack += [kids[1], kids[0]]
        elif n.data == "conditionaland" and len(kids) == 1:
            stack.append(kids[0])
        else:
            out.append(n)
    return out if len(out) > 1 else None


def _paren_conjunction(node: Tree) -> Tree | None:
    """The inner expression of `( a && b )` written as one operand, else None."""
    for sub in node.iter_subtrees_topdown():  # type: ignore[no-untyped-call]
        if sub.data == "paren_expr":
            break
        kids = [c for c in sub.children if isinstance(c, lark.Tree)]
        if len(kids) != 1 or len(sub.children) != 1:
            return None
    else:
        return None
    inner = sub.children[0]
    return inner if isinstance(inner, lark.Tree) and _and_operands(inner) is not None else None


def conjuncts(expression: str, tree: Tree) -> list[str]:
    """The parts of a top-level conjunction `a && (b && c) && d` as their source text (a, b, c, d), in order:
    what the templates merge into one selector (requests.merged_selectors), so that a check can name the part
    that is false. An expression that is not a conjunction is its own one part."""
    return _parts(expression, tree) or [expression]


def _parts(expression: str, node: Tree) -> list[str] | None:
    operands = _and_operands(node)
    if operands is None:
        return None
    out: list[str] = []
    for op in operands:
        nested = _paren_conjunction(op)
        inner = _parts(expression, nested) if nested is not None else None
        if inner is not None:
            out += inner
            continue
        start, end = getattr(op.meta, "start_pos", None), getattr(op.meta, "end_pos", None)
        if start is None or end is None:
            return None  # a bare keyword literal carries no position: keep the whole
        out.append(expression[start:end].strip())
    return out
