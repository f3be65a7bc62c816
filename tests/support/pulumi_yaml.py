"""pulumi-language-yaml, the Pulumi YAML language host, at the version `tests/support/go/pulumi-yaml/go.mod`
pins, built from the Go module proxy like the other tools: what runs a Pulumi YAML program that uses the
components through their provider in the tests (docs/components.md, "From other languages")."""

from __future__ import annotations

from pathlib import Path

from neuron_dra.localcluster.build import Log, pinned_build, required_version

PULUMI_YAML_MODULE = Path(__file__).resolve().parent / "go" / "pulumi-yaml"
PULUMI_YAML = "github.com/pulumi/pulumi-yaml"


def pulumi_yaml_version() -> str:
    return required_version(PULUMI_YAML_MODULE, PULUMI_YAML)


def build_pulumi_yaml(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """`pulumi-language-yaml`, cached under `pulumi-language-yaml/<version>/`, its version compiled in as upstream's
    Makefile does (`-X github.com/pulumi/pulumi-yaml/pkg/version.Version`). The Pulumi CLI finds it on PATH."""
    return pinned_build(PULUMI_YAML_MODULE, "pulumi-language-yaml", pulumi_yaml_version(),
                        {"pulumi-language-yaml": f"{PULUMI_YAML}/cmd/pulumi-language-yaml"},
                        f"{PULUMI_YAML}/pkg/version.Version", cache, log)["pulumi-language-yaml"]
