"""The Helm CLI at the version `go/helm/go.mod` pins, built from the Go module proxy like the other tools
(docs/helm.md): what lints, templates, packages and installs the driver's chart (driver/deploy/chart.py)."""

from __future__ import annotations

from pathlib import Path

from neuron_dra.localcluster.build import GO_DIR, Log, pinned_build, required_version

HELM_MODULE = GO_DIR / "helm"
HELM = "helm.sh/helm/v4"


def helm_version() -> str:
    return required_version(HELM_MODULE, HELM)


def build_helm(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """`helm`, cached under `helm/<version>/`, its version compiled in as upstream's Makefile does
    (`-X helm.sh/helm/v4/internal/version.version`)."""
    return pinned_build(HELM_MODULE, "helm", helm_version(), {"helm": f"{HELM}/cmd/helm"},
                        f"{HELM}/internal/version.version", cache, log)["helm"]
