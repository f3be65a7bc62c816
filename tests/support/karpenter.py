"""Karpenter's own CustomResourceDefinitions, from its released Go modules, for the local control plane.

`tests/support/go/karpenter/go.mod` pins `github.com/aws/karpenter-provider-aws` and the `sigs.k8s.io/karpenter`
core it requires; `go mod download` fetches their zips into the Go module cache. Those releases declare a newer
`go` line than the toolchain here, so `go mod download` reports an error instead of extracting them; the zips
are complete all the same, and are only read: this module checks each zip against the wrapper's go.sum (the
`h1:` hash Go itself computes, golang.org/x/mod/sumdb/dirhash Hash1) and reads the CRDs out of it.

Installed: the AWS provider's `pkg/apis/crds` (NodePool, NodeClaim, EC2NodeClass: what its `karpenter-crd`
chart installs, the core CRDs plus the provider's label restrictions). Nothing is written by hand or committed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from neuron_dra.localcluster.build import BuildError, go_binary, go_env, required_version

KARPENTER_MODULE = Path(__file__).resolve().parent / "go" / "karpenter"
AWS_PROVIDER = "github.com/aws/karpenter-provider-aws"
CORE = "sigs.k8s.io/karpenter"
CRD_DIR = "pkg/apis/crds"
# The CRDs the AWS provider's chart installs for NodePools and EC2NodeClasses (NodeClaim: Karpenter's own record
# of each node it launches, referenced by neither but part of the API the controller serves).
CRD_FILES = ("karpenter.sh_nodepools.yaml", "karpenter.sh_nodeclaims.yaml", "karpenter.k8s.aws_ec2nodeclasses.yaml")
# An error `go mod download` reports for a release whose go line is newer than the toolchain: its zip is
# downloaded and hashed all the same (only compiling it would need the newer toolchain).
_TOOLCHAIN_ERROR = "requires go >="


@dataclass(frozen=True)
class ModuleZip:
    """A downloaded module release: its zip in the module cache, checked against the wrapper's go.sum."""

    path: str
    version: str
    zip_path: Path

    @property
    def prefix(self) -> str:
        return f"{self.path}@{self.version}/"

    def read(self, name: str) -> bytes:
        with zipfile.ZipFile(self.zip_path) as z:
            return z.read(self.prefix + name)


def karpenter_version() -> str:
    """The AWS provider's pinned release, e.g. `v1.15.0` (its chart has the same version without the `v`)."""
    return required_version(KARPENTER_MODULE, AWS_PROVIDER)


def core_version() -> str:
    return required_version(KARPENTER_MODULE, CORE)


def go_sum_hash(module_dir: Path, module: str, version: str) -> str:
    """The `h1:` hash go.sum in `module_dir` records for the zip of `module@version`."""
    for line in (module_dir / "go.sum").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == module and parts[1] == version:
            return parts[2]
    raise BuildError(f"{module_dir / 'go.sum'}: no hash of {module} {version}")


def zip_hash(zip_path: Path) -> str:
    """Go's `h1:` hash of a module zip: SHA-256 over the sorted lines `<sha256 hex>  <file name>`."""
    lines = []
    with zipfile.ZipFile(zip_path) as z:
        for name in sorted(z.namelist()):
            if name.endswith("/"):
                continue
            lines.append(f"{hashlib.sha256(z.read(name)).hexdigest()}  {name}\n")
    return "h1:" + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode()


def download(module: str, module_dir: Path = KARPENTER_MODULE) -> ModuleZip:
    """`go mod download` of the release `module_dir`'s go.mod requires; the zip is checked against go.sum."""
    version = required_version(module_dir, module)
    proc = subprocess.run([go_binary(), "mod", "download", "-json", module], cwd=module_dir, env=go_env(),
                          capture_output=True, text=True, check=False, timeout=600)
    try:
        info: Mapping[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    error = str(info.get("Error") or "")
    zip_name = info.get("Zip")
    if not zip_name or (error and _TOOLCHAIN_ERROR not in error):
        raise BuildError(f"`go mod download {module}` in {module_dir} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    zip_path = Path(str(zip_name))
    expected = go_sum_hash(module_dir, module, version)
    actual = zip_hash(zip_path)
    if actual != expected:
        raise BuildError(f"{zip_path}: hash {actual} is not go.sum's {expected} for {module} {version}")
    return ModuleZip(module, version, zip_path)


def crds(module_dir: Path = KARPENTER_MODULE) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of the pinned AWS provider release, as manifests."""
    release = download(AWS_PROVIDER, module_dir)
    out = []
    for name in CRD_FILES:
        document = yaml.safe_load(release.read(f"{CRD_DIR}/{name}"))
        if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
            raise BuildError(f"{release.prefix}{CRD_DIR}/{name}: not a CustomResourceDefinition")
        out.append(document)
    return out


def required_core_version(module_dir: Path = KARPENTER_MODULE) -> str:
    """The core release the pinned AWS provider's own go.mod requires (the wrapper must pin the same)."""
    gomod = download(AWS_PROVIDER, module_dir).read("go.mod").decode()
    for line in gomod.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == CORE:
            return parts[1]
    raise BuildError(f"{AWS_PROVIDER} go.mod requires no {CORE}")


def chart_values(module_dir: Path = KARPENTER_MODULE) -> dict[str, Any]:
    """The default values of the Karpenter Helm chart in the pinned release (`charts/karpenter/values.yaml`)."""
    values = yaml.safe_load(download(AWS_PROVIDER, module_dir).read("charts/karpenter/values.yaml"))
    if not isinstance(values, dict):
        raise BuildError(f"{AWS_PROVIDER} charts/karpenter/values.yaml is not a mapping")
    return values
