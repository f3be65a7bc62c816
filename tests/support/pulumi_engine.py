"""The real Pulumi engine for tests: the CLI and Kubernetes provider built by localcluster/build.py, an offline
file backend, and each Automation API step in a subprocess (tests/support/engine_driver.py).

Plugins are found on PATH (the engine's "ambient plugins"); nothing is downloaded
(docs/pulumi-engine.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra.localcluster.build import ensure_pulumi_binaries

DRIVER = Path(__file__).resolve().parent / "engine_driver.py"
# The driver runs as a script, so sys.path[0] is tests/support, not the checkout: programs named `tests.support.…`
# need the checkout's root put first (CI sets no PYTHONPATH).
REPO_ROOT = DRIVER.parents[2]


@dataclass(frozen=True)
class Engine:
    """`root/bin` holds `pulumi` and `pulumi-resource-kubernetes`; state and PULUMI_HOME live under `root`."""

    root: Path
    timings: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def prepare(cls, root: Path) -> Engine:
        binaries = ensure_pulumi_binaries()
        (root / "bin").mkdir(parents=True, exist_ok=True)
        (root / "state").mkdir(exist_ok=True)
        (root / "home").mkdir(exist_ok=True)
        for name, path in binaries.items():
            link = root / "bin" / name
            if not link.exists():
                link.symlink_to(path)
        return cls(root)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update({
            "PATH": f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "PULUMI_HOME": str(self.root / "home"),
            "PULUMI_BACKEND_URL": f"file://{self.root / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": "engine-tests",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        })
        return env

    def step(self, step: str, *, work_dir: Path, stack: str, program: str, config: Mapping[str, str],
             project: str | None = None, python: str = sys.executable, driver: Path = DRIVER,
             env: Mapping[str, str] | None = None, sys_path: Sequence[str] | None = None, check: bool = True,
             timeout: float = 900) -> dict[str, Any]:
        """Run one step (up, preview, destroy, config-only); its JSON result, or {"error": stderr} unless
        `check`. `sys_path` defaults to the checkout's root."""
        if sys_path is None:
            sys_path = (str(REPO_ROOT),)
        spec = {"work_dir": str(work_dir), "project": project, "stack": stack, "program": program,
                "pulumi_root": str(self.root), "config": dict(config), "step": step, "sys_path": list(sys_path)}
        done = subprocess.run([python, str(driver), json.dumps(spec)], env=self.env(env), capture_output=True,
                              text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            if check:
                raise AssertionError(f"pulumi {step} of {stack} failed (exit {done.returncode}):\n"
                                     f"{done.stderr[-6000:]}\n{done.stdout[-2000:]}")
            return {"error": done.stderr + done.stdout}
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        self.timings.setdefault(step, []).append(result["seconds"])
        return result


PLUGIN_VERSION_WARNING = "resource plugin kubernetes is expected to have version >="


_COLOR = re.compile(r"<\{%[^%]*%\}>")  # the engine's colour directives, e.g. <{%reset%}>


def plugin_version_warnings(warnings: Sequence[str]) -> list[str]:
    """The engine's warnings that the Kubernetes plugin is older than the SDK asks for, each once, cut at the
    advice after the versions ("...>=4.34.2, but has 4.25.0")."""
    found = {_COLOR.sub("", w) for w in warnings}
    return sorted({w[w.index(PLUGIN_VERSION_WARNING):].split(";")[0] for w in found if PLUGIN_VERSION_WARNING in w})


def expected_plugin_version_warnings(provider_version: str) -> list[str]:
    """What the engine warns with the provider built at `provider_version` and the installed pulumi_kubernetes SDK:
    nothing when the provider is at least the SDK's version (the engine compares the plugin's reported version to
    the version the SDK requests, pkg/resource/plugin/host.go), else the one warning naming both versions."""
    from importlib.metadata import version

    from packaging.version import Version

    sdk = version("pulumi_kubernetes")
    if Version(provider_version) >= Version(sdk):
        return []
    return [f"{PLUGIN_VERSION_WARNING}{sdk}, but has {provider_version}"]


def is_subset(planned: Any, live: Any, path: str = "") -> list[str]:
    """Where `live` (an object read back from the apiserver, with defaults filled in) differs from `planned`:
    every planned field must be there with the planned value; the apiserver may add fields."""
    if isinstance(planned, Mapping):
        if not isinstance(live, Mapping):
            return [f"{path or '.'}: {live!r} is not an object"]
        out: list[str] = []
        for key, value in planned.items():
            if key not in live:
                if value not in ({}, []):  # the apiserver drops empty lists and objects
                    out.append(f"{path}.{key}: missing")
            else:
                out += is_subset(value, live[key], f"{path}.{key}")
        return out
    if isinstance(planned, list):
        if not isinstance(live, list) or len(live) != len(planned):
            return [f"{path}: {live!r} is not a list of {len(planned)}"]
        return [d for i, (p, q) in enumerate(zip(planned, live, strict=True)) for d in is_subset(p, q, f"{path}[{i}]")]
    return [] if planned == live else [f"{path}: {live!r} != planned {planned!r}"]


def read_object(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The live object of `manifest`'s kind, namespace and name, or None when the apiserver has none."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import NotFoundError

    resource = DynamicClient(api).resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    meta = manifest["metadata"]
    try:
        obj = resource.get(name=meta["name"], namespace=meta.get("namespace"))
    except NotFoundError:
        return None
    live: dict[str, Any] = obj.to_dict()
    return live
