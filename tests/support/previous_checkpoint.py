"""The previous release's checkpoint code (driver/checkpoint.py at commit 4b1e32e, format 1), loaded from its
verbatim copy in tests/fixtures/checkpoint_format1/ for up- and downgrade tests: what it wrote is what this release
must read, and what this release writes is what it must read after a rollback.

Only its imports are remapped (the driver's modules moved to packages since); the code is not changed.
`python -m tests.support.previous_checkpoint DIR` writes the fixture files the upgrade test reads.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

PINNED_COMMIT = "4b1e32e"
SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_format1" / f"checkpoint_{PINNED_COMMIT}.py.txt"
_MOVED = {
    "from neuron_dra.driver import k8s_names": "from neuron_dra.driver.model import k8s_names",
    "from neuron_dra.driver.atomicfile import": "from neuron_dra.driver.kubeletplugin._atomicfile import",
    "from neuron_dra.driver.cdi import": "from neuron_dra.driver.daemon.claims.cdi import",
    "from neuron_dra.driver.errortext import": "from neuron_dra.driver.errortext import",
}


def load() -> types.ModuleType:
    text = SOURCE.read_text()
    for old, new in _MOVED.items():
        assert old in text, old
        text = text.replace(old, new)
    module = types.ModuleType(f"checkpoint_{PINNED_COMMIT}")
    module.__file__ = str(SOURCE)
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(text, str(SOURCE), "exec"), module.__dict__)
    return module


def write_fixture(directory: Path) -> None:
    """Four prepared claims, one removed again and one unfinished prepare, as the previous release leaves them
    after a kill -9: a snapshot plus synced and unsynced journal records (no compaction at exit)."""
    from tests.support.checkpoint_claims import claim, uid

    old = load()
    cp = old.Checkpoint(directory / "checkpoint.json", journal_size=16384)
    cp.load()
    claims = {}
    for i in range(4):
        claims[uid(i)] = claim(old, uid(i), i)
        cp.save(dict(claims))
    claims[uid(9)] = claim(old, uid(9), 9, "PrepareStarted")
    cp.save(dict(claims), durable=False)
    del claims[uid(1)]
    cp.save(dict(claims))
    # no cp.close(): the records stay in the journal, as after a crash


if __name__ == "__main__":
    write_fixture(Path(sys.argv[1]))
