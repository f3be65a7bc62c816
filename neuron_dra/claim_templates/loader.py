"""Load the claim templates a Python file defines at module level (the file is executed, like a Pulumi program)."""

from __future__ import annotations

import runpy
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from neuron_dra.claim_templates.template import ClaimTemplate
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.driver.errortext import capped, shown
from neuron_dra.driver.model.catalog import BUILTIN, Catalog


class LoadError(ValueError):
    """A templates file that cannot be loaded; names the file."""


def templates_in(namespace: dict[str, object]) -> list[ClaimTemplate]:
    """ClaimTemplate values, and those inside module-level lists and tuples, in definition order, once each."""
    found: dict[int, ClaimTemplate] = {}
    for value in namespace.values():
        items: Iterable[object] = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, ClaimTemplate):
                found.setdefault(id(item), item)
    return list(found.values())


def jobs_in(namespace: dict[str, object]) -> list[UltraServerJob]:
    """UltraServerJob values (docs/ultraserver.md §4), as `templates_in` finds templates."""
    found: dict[int, UltraServerJob] = {}
    for value in namespace.values():
        items: Iterable[object] = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, UltraServerJob):
                found.setdefault(id(item), item)
    return list(found.values())


def load_templates(path: Path | str, catalog: Catalog = BUILTIN) -> list[ClaimTemplate]:
    """Run the file with the global `catalog` set (the hardware catalog the templates are checked against), so it
    can write `Neuron(..., catalog=catalog)` for a catalog file's own instance types."""
    templates, _ = load_definitions(path, catalog, jobs=False)
    return templates


def load_definitions(path: Path | str, catalog: Catalog = BUILTIN, jobs: bool = True
                     ) -> tuple[list[ClaimTemplate], list[UltraServerJob]]:
    """The file's module-level templates and (with `jobs`) UltraServerJobs; at least one of them."""
    file = Path(path)
    if not file.is_file():
        raise LoadError(f"{file}: no such file")
    try:
        namespace = runpy.run_path(str(file), init_globals={"catalog": catalog}, run_name="__claim_templates__")
    except SystemExit as e:  # sys.exit() in the file must not end the check as if it had passed
        raise LoadError(f"{file}: the file called sys.exit({shown(e.code)}) while being loaded; a templates file "
                        "only defines templates") from None
    except RecursionError:
        raise LoadError(f"{file}: RecursionError: nested too deeply while being loaded") from None
    except Exception as e:  # the file's own error (bad input to a class, syntax error) is the message
        raise LoadError(f"{file}: {type(e).__name__}: {capped(str(e), 2000)}") from e
    templates = templates_in(namespace)
    found_jobs = jobs_in(namespace) if jobs else []
    if not templates and not found_jobs:
        raise LoadError(f"{file}: defines no ClaimTemplate" + (" or UltraServerJob" if jobs else "")
                        + " at module level")
    names = [*(t.name for t in templates), *(j.template_name for j in found_jobs)]
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    duplicates += sorted(n for n, count in Counter(j.claim_name for j in found_jobs).items() if count > 1)
    if duplicates:
        raise LoadError(f"{file}: template names (an UltraServerJob's `<name>-node` too) and job names must be "
                        "unique (each becomes one ResourceClaimTemplate or ResourceClaim); "
                        f"defined more than once: {', '.join(shown(n) for n in duplicates)}")
    return templates, found_jobs
