"""The driver image builds from a pip-installed (non-editable) copy of the package: the build context the
components hand to BuildKit (site-packages, `components/driver_image.py`) holds what the Dockerfile copies, as
package data, and its Dockerfile.dockerignore admits it. Built here with buildah (no Docker daemon, no registry:
the Dockerfile's base is the local cluster's mmdebstrap base, docs/real-runtime.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_dra.components import driver_image
from neuron_dra.localcluster.nodes import images
from tests.components.test_components_import import PACKAGE_PARTS, ROOT

pytestmark = [pytest.mark.containerd, pytest.mark.slow, pytest.mark.process]


def test_the_image_builds_from_site_packages(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    source.mkdir()
    for part in PACKAGE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, source / part)
    site = tmp_path / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, timeout=600)
    shutil.rmtree(source)  # no checkout left: only what the wheel installed
    context = driver_image.build_context(site, "source_dir")
    assert context == site and (site / driver_image.DOCKERIGNORE).is_file()
    base = images.build_base()
    reference = f"localhost/neuron-dra-driver:site-{driver_image.context_tag(context).split('-')[-1]}"
    images.buildah(["bud", "--isolation", "chroot", "--pull=never", "--layers=false", "-t", reference,
                    "-f", str(site / driver_image.DOCKERFILE), "--ignorefile", str(site / driver_image.DOCKERIGNORE),
                    "--build-arg", f"PYTHON_IMAGE={base.reference}", str(site)], f"buildah bud {reference}", None)
    images.buildah(["rmi", reference], f"buildah rmi {reference}", None)
