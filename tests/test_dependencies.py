"""Each part of the package imports only what the distributions it is installed with provide (pyproject.toml).

The core `dependencies` are the driver's, which its image installs (neuron_dra/driver/image-requirements.txt); the
kubernetes client and cel-python are extras (`local`, `pulumi`; `claims`), so the driver never needs them. Every
import statement counts, at module level or inside a function (a lazy import runs too, later), read from the source.
A module of a distribution counts where that distribution or one it requires (without an extra) is a requirement.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "neuron_dra"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE_REQUIREMENTS = PACKAGE / "driver" / "image-requirements.txt"

# What each part runs with, by path under neuron_dra/ (the longest prefix applies): "core" is `dependencies`, the
# others extras. The CLI imports each command's part only when that command runs (tests/cli/test_cli.py).
PARTS: dict[str, tuple[str, ...]] = {
    "": ("core",),
    "driver": ("core",),  # the image
    "driver/deploy/dashboard.py": ("core", "dashboard"),  # imports the SDK only when a dashboard is built
    "driver/kubeletplugin/_protogen.py": ("core", "dev"),  # `make protos`
    "claim_templates": ("core", "claims"),
    "localcluster": ("core", "local"),
    "components": ("core", "pulumi"),
    "cli": ("core", "claims", "local", "pulumi", "dashboard"),
}


def _requirements(texts: Iterable[str], extras: Mapping[str, list[str]]) -> set[str]:
    """The distribution names of requirement strings, this project's own extras (`neuron-dra[claims]`) expanded."""
    names = set()
    for text in texts:
        req = Requirement(text)
        if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
            names |= _requirements((t for e in req.extras for t in extras[e]), extras)
        else:
            names.add(canonicalize_name(req.name))
    return names


def _closure(names: set[str]) -> set[str]:
    """The distributions and what they require without an extra, as installed here."""
    todo, seen = list(names), set(names)
    while todo:
        try:
            texts = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for text in texts:
            req = Requirement(text)
            if req.marker is not None and ("extra" in str(req.marker) or not req.marker.evaluate()):
                continue
            if (name := canonicalize_name(req.name)) not in seen:
                seen.add(name)
                todo.append(name)
    return seen


@functools.cache
def allowed(sets: tuple[str, ...]) -> frozenset[str]:
    extras = PROJECT["optional-dependencies"]
    direct = {n for s in sets for n in _requirements(PROJECT["dependencies"] if s == "core" else extras[s], extras)}
    return frozenset(_closure(direct))


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import of a module, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            yield node.lineno, node.module.split(".")[0]


def undeclared(package: Path, parts: Mapping[str, tuple[str, ...]]) -> list[str]:
    """`path:line: module (distributions)` for each import of a third-party module its part is not installed with."""
    owners = {m: {canonicalize_name(d) for d in ds} for m, ds in packages_distributions().items()}
    ours = package.name
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        part = max((p for p in parts if p == "" or rel == p or rel.startswith(p + "/")), key=len)
        ok = allowed(parts[part])
        for line, module in imports(path):
            if module in sys.stdlib_module_names or module == ours:
                continue
            dists = owners.get(module, set())
            if not dists & ok:
                found.append(f"{ours}/{rel}:{line}: {module} ({', '.join(sorted(dists)) or 'not installed'}; "
                             f"{part or 'the package'} runs with {' + '.join(parts[part])})")
    return found


def test_each_part_imports_only_what_its_requirements_provide() -> None:
    assert undeclared(PACKAGE, PARTS) == []


def test_the_driver_needs_neither_the_kubernetes_client_nor_cel() -> None:
    core = allowed(("core",))
    assert not core & {"kubernetes", "cel-python", "lark", "google-re2"}, sorted(core)
    modules = {m for p in (PACKAGE / "driver").rglob("*.py") for _, m in imports(p)}
    assert not modules & {"kubernetes", "celpy", "lark", "re2"}


def test_the_image_installs_the_core_dependencies() -> None:
    pinned = {canonicalize_name(m.group(1)) for line in IMAGE_REQUIREMENTS.read_text().splitlines()
              if (m := re.match(r"^([A-Za-z0-9_.-]+)==", line.strip()))}
    assert _requirements(PROJECT["dependencies"], {}) <= pinned


def test_an_import_its_part_is_not_installed_with_is_named(tmp_path: Path) -> None:
    package = tmp_path / "neuron_dra"
    (package / "driver" / "daemon").mkdir(parents=True)
    (package / "driver" / "daemon" / "bad.py").write_text("import os\n\ndef f():\n    import kubernetes.client\n")
    (package / "claim_templates").mkdir()
    (package / "claim_templates" / "good.py").write_text("import celpy\nimport lark\nimport yaml\n")
    assert undeclared(package, PARTS) == [
        "neuron_dra/driver/daemon/bad.py:4: kubernetes (kubernetes; driver runs with core)"]
