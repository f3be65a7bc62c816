"""`neuron-dra plan` from a non-editable install: no checkout, so the default driver image must be the published
one (no build from a Dockerfile that is not there), and the plan shows the EFA DRA driver's release."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from neuron_dra.driver import deploy
from tests.components.test_components_import import (
    PACKAGE_PARTS,
    ROOT,
    environment_without_this_checkout,
    with_packages_of_this_interpreter,
)


@pytest.mark.slow  # builds a wheel into a new virtualenv
def test_plan_runs_from_a_pip_installed_copy_with_the_published_image(tmp_path: Path) -> None:
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
    assert out.returncode == 0, out.stderr[-3000:]
    (ds,) = [m for m in yaml.safe_load_all(out.stdout) if m and m["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == deploy.DEFAULT_IMAGE
    table = subprocess.run([str(python), "-m", "neuron_dra", "plan"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "aws-dranet" in table.stdout and "docker-build" not in table.stdout
