"""A conservative estimate of a selector's CEL cost, in the spirit of Kubernetes' cost estimator.

The API server refuses a selector whose *estimated* cost exceeds 1,000,000 (docs/hardening.md §3); cel-python
tracks no cost, so this estimates it from the parse tree with cel-go's rules simplified upward: every operation,
call, member access and literal costs 1; a macro costs its range plus, per element of the range's largest size,
its body plus 1; string functions cost 1 + length / 10; as in cel-go's checker/cost.go, `cel.bind` costs its init
once plus its body, and `a + b` is as large as both operands and costs that size / 10 more. Sizes come from the
expression or from the DRA limits on a device (strings <= 64 characters, <= 32 attributes and capacities); what
cannot be sized counts as MAX_UNKNOWN_SIZE. An upper bound of cel-go's for DRA selectors: nothing the API server
refuses for cost passes here.
"""

from __future__ import annotations

from dataclasses import dataclass

import lark

from neuron_dra.claim_templates.cel_analysis import MACROS, Tree, ident_name, unwrap

COST_LIMIT = 1_000_000  # apiserver: per-expression estimated cost limit of DRA selectors
MAX_STRING = 64  # a device attribute's string value (resource.k8s.io/v1)
MAX_MAP = 32  # attributes + capacities of one device
MAX_UNKNOWN_SIZE = 1024  # a list or string nothing bounds (cel-go would take the maximum the type allows)
STRING_TRAVERSAL = 10  # cel-go's StringTraversalCostFactor, 0.1: one cost unit per 10 characters
STRING_METHODS = frozenset({"split", "contains", "startsWith", "endsWith", "matches", "indexOf", "lastIndexOf",
                            "lowerAscii", "upperAscii", "replace", "substring", "trim", "find", "findAll", "join"})


class CostTooDeep(Exception):
    """The expression nests deeper than this estimator (and the evaluator) can follow."""


@dataclass(frozen=True)
class Estimate:
    cost: int
    size: int  # elements of a list/map or characters of a string it may hold; 1 for scalars
    element: int = 1  # size of each element (for nested ranges)


def _children(tree: Tree) -> list[Tree]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _first_token(tree: Tree) -> str:
    return next((str(c) for c in tree.children if isinstance(c, lark.Token)), "")


class _Estimator:
    def __init__(self) -> None:
        self.scope: dict[str, Estimate] = {}

    def visit(self, tree: Tree, depth: int = 0) -> Estimate:
        if depth > 400:
            raise CostTooDeep
        node = unwrap(tree)
        kind = node.data
        kids = _children(node)
        if kind == "literal":
            text = _first_token(node)
            return Estimate(1, max(1, len(text) - 2))
        if kind == "ident":
            name = _first_token(node)
            if name in self.scope:
                return self.scope[name]
            return Estimate(1, MAX_MAP, MAX_MAP if name == "device" else MAX_UNKNOWN_SIZE)
        if kind == "list_lit":
            items = [self.visit(k, depth + 1) for e in kids for k in _children(e)] if kids else []
            return Estimate(1 + sum(i.cost for i in items), len(items), max((i.size for i in items), default=1))
        if kind == "map_lit":
            parts = [self.visit(k, depth + 1) for e in kids for k in _children(e)] if kids else []
            return Estimate(1 + sum(p.cost for p in parts), len(parts) // 2 or 1, max((p.size for p in parts),
                                                                                    default=1))
        if kind == "member_dot":
            base = self.visit(kids[0], depth + 1)
            # A field of a map (device.attributes["d"].name): a string of at most MAX_STRING characters, or a map.
            return Estimate(base.cost + 1, max(base.element, MAX_STRING), MAX_STRING)
        if kind == "member_index":
            base, index = (self.visit(k, depth + 1) for k in kids[:2])
            return Estimate(base.cost + index.cost + 1, max(base.element, MAX_STRING), MAX_STRING)
        if kind == "member_dot_arg":
            return self._method(node, kids, depth)
        if kind == "ident_arg":
            args = [self.visit(k, depth + 1) for e in kids for k in _children(e)]
            return Estimate(1 + sum(a.cost for a in args), MAX_UNKNOWN_SIZE)
        # Operators, conditionals, unary, parentheses: the operands plus one.
        parts = [self.visit(k, depth + 1) for k in kids]
        if not parts:
            return Estimate(1, 1)
        cost = 1 + sum(p.cost for p in parts)
        element = max(p.element for p in parts)
        if kind == "addition" and len(kids) == 2 and unwrap(kids[0]).data == "addition_add":
            # cel-go (checker/cost.go, AddString/AddBytes/AddList): the result's size is the sum of both sizes,
            # and joining strings costs that size times StringTraversalCostFactor (0.1). The operand types are
            # unknown here, so the string cost is always charged: an upper bound for lists.
            size = parts[0].size + parts[1].size
            return Estimate(cost + size // STRING_TRAVERSAL, size, element)
        return Estimate(cost, max(p.size for p in parts), element)

    def _scoped(self, var: str, value: Estimate, trees: list[Tree], depth: int) -> list[Estimate]:
        """The estimates of `trees` with `var` standing for a value of `value`'s size (a bind or a macro)."""
        saved = self.scope.get(var)
        self.scope[var] = value
        try:
            return [self.visit(t, depth + 1) for t in trees]
        finally:
            if saved is None:
                self.scope.pop(var, None)
            else:
                self.scope[var] = saved

    def _method(self, node: Tree, kids: list[Tree], depth: int) -> Estimate:
        name = _first_token(node)
        target = kids[0]
        args = [c for e in kids[1:] for c in _children(e)] if len(kids) > 1 else []
        base = self.visit(target, depth + 1)
        if name == "bind" and len(args) == 3 and ident_name(target) == "cel":
            # cel-go (costBind): the init once, then the body with the variable sized as the init (pushLocalVar).
            init = self.visit(args[1], depth + 1)
            (body,) = self._scoped(ident_name(args[0]) or "", Estimate(1, init.size, init.element), args[2:], depth)
            return Estimate(base.cost + init.cost + body.cost, body.size, body.element)
        if name in MACROS and args:
            var = unwrap(args[0])
            var_name = _first_token(var) if var.data == "ident" else ""
            bodies = self._scoped(var_name, Estimate(1, base.element, MAX_STRING), args[1:], depth)
            per_element = 1 + sum(b.cost for b in bodies)
            size = base.size if name in ("map", "filter") else 1
            return Estimate(base.cost + base.size * per_element, size, max((b.size for b in bodies), default=1))
        rest = [self.visit(a, depth + 1) for a in args]
        cost = 1 + base.cost + sum(a.cost for a in rest)
        if name in STRING_METHODS:
            cost += base.size // STRING_TRAVERSAL
        if name == "split":
            return Estimate(cost, base.size + 1, base.size)
        return Estimate(cost, max(base.size, *(a.size for a in rest)) if rest else base.size, base.element)


def estimate(tree: Tree) -> int:
    """The estimated cost of a compiled expression (CostTooDeep when it nests too deeply to follow)."""
    return _Estimator().visit(tree).cost
