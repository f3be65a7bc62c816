"""Run kube-scheduler's structured DRA allocator (Go, `tests/support/go/allocsim`) on test cases.

The binary is built on first use and cached outside the tree under
`${NEURON_DRA_CACHE:-~/.cache/neuron-dra}/allocsim/<hash>/`, keyed by a hash of the module's Go
sources and go.mod/go.sum, so an edit to main.go or a version bump rebuilds it.

A case (see main.go for the full format):
    {"id": str, "slices": [ResourceSlice], "deviceClasses": [DeviceClass], "claims": [ResourceClaim],
     "allocated": [{"driver", "pool", "device"}], "nodeName": str, "mode": "fit-one" | "count",
     "nodeLabels": {str: str} (optional), "timeoutSeconds": float (optional, default 10)}
and its result:
    {"id", "satisfiable": bool, "count": int, "allocation": [[{"request", "driver", "pool", "device"}]],
     "error": str, "nanos": int}
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from neuron_dra.localcluster.build import BuildError, cache_root, cached_go_build, source_hash

MODULE = Path(__file__).resolve().parent / "go" / "allocsim"
BINARY = "allocsim"


class AllocsimError(RuntimeError):
    """The Go allocator could not be run or gave output that is not a result per case."""


def binary(*, cache: Path | None = None) -> Path:
    """The allocsim binary, built first when not cached."""
    target = (cache or cache_root()) / "allocsim" / source_hash(MODULE)
    built = cached_go_build(MODULE, {BINARY: "neuron-dra/tests/support/go/allocsim"}, target, ldflags=["-s", "-w"])
    return built[BINARY]


def run_cases(
    cases: list[dict[str, Any]], *, cache: Path | None = None, timeout_s: float = 600.0
) -> list[dict[str, Any]]:
    """Allocate each case with the Go allocator; one result per case, in order.

    A result's `error` is empty unless the case was bad input, the allocator failed (e.g. a CEL
    error), or the search hit the scheduler's 10 s filter timeout (`error` starts with "timeout:";
    the scheduler treats that node as unschedulable, so `satisfiable` is false). A case may set
    `timeoutSeconds` to shorten that bound.
    """
    try:
        exe = binary(cache=cache)
    except BuildError as e:
        raise AllocsimError(f"building allocsim failed: {e}") from e
    proc = subprocess.run(
        [str(exe)], input=json.dumps({"cases": cases}), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise AllocsimError(f"allocsim exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    try:
        results: list[dict[str, Any]] = json.loads(proc.stdout)["results"]
    except (ValueError, KeyError, TypeError) as e:
        raise AllocsimError(f"allocsim printed no results ({e}): {proc.stdout[:500]!r}") from e
    if len(results) != len(cases):
        raise AllocsimError(f"allocsim returned {len(results)} results for {len(cases)} cases")
    return results
