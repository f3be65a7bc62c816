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
