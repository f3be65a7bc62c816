"""The evidence behind the code ships with it: facts live in docs/, cited as `docs/<page>.md`, and nothing
refers to a folder outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Built from parts so this file does not match itself.
OUTSIDE_FACTS = re.compile(r"\.\./" + "shared" + r"|" + "shared" + r"/facts")
DOC_CITATION = re.compile(r"docs/([A-Za-z0-9_-]+\.md)")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = []
    for name in listed.stdout.split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink():
            files.append(path)
    return files


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # binary


@pytest.mark.process
def test_no_file_refers_to_facts_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_text_files():
        text = _read(path)
        if text is None:
            continue
        offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(text.splitlines(), 1)
                      if OUTSIDE_FACTS.search(line)]
    assert offenders == [], f"cite docs/<page>.md instead: {offenders}"


@pytest.mark.process
def test_every_cited_docs_page_exists() -> None:
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    missing = set()
    for path in _tracked_text_files():
        text = _read(path)
        if text is None:
            continue
        missing |= {f"{path.relative_to(ROOT)} -> docs/{page}" for page in DOC_CITATION.findall(text)
                    if page not in pages}
    assert missing == set(), sorted(missing)


def test_every_docs_page_names_its_sources() -> None:
    """Each page says where its facts come from (a list up front or a source per fact): upstream addresses or
    repository paths, not a folder outside the repository."""
    upstream = re.compile(r"https?://|\.(go|proto|rst|md)\b|kubernetes/kubernetes|k8s\.io/")
    for page in (ROOT / "docs").glob("*.md"):
        if page.name == "README.md":
            continue
        text = page.read_text(encoding="utf-8")
        assert re.search(r"(?i)\bsources?\b", text) and upstream.search(text), f"{page.name}: name the sources"


# --- Every repository path the README and the docs name exists ------------------------------------------------
#
# The pages checked: README.md, docs/**/*.md and neuron_dra/**/*.md. In them, a reference is one of:
# 1. a root path: a run of `[A-Za-z0-9_.*<>/-]` that starts with a top-level folder of the repository and a slash
#    (`neuron_dra/`, `docs/`, `tests/`, `bench/`, `.ci/`, `.github/`: the folders git tracks), anywhere in the page
#    (prose, code spans, code blocks), not glued to a preceding word, dot, slash or `~` (so `https://x/docs/y`,
#    `~/.cache/...` and `a/tests/b` are not ours); resolved from the repository root;
# 2. a part path: a code span that starts with a folder of neuron_dra/ and a slash (`driver/...`, `localcluster/...`),
#    resolved under neuron_dra/;
# 3. a link target `[text](target)` that is not a URL (no `scheme:`) nor a bare `#anchor`, resolved from the page's
#    folder, its `#anchor` dropped;
# 4. a module name `neuron_dra.a.b`: a module or package, or a name that the module (a package's __init__.py)
#    defines or imports, after a module or package.
# A path ends before `::` (a pytest node id) and drops one trailing `.` or `,` (end of a sentence); `<placeholder>`
# and `*` are globs that must match at least one file (`docs/<page>.md`); a trailing `/` asks for a folder.
# Not ours, so written so that no rule takes them: an upstream path with its repository before it
# (`github.com/containerd/containerd/v2/docs/cri/config.md`), a path at an old commit as `COMMIT:path`.

PATH_CHARS = r"[\w.*<>/-]"
DOCUMENTED = ("README.md", "docs/**/*.md", "neuron_dra/**/*.md")
MODULE_NAME = re.compile(r"(?<![\w.])neuron_dra(?:\.\w+)+")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _top_level_folders() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted({name.split("/", 1)[0] for name in listed.splitlines() if "/" in name})


def _exists(base: Path, relative: str) -> bool:
    wants_folder = relative.endswith("/")
    pattern = re.sub(r"<[^<>/]*>", "*", relative.rstrip("/"))
    if not pattern:
        return base.is_dir()
    matches = list(base.glob(pattern)) if "*" in pattern else [base / pattern]
    return any(m.is_dir() if wants_folder else m.exists() for m in matches)


def _module_exists(name: str) -> bool:
    parts = name.split(".")
    as_path = ROOT.joinpath(*parts)
    if as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file():
        return True
    parent = ROOT.joinpath(*parts[:-1])
    source = parent.with_suffix(".py") if parent.with_suffix(".py").is_file() else parent / "__init__.py"
    defined = re.compile(rf"\b{re.escape(parts[-1])}\b")
    return source.is_file() and defined.search(source.read_text(encoding="utf-8")) is not None


def _trim(token: str) -> str:
    token = token.split("::", 1)[0]
    return token[:-1] if token.endswith((".", ",")) else token


def stale_references(text: str, page: Path) -> list[str]:
    """The references of a page (the rule above) that name nothing in the repository, as `line: reference`."""
    roots = "|".join(re.escape(f) for f in _top_level_folders())
    root_path = re.compile(rf"(?<![\w./~-])(?:{roots})/{PATH_CHARS}*")
    parts = "|".join(re.escape(p.name) for p in (ROOT / "neuron_dra").iterdir() if p.is_dir())
    part_path = re.compile(rf"(?:{parts})/{PATH_CHARS}*")
    stale = []
    for number, line in enumerate(text.splitlines(), 1):
        for token in root_path.findall(line):
            if not _exists(ROOT, _trim(token)):
                stale.append(f"{number}: {_trim(token)}")
        for span in CODE_SPAN.findall(line):
            match = part_path.match(span)
            if match and not _exists(ROOT / "neuron_dra", _trim(match.group(0))):
                stale.append(f"{number}: {_trim(match.group(0))} (under neuron_dra/)")
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            relative = target.split("#", 1)[0]
            if not _exists(page.parent, relative):
                stale.append(f"{number}: {target} (link)")
        for name in MODULE_NAME.findall(line):
            if not _module_exists(name.rstrip(".")):
                stale.append(f"{number}: {name} (module)")
    return stale


def _documented_pages() -> list[Path]:
    return sorted({page for pattern in DOCUMENTED for page in ROOT.glob(pattern)})


@pytest.mark.process
def test_every_repository_path_the_readme_and_docs_name_exists() -> None:
    stale = [f"{page.relative_to(ROOT)}:{ref}" for page in _documented_pages()
             for ref in stale_references(page.read_text(encoding="utf-8"), page)]
    assert stale == [], "\n".join(stale)


@pytest.mark.process
def test_the_path_check_catches_stale_paths_and_only_those() -> None:
    page = ROOT / "docs" / "example.md"  # a page that is not there: only its folder matters, for its links
    text = "\n".join([
        "The state is in `neuron_dra/driver/daemon/claims/state.py` and neuron_dra/driver/daemon/gone.py.",  # 1: stale
        "Cited as docs/<page>.md, e.g. docs/cdi.md §2; tests/ and `bench/bench_peer.py` too.",
        "Run `tests/driver/nothing_here.py::test_x`.",  # 3: stale, node id dropped
        "See [upgrades](upgrades.md), [the driver](../neuron_dra/driver/README.md#running-it), [x](#top).",
        "See [gone](../docs/gone" ".md) and [web](https://kubernetes.io/docs/concepts/x).",  # 5: stale link
        "The layer `driver/kubeletplugin/` and `localcluster/nowhere.py`.",  # 6: stale part path
        "python -m neuron_dra.driver.kubeletplugin._protogen; neuron_dra.components.mocks.run_offline.",
        "neuron_dra.driver.daemon.gone and neuron_dra.components.mocks.no_such_name.",  # 8: stale modules
        "Upstream: `github.com/containerd/containerd/v2/docs/cri/config.md`, ~/.cache/neuron-dra/go/, "
        "`4b1e32e:driver/checkpoint.py`.",
        "A folder: `neuron_dra/driver/README.md/` is not one.",  # 10: a file where a folder is named
    ])
    assert stale_references(text, page) == [
        "1: neuron_dra/driver/daemon/gone.py",
        "3: tests/driver/nothing_here.py",
        "5: ../docs/gone" ".md (link)",
        "6: localcluster/nowhere.py (under neuron_dra/)",
        "8: neuron_dra.driver.daemon.gone (module)",
        "8: neuron_dra.components.mocks.no_such_name (module)",
        "10: neuron_dra/driver/README.md/",
    ]


def test_the_docs_index_lists_every_page_once() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| \[([\w-]+\.md)\]\(\1\) \|", index, flags=re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(listed) == pages, set(listed) ^ set(pages)
