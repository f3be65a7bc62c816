"""The installed package exposes one namespace and the console scripts (issue: no generic top-level names)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("driver", "claim_templates", "components", "localcluster")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Run outside the repository: `python -m pytest` puts the repository root on sys.path; without PYTHONPATH
    # (a developer's pointer at a work tree, where the top-level folders are importable by design).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False,
                          env=env)


def test_the_package_is_real_folders_without_links() -> None:
    # Tools that read imports (import-linter, the structure drawings) cannot follow links: nothing is one.
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [line for line in tracked if line.startswith("120000")] == []
    for name in PARTS:
        assert (ROOT / "neuron_dra" / name / "__init__.py").is_file(), name
        assert not (ROOT / name).exists(), f"{name}/ belongs under neuron_dra/"


def test_only_the_neuron_dra_namespace_is_importable(tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u\n"
        f"for name in {tuple(PARTS)!r}:\n"
        "    assert u.find_spec(name) is None, name\n"
        "import neuron_dra.driver.model.catalog, neuron_dra.claim_templates, neuron_dra.localcluster.nodes.topology\n"
        "print('ok')\n"
    )
    result = _python(probe, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_driver_package_does_not_import_pulumi(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "import neuron_dra.driver.daemon.main, neuron_dra.driver.deploy, neuron_dra.claim_templates.checks\n"
        "print(sorted(m for m in sys.modules if m.startswith('pulumi')))\n"
    )
    result = _python(probe, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_console_scripts_are_installed() -> None:
    scripts = Path(sysconfig.get_path("scripts"))  # where pip put this interpreter's console scripts
    for script in ("neuron-dra", "neuron-dra-driver"):
        path = scripts / script
        assert path.exists(), f"{script} is not installed in {scripts}"
        result = subprocess.run([str(path), "--help"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
