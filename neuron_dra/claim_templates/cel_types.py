"""Kubernetes' CEL value types for device selectors: Quantity (`quantity()`) and Semver (`semver()`).

Semantics follow k8s.io/apiserver/pkg/cel/library (quantity.go, semverlib.go): exact decimal
comparison of quantities (`1000m` equals `1`), semantic-version precedence (build metadata ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_NUMBER = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?\d+)$")
_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


class CelValueError(ValueError):
    """A CEL function got an argument it cannot convert (an evaluation error in CEL)."""


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes resource.Quantity, held as an exact rational value."""

    text: str
    value: Fraction

    @classmethod
    def parse(cls, text: str) -> Quantity:
        m = _NUMBER.match(text)
        if m is None:
            raise CelValueError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*"
                                f"[-+]?[0-9]*)$': {text!r}")
        sign, digits, suffix = m.groups()
        number = Fraction(digits)
        exp = _EXPONENT.match(suffix)
        if exp is not None:
            scale = Fraction(10) ** int(exp.group(1))
        elif suffix in _SUFFIXES:
            scale = _SUFFIXES[suffix]
        else:
            raise CelValueError(f"unable to parse quantity's suffix: {text!r}")
        value = number * scale
        return cls(text, -value if sign == "-" else value)

    @staticmethod
    def is_valid(text: str) -> bool:
        try:
            Quantity.parse(text)
        except CelValueError:
            return False
        return True

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        return self.value.denominator == 1 and INT64_MIN <= self.value <= INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise CelValueError(f"cannot convert value to integer: {self.text}")
        return int(self.value)

    def plus(self, delta: Fraction) -> Quantity:
        value = self.value + delta
        return Quantity(_format(value), value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    # Exact decimal when the denominator allows it; quantities from add/sub of parsed values always do.
    for exp in range(1, 19):
        scaled = value * 10**exp
        if scaled.denominator == 1:
            return f"{scaled.numerator}e-{exp}"
    return str(float(value))


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True)
class Semver:
    """A semantic version 2.0.0 (blang/semver's strict parser, as Kubernetes uses)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, normalize: bool = False) -> Semver:
        if normalize:
            text = _normalize_semver(text)
        m = _SEMVER.match(text)
        if m is None:
            raise CelValueError(f"could not parse semver: {text!r}")
        pre = tuple(m.group(4).split(".")) if m.group(4) else ()
        build = tuple(m.group(5).split(".")) if m.group(5) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, build)

    @staticmethod
    def is_valid(text: str, normalize: bool = False) -> bool:
        try:
            Semver.parse(text, normalize)
        except CelValueError:
            return False
        return True

    def compare(self, other: Semver) -> int:
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return (a > b) - (a < b)
        return _compare_pre(self.pre, other.pre)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        out = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            out += "-" + ".".join(self.pre)
        if self.build:
            out += "+" + ".".join(self.build)
        return out


def _normalize_semver(text: str) -> str:
    """Kubernetes' `semver(s, true)`: a leading 'v', missing minor/patch and leading zeros are accepted."""
    if text.startswith("v"):
        text = text[1:]
    m = re.match(r"^([0-9.]*)(.*)$", text, re.DOTALL)
    assert m is not None  # the pattern matches every string
    core, rest = m.group(1), m.group(2)
    parts = core.split(".")
    if not core or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return text  # the strict parser reports it
    return ".".join([str(int(p)) for p in parts] + ["0"] * (3 - len(parts))) + rest


def _compare_pre(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    # A version without pre-release identifiers has higher precedence.
    if not a or not b:
        return (not a) - (not b)
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        xn, yn = x.isdigit(), y.isdigit()
        if xn and yn:
            return (int(x) > int(y)) - (int(x) < int(y))
        if xn != yn:
            return -1 if xn else 1  # numeric identifiers sort before alphanumeric ones
        return (x > y) - (x < y)
    return (len(a) > len(b)) - (len(a) < len(b))
