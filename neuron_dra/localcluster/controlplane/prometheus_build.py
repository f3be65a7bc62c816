"""Prometheus and the PodMonitor CRD for the local cluster, built from the Go module proxy and cached like the
control plane's binaries (build.py's `cached_go_build`).

- Prometheus: `github.com/prometheus/prometheus/cmd/prometheus` at the version `go/prometheus/go.mod` pins, with
  upstream's build tag `remove_all_sd` (plugins/*.go): every service discovery but the static and file ones is
  left out, since the local Prometheus scrapes fixed addresses; that halves the build. No `builtinassets` tag:
  the web UI is not embedded, the HTTP API (all the tests use) is.
- The PodMonitor CRD: upstream generates its CRDs with controller-gen from the Go types in
  `pkg/apis/monitoring`; the proxy serves that module but not the repository's root module (the one holding the
  generated YAML), so the CRD is generated here the same way from the pinned types (`go/prometheus-operator`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from neuron_dra.localcluster.build import (
    GO_DIR,
    BuildError,
    Log,
    _go_module_dir,
    cache_root,
    go_env,
    pinned_build,
    required_version,
)
from neuron_dra.localcluster.cachedir import locked

PROMETHEUS_MODULE_DIR = GO_DIR / "prometheus"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_PACKAGE = f"{PROMETHEUS_MODULE}/cmd/prometheus"
PROMETHEUS_TAGS = ("remove_all_sd",)
OPERATOR_MODULE_DIR = GO_DIR / "prometheus-operator"
MONITORING_MODULE = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
CONTROLLER_TOOLS = "sigs.k8s.io/controller-tools"
PODMONITOR_CRD = "monitoring.coreos.com_podmonitors.yaml"


def prometheus_module_version() -> str:
    """The pinned Go module version, e.g. `v0.316.0`."""
    return required_version(PROMETHEUS_MODULE_DIR, PROMETHEUS_MODULE)


def prometheus_version() -> str:
    """The Prometheus release of the module version: upstream tags v3.X.Y as module v0.3XX.Y (`v0.316.0`: 3.16.0)."""
    module = prometheus_module_version()
    m = re.fullmatch(r"v0\.(\d)(\d\d)\.(\d+)", module)
    if m is None:
        raise BuildError(f"{PROMETHEUS_MODULE} {module}: not of the form v0.MNN.P (Prometheus M.NN.P)")
    return f"{m.group(1)}.{int(m.group(2))}.{m.group(3)}"


def build_prometheus(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """The `prometheus` binary, cached under `prometheus/<release>/`."""
    return pinned_build(PROMETHEUS_MODULE_DIR, "prometheus", prometheus_version(), {"prometheus": PROMETHEUS_PACKAGE},
                        "github.com/prometheus/common/version.Version", cache, log, PROMETHEUS_TAGS)["prometheus"]


def operator_version() -> str:
    return required_version(OPERATOR_MODULE_DIR, MONITORING_MODULE)


def build_controller_gen(*, cache: Path | None = None, log: Log | None = None) -> Path:
    version = required_version(OPERATOR_MODULE_DIR, CONTROLLER_TOOLS)
    binaries = {"controller-gen": f"{CONTROLLER_TOOLS}/cmd/controller-gen"}
    return pinned_build(OPERATOR_MODULE_DIR, "controller-gen", version, binaries, None, cache, log)["controller-gen"]


def podmonitor_crd(*, cache: Path | None = None, log: Log | None = None) -> dict[str, Any]:
    """The PodMonitor CustomResourceDefinition of the pinned prometheus-operator API types (generated once,
    cached under `prometheus-operator-crds/<version>/`)."""
    root = cache or cache_root()
    target = root / "prometheus-operator-crds" / operator_version()
    crd = target / PODMONITOR_CRD
    if not crd.exists():
        gen = build_controller_gen(cache=root, log=log)
        with locked(target.parent / f".{target.name}.lock"):
            if not crd.exists():
                _generate(gen, target, log)
    document = yaml.safe_load(crd.read_text())
    if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
        raise BuildError(f"{crd}: not a CustomResourceDefinition")
    return document


def _generate(controller_gen: Path, target: Path, log: Log | None) -> None:
    source = _go_module_dir(OPERATOR_MODULE_DIR, MONITORING_MODULE)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.tmp-", dir=target.parent) as tmp:
        out = Path(tmp) / "crds"
        # As upstream's Makefile: v1 CRDs of the monitoring.coreos.com/v1 types, descriptions kept.
        cmd = [str(controller_gen), "crd:crdVersions=v1", f"paths={MONITORING_MODULE}/v1",
               f"output:crd:dir={out}"]
        if log is not None:
            log(f"generating the prometheus-operator CRDs of {source.name}")
        proc = subprocess.run(cmd, cwd=OPERATOR_MODULE_DIR, env=go_env(), capture_output=True, text=True,
                              check=False, timeout=600)
        if proc.returncode != 0 or not (out / PODMONITOR_CRD).exists():
            raise BuildError(f"controller-gen failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
        out.rename(Path(tmp) / "done")
        (Path(tmp) / "done").rename(target)
