"""`neuron-dra plan` from a non-editable install: no checkout, yet the default driver image is built from the
installed package (its Dockerfile, ignore file and image requirements ship as package data) and pushed to the
stack's ECR repository; the plan says so and shows the EFA DRA driver's release."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.components.test_components_import import (
    PACKAGE_PARTS,
    ROOT,
    environment_without_this_checkout,
    with_packages_of_this_interpreter,
)

pytestmark = pytest.mark.process


@pytest.mark.slow  # builds a wheel into a new virtualenv
def test_plan_runs_from_a_pip_installed_copy_and_builds_the_image_from_it(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    source.mkdir()
    for part in PACKAGE_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, source / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, source / part)
    python = with_packages_of_this_interpreter(tmp_path / "venv")
    env = environment_without_this_checkout()
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(source)], check=True, cwd=tmp_path, env=env)
    shutil.rmtree(source)  # nothing of a checkout is left to build from
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = subprocess.run([str(python), "-m", "neuron_dra", "plan", "-o", "yaml"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    # The image is built at `pulumi up`: -o yaml names no placeholder digest, it says to set driverImage.
    assert out.returncode == 2 and "set neuron-dra:driverImage" in out.stderr, out.stderr[-3000:]
    table = subprocess.run([str(python), "-m", "neuron_dra", "plan"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "aws-dranet" in table.stdout and "docker-build:index:Image" in table.stdout
    (line,) = [x for x in table.stdout.splitlines() if x.startswith("Driver image: ")]
    site = subprocess.run([str(python), "-c", "import neuron_dra, pathlib; "
                           "print(pathlib.Path(neuron_dra.__file__).resolve().parent.parent)"],
                          cwd=work, env=env, capture_output=True, text=True, check=True).stdout.strip()
    # The build context is the installed package's, staged under the working directory: no path of this machine.
    tag = subprocess.run([str(python), "-c", "import neuron_dra, pathlib; from neuron_dra.components import "
                          "driver_image as d; print(d.context_tag(pathlib.Path(neuron_dra.__file__).resolve()"
                          ".parent.parent))"], cwd=work, env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    staged = f".neuron-dra/driver-image/{tag}"
    assert f"built here from {staged} ({staged}/neuron_dra/driver/Dockerfile)" in line, line
    for rel in ("neuron_dra/driver/Dockerfile.dockerignore", "neuron_dra/driver/image-requirements.txt"):
        assert (Path(site) / rel).is_file(), rel  # shipped as package data: the build context is complete
