"""Container images of the local cluster, built without a registry or a Docker daemon, cached by content.

pause (Kubernetes' own pause.c, compiled statically), workload (static busybox and `workload/workload.sh`, which
prints what the container sees), base (a Debian rootfs with Python from `mmdebstrap`, carrying the host's CA
bundle) and driver (`neuron_dra/driver/Dockerfile`, unchanged, on that base). Each is built with buildah
(`--isolation chroot`, vfs storage under the cache) in a private mount namespace, since buildah writes host
paths whatever its flags say, and exported as an OCI archive `images/<name>-<content hash>.tar` for
`ctr images import` (docs/real-runtime.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_dra import __version__
from neuron_dra.localcluster import hostreqs
from neuron_dra.localcluster.build import KUBE_MODULES, BuildError, Log, _go_module_dir, cache_root
from neuron_dra.localcluster.cachedir import locked

REPO = Path(__file__).resolve().parents[3]
WORKLOAD_DIR = Path(__file__).resolve().parent / "workload"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PAUSE_VERSION = "3.10.2"  # TAG of build/pause/Makefile in the pinned Kubernetes module
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# Paths the Dockerfile copies from the repository (its COPY lines): the driver image's content.
DRIVER_SOURCES = ("neuron_dra/driver", "neuron_dra/__init__.py", "neuron_dra/py.typed")
TOOL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Image:
    """An image in an OCI archive: `reference` is the name it is imported under (`localhost/NAME:TAG`)."""

    name: str
    reference: str
    archive: Path


@dataclass(frozen=True)
class ClusterImages:
    pause: Image
    workload: Image
    driver: Image

    def all(self) -> tuple[Image, ...]:
        return (self.pause, self.workload, self.driver)

    def references(self) -> dict[str, str]:
        """What `cluster up` writes to DIR/images.json."""
        return {"driver": self.driver.reference, "workload": self.workload.reference}


def images_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "images"


def require_tool(name: str) -> str:
    return hostreqs.require(name, BuildError)


def content_hash(paths: Iterable[Path], root: Path, extra: Sequence[str] = ()) -> str:
    """sha256 over the relative names and bytes of every file under `paths` (directories walked in order,
    `__pycache__` left out), plus `extra` strings: the cache key of an image."""
    digest = hashlib.sha256()
    for item in extra:
        digest.update(item.encode() + b"\0")
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += [f for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        else:
            files.append(path)
    for f in sorted(files):
        rel = f.relative_to(root) if f.is_relative_to(root) else f
        digest.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _run(argv: Sequence[str], what: str, log: Log | None, cwd: Path | None = None) -> None:
    started = time.monotonic()
    try:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{what}: no result after {TOOL_TIMEOUT_S:.0f} s") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    if log is not None:
        log(f"{what}: {time.monotonic() - started:.1f} s")


def buildah_argv(store: Path, scratch: Path, args: Sequence[str]) -> list[str]:
    """`buildah ARGS` with its storage in `store`, in a mount namespace whose /etc and /var/lib are overlays
    (upper layers in `scratch`) and whose /run is a tmpfs: what buildah writes there never reaches the host."""
    lines = ["set -eu"]
    for host_dir, name in (("/etc", "etc"), ("/var/lib", "var-lib")):
        upper, work = scratch / name / "upper", scratch / name / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        lines.append(f"mount -t overlay overlay -o lowerdir={host_dir},upperdir={shlex.quote(str(upper))},"
                     f"workdir={shlex.quote(str(work))} {host_dir}")
    lines.append("mount -t tmpfs tmpfs /run")
    buildah = [require_tool("buildah"), "--root", str(store / "root"), "--runroot", str(store / "run"),
               "--storage-driver", "vfs", *args]
    lines.append("exec " + shlex.join(buildah))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]


@contextlib.contextmanager
def _scratch(parent: Path) -> Iterator[Path]:
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".scratch-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def buildah(args: Sequence[str], what: str, log: Log | None, cache: Path | None = None) -> None:
    store = images_dir(cache) / "buildah"
    with _scratch(images_dir(cache)) as scratch:
        _run(buildah_argv(store, scratch, args), what, log)


def build_image(name: str, tag: str, context: Path, containerfile: Path, key: str, *, build_args: Sequence[str] = (),
                log: Log | None = None, cache: Path | None = None) -> Image:
    """Build `containerfile` in `context` as `localhost/NAME:TAG` and export it to the archive named by `key`;
    a no-op when that archive exists (the key is a hash of everything the image is made from)."""
    reference = f"localhost/{name}:{tag}"
    archive = images_dir(cache) / f"{name}-{key}.tar"
    if archive.is_file():
        return Image(name, reference, archive)
    with locked(images_dir(cache) / f".{name}.lock"):
        if archive.is_file():
            return Image(name, reference, archive)
        bud = ["bud", "--isolation", "chroot", "--pull=never", "--layers=false", "-t", reference,
               "-f", str(containerfile)]
        for arg in build_args:
            bud += ["--build-arg", arg]
        buildah([*bud, str(context)], f"buildah bud {reference}", log, cache)
        tmp = archive.with_name(f".{archive.name}.tmp")
        tmp.unlink(missing_ok=True)
        buildah(["push", reference, f"oci-archive:{tmp}:{reference}"], f"buildah push {reference}", log, cache)
        tmp.replace(archive)
    return Image(name, reference, archive)


def pause_source() -> Path:
    return _go_module_dir(KUBE_MODULES / "1.36", "k8s.io/kubernetes") / "build" / "pause" / "linux" / "pause.c"


def build_pause(*, log: Log | None = None, cache: Path | None = None) -> Image:
    """Kubernetes' pause binary, compiled as its Makefile does (`-Os -Wall -Werror -static`), as an image."""
    source = pause_source()
    containerfile = WORKLOAD_DIR / "Containerfile.pause"
    key = content_hash([source, containerfile], source.parent)
    with _scratch(images_dir(cache)) as context:
        if not (images_dir(cache) / f"pause-{key}.tar").is_file():
            _run([require_tool("gcc"), "-Os", "-Wall", "-Werror", "-static",
                  f"-DVERSION=v{PAUSE_VERSION}-neuron-dra", "-o", str(context / "pause"), str(source)],
                 "gcc pause.c", log)
        return build_image("pause", PAUSE_VERSION, context, containerfile, key, log=log, cache=cache)


def build_workload(*, log: Log | None = None, cache: Path | None = None) -> Image:
    """busybox (sh, ls, sleep, ...) and the workload script; runs as `workload.sh` by default."""
    busybox = Path(require_tool("busybox")).resolve()
    containerfile = WORKLOAD_DIR / "Containerfile.workload"
    key = content_hash([busybox, containerfile, WORKLOAD_DIR / "workload.sh"], WORKLOAD_DIR)
    with _scratch(images_dir(cache)) as context:
        rootfs = context / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        for applet in ("sh", "ls", "cat", "sleep", "env", "echo", "grep", "sed", "sort", "tr", "printf", "test",
                       "[", "date", "stat", "wc", "readlink", "basename"):
            (rootfs / "bin" / applet).symlink_to("busybox")
        shutil.copy2(WORKLOAD_DIR / "workload.sh", rootfs / "bin" / "workload.sh")
        return build_image("neuron-dra-workload", key[:12], context, containerfile, key, log=log, cache=cache)


def build_base(*, log: Log | None = None, cache: Path | None = None) -> Image:
    """A Debian base with Python made by mmdebstrap (no registry), the host's CA bundle in it."""
    key = content_hash([CA_BUNDLE, WORKLOAD_DIR / "Containerfile.base"], WORKLOAD_DIR,
                       extra=[BASE_SUITE, *BASE_PACKAGES])
    archive = images_dir(cache) / f"neuron-dra-base-{key}.tar"
    reference = f"localhost/neuron-dra-base:{BASE_SUITE}-{key[:12]}"
    if archive.is_file():
        return Image("neuron-dra-base", reference, archive)
    with _scratch(images_dir(cache)) as context:
        _run([require_tool("mmdebstrap"), "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              f"--customize-hook=copy-in {CA_BUNDLE} /etc/ssl/certs", "--quiet", BASE_SUITE,
              str(context / "rootfs.tar")], "mmdebstrap", log)
        return build_image("neuron-dra-base", f"{BASE_SUITE}-{key[:12]}", context,
                           WORKLOAD_DIR / "Containerfile.base", key, log=log, cache=cache)


def build_driver(base: Image | None = None, *, log: Log | None = None, cache: Path | None = None) -> Image:
    """neuron_dra/driver/Dockerfile, unchanged, with PYTHON_IMAGE set to the mmdebstrap base."""
    base = base or build_base(log=log, cache=cache)
    dockerfile = REPO / "neuron_dra" / "driver" / "Dockerfile"
    key = content_hash([REPO / p for p in DRIVER_SOURCES], REPO, extra=[base.reference])
    return build_image("neuron-dra-driver", f"{__version__}-{key[:12]}", REPO, dockerfile, key,
                       build_args=[f"PYTHON_IMAGE={base.reference}"], log=log, cache=cache)


def ensure_images(*, log: Log | None = None, cache: Path | None = None) -> ClusterImages:
    """Every image a containerd node needs, built first if not cached."""
    return ClusterImages(pause=build_pause(log=log, cache=cache), workload=build_workload(log=log, cache=cache),
                         driver=build_driver(log=log, cache=cache))


def write_references(images: ClusterImages, path: Path) -> None:
    path.write_text(json.dumps(images.references(), indent=1) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m neuron_dra.localcluster.nodes.images [driver|workload|pause|all]`: build and print the archives."""
    which = list(argv if argv is not None else sys.argv[1:]) or ["all"]
    builders = {"pause": build_pause, "workload": build_workload, "driver": build_driver}
    names = list(builders) if which == ["all"] else which
    for name in names:
        if name not in builders:
            print(f"unknown image {name!r}; choose from {', '.join(builders)} or all", file=sys.stderr)
            return 2
        image = builders[name](log=lambda m: print(m, file=sys.stderr))
        print(f"{image.reference} {image.archive}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
