"""driver/early.py and driver/entry.py: the kubelet sockets bound before the daemon's imports, named as the full
option parse names them, and never left behind or bound where the parse would not put them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_dra.driver import early
from neuron_dra.driver.main import parse_options
from tests.support.driver import short_dir

ENV = {"NODE_NAME": "n1"}


@pytest.mark.parametrize("argv, env", [
    ([], {}),
    (["--plugins-dir", "/p", "--registry-dir", "/r"], {}),
    (["--plugins-dir=/p", "--registry-dir=/r", "--driver-name=gpu.example.com"], {}),
    (["--driver-name", "a.b", "--driver-name", "c.d"], {}),  # the last one wins, as with argparse
    ([], {early.PLUGINS_DIR_ENV: "/env/p", early.REGISTRY_DIR_ENV: "/env/r"}),
    (["--plugins-dir", "/flag/p"], {early.PLUGINS_DIR_ENV: "/env/p"}),
    (["--node-name", "x", "--cdi-root", "/c", "--log-level", "debug", "--plugins-dir", "/p"], {}),
])
def test_the_quick_scan_names_the_sockets_the_full_parse_names(argv: list[str], env: dict[str, str]) -> None:
    paths = early.socket_paths(argv, {**ENV, **env})
    options = parse_options(argv, {**ENV, **env})
    assert paths == (str(options.sockets.dra), str(options.sockets.registration))


@pytest.mark.parametrize("argv", [
    ["--help"], ["-h"], ["--version"],
    ["--plugins-dir"],  # the value missing
    ["--plugins-dir", "relative"],
    ["--driver-name", "Upper.Case"], ["--driver-name", "-x"], ["--driver-name", "a..b"], ["--driver-name", "x" * 64],
    ["--plugins", "/elsewhere"],  # an abbreviation argparse accepts: not guessed
    ["--reg=/elsewhere"],
    ["--plugins-dir", "/" + "p" * 120],  # over the unix socket path limit
])
def test_unclear_settings_skip_the_early_bind(argv: list[str]) -> None:
    assert early.socket_paths(argv, ENV) is None


def test_binds_both_sockets_0600_removing_stale_ones() -> None:
    with short_dir() as d:
        argv = ["--plugins-dir", str(d / "p"), "--registry-dir", str(d / "r")]
        dra, registration = early.socket_paths(argv, ENV) or ("", "")
        Path(registration).parent.mkdir(parents=True)
        Path(registration).write_text("stale")
        bound = early.bind_early(argv, ENV)
        assert bound is not None
        try:
            for path in (dra, registration):
                mode = os.stat(path).st_mode
                assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        finally:
            bound.discard()
        assert not os.path.exists(dra) and not os.path.exists(registration)


def test_a_failed_bind_leaves_nothing_bound() -> None:
    with short_dir() as d:
        argv = ["--plugins-dir", str(d / "p"), "--registry-dir", str(d / "r")]
        _, registration = early.socket_paths(argv, ENV) or ("", "")
        Path(registration).mkdir(parents=True)  # a directory where the registration socket goes
        assert early.bind_early(argv, ENV) is None
        assert list((d / "p").rglob("*.sock")) == []


def test_the_entry_imports_only_cheap_modules_before_binding() -> None:
    """What the entry point adds before its bind: no argparse, logging, dataclasses, pathlib, typing, re (the
    50-70 ms the daemon's own imports take). Counted against a bare interpreter of the same environment, whose
    site hooks (editable installs) may load some of them anyway."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def modules(code: str) -> set[str]:
        return set(subprocess.run([sys.executable, "-c", f"import sys; {code}; print(' '.join(sys.modules))"],
                                  capture_output=True, text=True, check=True, env=env).stdout.split())

    added = modules("import neuron_dra.driver.entry") - modules("pass")
    assert "neuron_dra.driver.early" in added
    assert added.isdisjoint({"argparse", "logging", "dataclasses", "pathlib", "typing", "re", "json",
                             "neuron_dra.driver.main", "neuron_dra.driver.sockets"}), sorted(added)


def test_a_bad_flag_exits_with_the_parse_error_and_leaves_no_socket() -> None:
    with short_dir() as d:
        argv = ["--plugins-dir", str(d / "p"), "--registry-dir", str(d / "r"), "--node-name", "n1", "--no-such"]
        run = subprocess.run([sys.executable, "-m", "neuron_dra.driver", *argv], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert run.returncode == 2 and "--no-such" in run.stderr
        assert list(d.rglob("*.sock")) == []
