"""YAML from files a user hands in (catalog files, stack settings), parsed with PyYAML's safe loader within bounds.

A small file can still be expensive: aliases that refer to each other expand exponentially for whatever walks the
result (439 bytes make hundreds of millions of nodes), 10,000 nested brackets exhaust PyYAML's recursive composer
(RecursionError), and an integer of 4,300 digits makes Python's `int()` raise ValueError. Each bound below is
checked while the document is composed, before anything walks it, and a breach is a `YamlError` naming the line,
the column and the bound.
"""

from __future__ import annotations

from typing import Any

import yaml

from neuron_dra.driver.errortext import capped, shown

MAX_BYTES = 1 << 20  # a catalog file is a few KiB
MAX_DEPTH = 64  # nested mappings and sequences
MAX_ALIASES = 100  # `*name` references
MAX_NODES = 100_000  # nodes of the document with every alias expanded (what a walker of the result visits)
MAX_INT_DIGITS = 30  # characters of an integer scalar (Python refuses to convert more than 4,300 digits)


class YamlError(ValueError):
    """Text that is not YAML, or YAML past a bound: `allowed` says what a valid document looks like, `line` and
    `column` (1-based; 0 when unknown) where it went wrong."""

    def __init__(self, allowed: str, line: int = 0, column: int = 0, detail: str = "") -> None:
        self.allowed = allowed
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line else ""
        super().__init__(f"{allowed}{where}" + (f" ({detail})" if detail else ""))


def _error(allowed: str, mark: Any, detail: str = "") -> YamlError:  # a yaml Mark (pure or LibYAML) or None
    if mark is None:
        return YamlError(allowed, detail=detail)
    return YamlError(allowed, mark.line + 1, mark.column + 1, detail)


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._expanded: dict[int, int] = {}  # id(node) -> its node count with aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _error(f"at most {MAX_ALIASES} aliases (*name)", event.start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _error(f"at most {MAX_DEPTH} levels of nested mappings and sequences", event.start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None and self._count(node) > MAX_NODES:
            raise _error(f"at most {MAX_NODES} values with every alias expanded", event.start_mark)
        return node

    def _count(self, node: yaml.Node) -> int:
        known = self._expanded.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.SequenceNode):
            n = 1 + sum(self._expanded.get(id(c), 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n = 1 + sum(self._expanded.get(id(k), 1) + self._expanded.get(id(v), 1) for k, v in node.value)
        else:
            n = 1
        self._expanded[id(node)] = n
        return n

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value)
        if len(text) > MAX_INT_DIGITS:
            raise _error(f"integers of at most {MAX_INT_DIGITS} characters (this one has {len(text)})",
                         node.start_mark)
        _check_number(text, node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        _check_number(str(node.value), node)
        return super().construct_yaml_float(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Before the merge keys (<<) are flattened in: only keys written in this mapping can repeat.
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the constructor below names it
                continue
            if first is not key_node:
                raise _error(f"each key once per mapping (key {shown(key)} repeats the one of line "
                             f"{first.start_mark.line + 1})", key_node.start_mark,
                             "a repeated key would silently take the last value")
        return super().construct_mapping(node, deep)


def _check_number(text: str, node: yaml.ScalarNode) -> None:
    """YAML 1.1 reads `1_6` as 16, `1:30` as 90 and `017` as 15; a catalog value written so is a typo more often
    than not, so only plain decimal (and 0x hex for integers) is taken."""
    digits = text.lstrip("+-")
    if "_" in text or ":" in text or (len(digits) > 1 and digits[0] == "0" and digits[1].isdigit()):
        raise _error(f"numbers in plain decimal or 0x hex, without '_' or ':' or a leading 0 (got {shown(text)})",
                     node.start_mark)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_yaml_float)


def load(text: str) -> Any:
    """The single document in `text`; YamlError when it is not YAML or breaks a bound."""
    if len(text) > MAX_BYTES:
        raise YamlError(f"at most {MAX_BYTES} characters of YAML (this has {len(text)})")
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters (NUL, ESC...) here, before parsing
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise YamlError(f"printable text (control character {e.character:#04x} is not allowed in YAML)", line,
                        column) from None
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise _error("valid YAML", mark, capped(str(getattr(e, "problem", None) or e))) from None
    finally:
        loader.dispose()


def read(path: str) -> str:
    """The text of a YAML file, refusing one larger than MAX_BYTES before reading it whole."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlError(f"a file of at most {MAX_BYTES} bytes")
    return data.decode("utf-8")
