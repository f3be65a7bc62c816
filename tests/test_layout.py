"""The installed package exposes one namespace and the console scripts (issue: no generic top-level names)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Collection
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("driver", "claim_templates", "components", "localcluster")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Run outside the repository: `python -m pytest` puts the repository root on sys.path; without PYTHONPATH
    # (a developer's pointer at a work tree, where the top-level folders are importable by design).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False,
                          env=env)


def test_the_package_is_real_folders_without_links() -> None:
    # Tools that read imports (import-linter, the structure drawings) cannot follow links: nothing is one.
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [line for line in tracked if line.startswith("120000")] == []
    for name in PARTS:
        assert (ROOT / "neuron_dra" / name / "__init__.py").is_file(), name
        assert not (ROOT / name).exists(), f"{name}/ belongs under neuron_dra/"


def test_only_the_neuron_dra_namespace_is_importable(tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u\n"
        f"for name in {tuple(PARTS)!r}:\n"
        "    assert u.find_spec(name) is None, name\n"
        "import neuron_dra.driver.model.catalog, neuron_dra.claim_templates, neuron_dra.localcluster.hostreqs\n"
        "print('ok')\n"
    )
    result = _python(probe, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_driver_package_does_not_import_pulumi(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "import neuron_dra.driver.daemon.main, neuron_dra.driver.deploy, neuron_dra.claim_templates.checks\n"
        "print(sorted(m for m in sys.modules if m.startswith('pulumi')))\n"
    )
    result = _python(probe, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_console_scripts_are_installed() -> None:
    scripts = Path(sysconfig.get_path("scripts"))  # where pip put this interpreter's console scripts
    for script in ("neuron-dra", "neuron-dra-driver"):
        path = scripts / script
        assert path.exists(), f"{script} is not installed in {scripts}"
        result = subprocess.run([str(path), "--help"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr


# --- The wheel ships every file the package reads -----------------------------------------------------------------
# Tracked under neuron_dra/ but read by maintainers only, never by the installed package: not package data.
MAINTAINER_ONLY = {
    "neuron_dra/localcluster/BUILD.md",  # how the pinned Go modules are bumped
    "neuron_dra/localcluster/go/new-kube-module.sh",  # makes a kube/<minor> module in a checkout
}


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], Path]:
    """The neuron_dra/ members of a wheel built (pip, no index) from a copy of the tracked files, and the wheel
    unpacked: what `pip install neuron-dra` puts in site-packages."""
    tracked = subprocess.run(["git", "ls-files", "-z", "--", "neuron_dra", "pyproject.toml", "README.md", "LICENSE"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    source, out, unpacked = (tmp_path_factory.mktemp(n) for n in ("src", "wheel", "site"))
    for name in filter(None, tracked):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("neuron_dra-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
        names = {n for n in archive.namelist() if n.startswith("neuron_dra/") and not n.endswith("/")}
    return names, unpacked


def test_the_wheel_holds_every_tracked_file_of_the_package(wheel_files: tuple[set[str], Path]) -> None:
    """Go modules, go.mod/go.sum, protos, YAML, JSON, the image's build files: what the code reads by path ships,
    including folders package discovery skips (kube/1.36 is no package name)."""
    shipped, _ = wheel_files
    tracked = set(filter(None, subprocess.run(["git", "ls-files", "-z", "neuron_dra"], cwd=ROOT, capture_output=True,
                                              text=True, check=True).stdout.split("\0")))
    assert sorted(tracked - shipped) == sorted(MAINTAINER_ONLY), "add it to [tool.setuptools.package-data]"
    assert sorted(shipped - tracked) == [], "the wheel holds files git does not track"
    assert {"neuron_dra/localcluster/go/kube/1.36/go.mod", "neuron_dra/localcluster/go/kube/1.36/tools.go"} <= shipped


def test_the_installed_driver_tree_is_exactly_the_image_manifest(wheel_files: tuple[set[str], Path]) -> None:
    """The driver image builds from site-packages (components/driver_image.py), whose Dockerfile refuses a driver
    tree that differs from image-files.txt in any file (docs/hardening.md §7)."""
    from tests.support import image_manifest

    shipped, _ = wheel_files
    manifest = image_manifest.parse((ROOT / image_manifest.MANIFEST).read_text())
    assert {n for n in shipped if n.startswith("neuron_dra/driver/")} == \
        {n for n in manifest if n.startswith("neuron_dra/driver/")}


def test_the_installed_package_asks_for_the_same_go_as_the_checkout(wheel_files: tuple[set[str], Path]) -> None:
    from neuron_dra.localcluster import hostreqs

    _, site = wheel_files
    assert hostreqs.required_go(site / "neuron_dra" / "localcluster" / "go") == hostreqs.required_go()


# --- The wheel ships no test harness ----------------------------------------------------------------------------
# A module of neuron_dra/ is part of the product when the product reaches it: from an entry point (a console script,
# a `python -m` target the repository's own Makefile or CI runs, `python -m neuron_dra`, a CLI command, a package's
# face) along imports (anywhere in a module, function-level ones too) or a module named whole in a string (what
# importlib or a `python -m` child loads). A module reached from none is used only by tests or bench: it belongs in
# tests/support or bench/ (issue 43).

PACKAGE = ROOT / "neuron_dra"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "_generated" not in p.parts}


def _uses(name: str, source: str, modules: Collection[str], *, face: bool = False) -> set[str]:
    """The package's modules that module `name` (its `source`; `face`: a package's __init__) imports, or names whole
    in a string."""
    package = name if face else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {m for m in found if m in modules and m != name}


def _entry_points(modules: Collection[str]) -> set[str]:
    from neuron_dra.cli import commands

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values()
    run = re.findall(r"-m (neuron_dra[\w.]*)", (ROOT / "Makefile").read_text() + (ROOT / ".ci" / "run").read_text())
    roots = {target.partition(":")[0] for target in scripts} | set(run)
    # The Pulumi plugin package (plugin/: PulumiPlugin.yaml and the provider executable other languages run).
    for entry in (ROOT / "plugin").iterdir():
        if entry.is_file() and entry.name != "PulumiPlugin.yaml":
            roots |= set(re.findall(r"^from (neuron_dra[\w.]*) import", entry.read_text(), re.M))
    roots |= {f"neuron_dra.cli.{source.stem}" for source in commands().values()}
    roots |= {m for m in modules if m.endswith(".__main__") or (PACKAGE.parent / m.replace(".", "/")).is_dir()}
    assert roots <= set(modules), sorted(roots - set(modules))
    return roots


def test_the_reach_follows_imports_anywhere_and_whole_names_in_strings() -> None:
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.f"}
    source = (
        '"""Mentions p.f in prose, which loads nothing."""\n'
        "from . import a\n"
        "from .b import thing\n"
        "def later() -> None:\n"
        "    import p.c\n"
        "ARGV = ['-m', 'p.d']\n"
    )
    assert _uses("p.x", source, modules) == {"p", "p.a", "p.b", "p.c", "p.d"}
    assert _uses("p", "from .e import y\n", modules, face=True) == {"p.e"}


def test_every_module_of_the_wheel_is_reached_from_an_entry_point() -> None:
    modules = _package_modules()
    reached = set(_entry_points(modules))
    todo = list(reached)
    while todo:
        name = todo.pop()
        path = modules[name]
        for used in _uses(name, path.read_text(), modules, face=path.name == "__init__.py") - reached:
            reached.add(used)
            todo.append(used)
    unreached = sorted(set(modules) - reached)
    assert unreached == [], "used only by tests or bench: move to tests/support or bench/"
