"""The driver image a `NeuronDraDriver` runs: one the stack builds and pushes, or one the user gives.

Built (the default): `neuron_dra/driver/Dockerfile` of the directory the package runs from (a checkout, or
site-packages of a pip install: the Dockerfile, its `Dockerfile.dockerignore`, the image's requirements and
`image-files.txt`, the exact list of files the driver tree may hold, ship as package data), built with BuildKit
(pulumi-docker-build) and pushed to an ECR repository the stack owns: scan on push, IMMUTABLE tags, a lifecycle
policy keeping the newest images. The tag is the package version and a hash of the build context, so a changed
driver is a new tag (immutable tags cannot move) and an unchanged one is no new build; the DaemonSet names the
pushed digest (`tag@sha256:...`).

Reproducible (docs/deploying.md §2): what the docker-build Image is given depends on the package's content only,
never on the machine, venv or Python version that runs the program. The build context is staged, file by file with
fixed modes (0644 files, 0755 directories: pulumi-docker-build's context hash includes file modes, which follow the
umask of whoever installed the package), into `.neuron-dra/driver-image/<tag>` under the program's working directory
(the directory a Pulumi program and its providers run in), and the Image names that relative path. A second `up` of
the same package version from another machine therefore sees the same inputs and context hash: no rebuild, no push
(an IMMUTABLE repository would refuse the same tag), no diff. `build_on_preview=False`: `pulumi preview` builds
nothing and needs no Docker; the tag, derived from the content, still shows in the preview.

Into a registry of the user's (`registry`, config `neuron-dra:driverImageRegistry`): the same build, pushed to
`<registry>:<tag>` with the credentials of the machine's Docker configuration (`docker login`, or a credential
helper such as amazon-ecr-credential-helper); no AWS resource is created.

Given (`neuron-dra:driverImage`, an image you built and pushed): referenced as given; a `repo@sha256:...` reference
is pinned, a tag-only one floats and `pulumi preview` says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import neuron_dra
from neuron_dra import __version__
from neuron_dra.components.settings import ImageRegistry, SettingError, check_as

DOCKERFILE = Path("neuron_dra") / "driver" / "Dockerfile"
# What the Dockerfile reads from its context (its COPY lines) and the ignore file that admits only these; all ship
# as package data (pyproject.toml), so a pip install builds the same image as a checkout.
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
REQUIREMENTS = DOCKERFILE.with_name("image-requirements.txt")
MANIFEST = DOCKERFILE.with_name("image-files.txt")  # what the tree may hold; any other file fails the build
CONTEXT_FILES = (DOCKERFILE, DOCKERIGNORE, REQUIREMENTS, MANIFEST, Path("neuron_dra") / "__init__.py",
                 Path("neuron_dra") / "py.typed")
CONTEXT_TREE = Path("neuron_dra") / "driver"  # sent whole (less __pycache__), checked against MANIFEST by the build
KEEP_IMAGES = 10  # the lifecycle policy expires older pushed images (each a past driver version)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\Z")
# Where the build context is staged, relative to the program's working directory (the providers' too).
STAGE_ROOT = PurePosixPath(".neuron-dra") / "driver-image"
FILE_MODE, DIR_MODE = 0o644, 0o755
# A reference as the distribution spec's grammar has it, loosely: [registry/]path[:tag][@sha256:digest].
_REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?\Z")
IMAGE_SETTING = "NeuronDraDriverArgs.image (config neuron-dra:driverImage)"
REGISTRY_SETTING = "NeuronDraDriverArgs.image_registry (config neuron-dra:driverImageRegistry)"


def default_source_dir() -> Path:
    """The directory the package runs from (a checkout's root, or site-packages): the image's build context."""
    return Path(neuron_dra.__file__).resolve().parent.parent


def check_image(image: object) -> None:
    """A container image reference: `repo:tag`, `repo@sha256:<64 hex>` or `repo:tag@sha256:<64 hex>`."""
    if not isinstance(image, str) or not _REFERENCE.match(image):
        raise SettingError(IMAGE_SETTING, image, "an image reference such as registry.example.com/neuron-dra-driver"
                           "@sha256:<64 hex digits> (pinned) or ...:<tag> (follows the tag), lower-case path")


def check_registry(registry: object) -> None:
    """A repository to push the built image to: `registry.example.com/path/neuron-dra-driver`, no tag."""
    check_as(REGISTRY_SETTING, ImageRegistry, registry)  # the driverImageRegistry setting's type


def is_pinned(image: str) -> bool:
    return bool(DIGEST.search(image))


def floating_warning(image: str) -> str:
    return (f"{IMAGE_SETTING} {image} names a tag, not a digest: the DaemonSet runs whatever the tag points to when "
            f"a node pulls it, so nodes can run different builds; give {image.split('@')[0]}@sha256:<digest> to pin "
            "it")


def build_context(source_dir: Path | None, field: str) -> Path:
    """The build context directory (`source_dir`, default the package's own), checked to hold what the build
    reads; the error names the missing file and the way out (a published image)."""
    source = source_dir or default_source_dir()
    missing = [str(p) for p in (*CONTEXT_FILES, CONTEXT_TREE) if not (source / p).exists()]
    if missing:
        raise SettingError(field, str(source),
                           f"a directory holding {DOCKERFILE} and what it copies (missing there: "
                           f"{', '.join(missing)}); or give an image you built from it and pushed: {IMAGE_SETTING}, "
                           "e.g. registry.example.com/neuron-dra-driver@sha256:<digest>")
    return source


def context_files(context: Path) -> list[Path]:
    """The files the build sends (what Dockerfile.dockerignore admits), sorted."""
    tree = [p for p in (context / CONTEXT_TREE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted({*(context / f for f in CONTEXT_FILES), *tree})


def context_tag(context: Path) -> str:
    """`<version>-<12 hex>`: the package version and a hash of the context's file names and contents."""
    digest = hashlib.sha256()
    for path in context_files(context):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{__version__}-{digest.hexdigest()[:12]}"


def lifecycle_policy(keep: int = KEEP_IMAGES) -> str:
    """Expire all but the newest `keep` tagged images (the DaemonSet runs the newest; older ones stay for a
    rollback)."""
    return json.dumps({"rules": [{
        "rulePriority": 1,
        "description": f"keep the newest {keep} driver images",
        "selection": {"tagStatus": "tagged", "tagPatternList": ["*"], "countType": "imageCountMoreThan",
                      "countNumber": keep},
        "action": {"type": "expire"},
    }]})


@dataclass(frozen=True)
class StagedContext:
    """The build context as the docker-build Image sees it: paths relative to the working directory, named by the
    content's tag, so identical on every machine."""

    tag: str
    location: str  # .neuron-dra/driver-image/<tag>
    dockerfile: str  # <location>/neuron_dra/driver/Dockerfile
    files: tuple[str, ...]  # relative posix paths of the staged files


def staged_context(context: Path) -> StagedContext:
    """Where `context`'s files are staged and under which tag (nothing is written)."""
    tag = context_tag(context)
    location = STAGE_ROOT / tag
    files = tuple(p.relative_to(context).as_posix() for p in context_files(context))
    return StagedContext(tag, str(location), str(location / DOCKERFILE.as_posix()), files)


def stage(context: Path, staged: StagedContext, workdir: Path) -> Path:
    """Copy the build context into `workdir/<staged.location>` with fixed modes, unless an identical copy is
    there already (a second run writes nothing); returns the directory. The copy is made beside it and renamed
    into place, so a concurrent run never sees half of it."""
    target = workdir / staged.location
    if _holds_exactly(target, context, staged.files):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    ignore = workdir / STAGE_ROOT.parts[0] / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# neuron-dra stages the driver image's build context here (components/driver_image.py)\n*\n")
    scratch = Path(tempfile.mkdtemp(prefix=f".{staged.tag}.", dir=root))
    try:
        for name in staged.files:
            destination = scratch / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(context / name, destination, follow_symlinks=True)
            destination.chmod(FILE_MODE)
        for directory in [scratch, *(p for p in scratch.rglob("*") if p.is_dir())]:
            directory.chmod(DIR_MODE)
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    for other in root.iterdir():  # earlier versions' contexts (and scratch copies of runs that died)
        if other.name != staged.tag and not other.name.startswith(f".{staged.tag}."):
            shutil.rmtree(other, ignore_errors=True)
    return target


def _holds_exactly(target: Path, context: Path, files: tuple[str, ...]) -> bool:
    """`target` is a staged copy of `files` of `context`: the same names, contents and modes, nothing else."""
    if not target.is_dir() or target.is_symlink():
        return False
    present = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if not p.is_dir())
    if present != sorted(files):
        return False
    for name in files:
        copy = target / name
        if copy.is_symlink() or copy.stat().st_mode & 0o777 != FILE_MODE or \
                copy.read_bytes() != (context / name).read_bytes():
            return False
    return True


def _under_mocks() -> bool:
    """The program runs under Pulumi mocks (`neuron-dra plan`, tests): no provider reads a staged context."""
    from pulumi.runtime import mocks, settings

    return isinstance(settings.get_monitor(), mocks.MockMonitor)


@dataclass(frozen=True)
class BuiltImage:
    repository: aws.ecr.Repository | None  # None: pushed to a registry of the user's
    image: docker_build.Image
    ref: pulumi.Output[str]  # tag@sha256:digest of the pushed build
    context: Path
    staged: StagedContext


def build_image(name: str, context: Path, *, platform: str, registry: pulumi.Input[str],
                registries: list[docker_build.RegistryArgs] | None, opts: pulumi.ResourceOptions,
                workdir: Path | None = None) -> tuple[docker_build.Image, StagedContext]:
    """The docker-build Image of `context`, pushed to `registry` as `<registry>:<tag>`, built at `up` only (and
    only when the content changed); its inputs hold no path of this machine."""
    staged = staged_context(context)
    if not _under_mocks():
        stage(context, staged, workdir or Path.cwd())
    image = docker_build.Image(
        name,
        context=docker_build.BuildContextArgs(location=staged.location),
        dockerfile=docker_build.DockerfileArgs(location=staged.dockerfile),
        platforms=[docker_build.Platform(platform)],
        push=True,
        build_on_preview=False,
        tags=[pulumi.Output.from_input(registry).apply(lambda url: f"{url}:{staged.tag}")],
        registries=registries,
        opts=opts,
    )
    return image, staged


def build_into(name: str, context: Path, registry: pulumi.Input[str], *, platform: str,
               opts: pulumi.ResourceOptions) -> BuiltImage:
    """The pushed image of `context` in a registry repository of the user's, with the Docker credentials of the
    machine that runs `pulumi up`; no AWS resource."""
    image, staged = build_image(f"{name}-image", context, platform=platform, registry=registry, registries=None,
                                opts=opts)
    return BuiltImage(None, image, image.ref, context, staged)


def build_and_push(name: str, context: Path, *, platform: str, force_delete: bool,
                   opts: pulumi.ResourceOptions) -> BuiltImage:
    """The ECR repository, its lifecycle policy and the pushed image of the build context `context`."""
    repository = aws.ecr.Repository(
        f"{name}-repo",
        image_tag_mutability="IMMUTABLE",
        image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
        encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="AES256")],
        force_delete=force_delete,  # False: `pulumi destroy` fails while it holds images, as ECR does
        opts=opts,
    )
    aws.ecr.LifecyclePolicy(f"{name}-repo-lifecycle", repository=repository.name, policy=lifecycle_policy(),
                            opts=opts)
    token = aws.ecr.get_authorization_token_output(registry_id=repository.registry_id)
    image, staged = build_image(
        f"{name}-image", context, platform=platform, registry=repository.repository_url,
        registries=[docker_build.RegistryArgs(address=repository.repository_url, username=token.user_name,
                                              password=token.password)],
        opts=opts)
    return BuiltImage(repository, image, image.ref, context, staged)
