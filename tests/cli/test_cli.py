"""`neuron-dra`: the commands are the modules of neuron_dra/cli, and only the one that runs is imported."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from neuron_dra import __version__
from neuron_dra.cli import commands, main, summary

ROOT = Path(__file__).resolve().parents[2]
README_COMMANDS = {"chart", "claims", "cluster", "dashboard", "demo", "emulate", "emulate-fault", "emulate-utilisation",
                   "plan", "slices"}


def imported_after(argv: list[str]) -> list[str]:
    """The neuron_dra.cli and Pulumi modules a fresh interpreter holds after `neuron-dra ARGV`."""
    code = ("import sys, contextlib, io\n"
            "from neuron_dra.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main({argv!r})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('neuron_dra.cli', 'pulumi')))))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                            timeout=300)
    return result.stdout.split()


def test_every_command_module_is_a_command_with_a_summary() -> None:
    assert set(commands()) == README_COMMANDS
    for name, source in commands().items():
        assert summary(source) and not summary(source).startswith("`"), name


@pytest.mark.process
def test_help_lists_the_commands_without_importing_them() -> None:
    assert imported_after(["--help"]) == ["neuron_dra.cli"]


@pytest.mark.process
def test_slices_imports_its_module_only_and_no_pulumi() -> None:
    assert imported_after(["slices", "--instance-type", "trn2.48xlarge", "--node-name", "n"]) == [
        "neuron_dra.cli", "neuron_dra.cli.slices"]


@pytest.mark.process
def test_plan_imports_pulumi() -> None:
    """The counterpart of the two above: the command that needs Pulumi gets it."""
    assert "pulumi" in imported_after(["plan", "--help"])


def test_version_is_the_installed_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    installed = metadata.version("neuron-dra")  # built from the one number in driver/model/version.py
    assert capsys.readouterr().out.strip() == f"neuron-dra {__version__}" == f"neuron-dra {installed}"


def test_an_unknown_command_is_named_with_the_nearest_and_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["slice"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'slice'; did you mean 'slices'? (commands: chart, claims, cluster," in err, err


def test_a_command_whose_extra_is_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(sys.modules):
        if name.startswith(("neuron_dra.cli.claims", "neuron_dra.claim_templates")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "celpy", None)  # as if cel-python were not installed: import raises
    assert main(["claims", "render", "x.py"]) == 2
    assert "neuron-dra claims: needs the 'claims' extra (celpy is not installed): pip install 'neuron-dra[claims]'" \
        in capsys.readouterr().err
