"""The Helm CLI at the version `tests/support/go/helm/go.mod` pins, built from the Go module proxy like the other
tools (docs/helm.md): what the tests lint, template, package and install the driver's chart with
(driver/deploy/chart.py). Test support: users bring their own helm."""

from __future__ import annotations

from pathlib import Path

from neuron_dra.localcluster.build import Log, pinned_build, required_version

HELM_MODULE = Path(__file__).resolve().parent / "go" / "helm"
HELM = "helm.sh/helm/v4"


def helm_version() -> str:
    return required_version(HELM_MODULE, HELM)


def build_helm(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """`helm`, cached under `helm/<version>/`, its version compiled in as upstream's Makefile does
    (`-X helm.sh/helm/v4/internal/version.version`)."""
    return pinned_build(HELM_MODULE, "helm", helm_version(), {"helm": f"{HELM}/cmd/helm"},
                        f"{HELM}/internal/version.version", cache, log)["helm"]
