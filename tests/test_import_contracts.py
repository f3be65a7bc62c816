"""The import contracts (pyproject.toml [tool.importlinter], `make lint`) hold for this tree, and each one fails
when a forbidden import is added to a copy of it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
TREE = ("neuron_dra", "pyproject.toml")
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the tree under test, not whatever is installed
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, check=False, timeout=300)


def test_the_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 kept, 0 broken" in result.stdout


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for part in TREE:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, root / part, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "go", "*.md", "proto"))
        else:
            shutil.copy2(ROOT / part, root / part)
    return root


# (module of the copy that gets the import, the import, the contract it breaks)
# One case of each contract runs in the fast path; the others (~2.5 s each) are `slow`.
SLOW = pytest.mark.slow
VIOLATIONS = [
    pytest.param("neuron_dra/driver/model/catalog.py", "import neuron_dra.claim_templates.examples",
                 "Layers: driver, then claim_templates", id="driver-imports-claim_templates"),
    pytest.param("neuron_dra/claim_templates/cel_env.py", "import neuron_dra.localcluster.nodes.topology",
                 "Layers: driver, then claim_templates", id="claim_templates-imports-localcluster", marks=SLOW),
    pytest.param("neuron_dra/localcluster/nodes/topology.py", "import neuron_dra.components.settings",
                 "Layers: driver, then claim_templates", id="localcluster-imports-components", marks=SLOW),
    pytest.param("neuron_dra/driver/model/slices.py", "import pulumi", "Pulumi only in components/",
                 id="driver-imports-pulumi"),
    pytest.param("neuron_dra/localcluster/nodes/topology.py", "import pulumi_kubernetes", "Pulumi only in components/",
                 id="localcluster-imports-pulumi_kubernetes", marks=SLOW),
    pytest.param("neuron_dra/claim_templates/checks.py", "import neuron_dra.driver.daemon.claims.state",
                 "The daemon is the driver's own",
                 id="claim_templates-imports-the-daemon"),
    pytest.param("neuron_dra/localcluster/nodes/topology.py", "import neuron_dra.cli.slices",
                 "Layers: driver, then claim_templates", id="localcluster-imports-the-cli", marks=SLOW),
    # (planted where claim_templates and components do not import, so that only the layer rule breaks)
    pytest.param("neuron_dra/driver/kubeletplugin/_kube.py", "import neuron_dra.driver.deploy", "Inside driver/",
                 id="daemon-imports-deploy"),
    # (labels.py imports nothing of the local cluster, so that no cycle forms)
    pytest.param("neuron_dra/localcluster/processes/procs.py", "import neuron_dra.localcluster.nodes.labels",
                 "Inside localcluster/", id="processes-imports-nodes"),
    pytest.param("neuron_dra/driver/daemon/failpoints.py", "import neuron_dra.driver.kubeletplugin._sockets",
                 "through its two faces", id="daemon-imports-a-private-module"),
    pytest.param("neuron_dra/claim_templates/template.py", "import neuron_dra.claim_templates.checks",
                 "No import cycles",
                 id="template-imports-checks"),
]


@pytest.mark.parametrize(("module", "statement", "contract"), VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(tree: Path, module: str, statement: str, contract: str) -> None:
    path = tree / module
    original = path.read_text()
    path.write_text(original + f"\n{statement}  # added by the test\n")
    try:
        result = lint_imports(tree)
    finally:
        path.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"Contracts: [0-6] kept, [1-7] broken", result.stdout), result.stdout
    broken = result.stdout.split("Broken contracts", 1)[1]  # one import can break several (through what imports it)
    assert contract in " ".join(broken.split()), broken
