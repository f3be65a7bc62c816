"""The driver image a `NeuronDraDriver` runs: one the stack builds and pushes, or one the user gives.

Built (the default): `neuron_dra/driver/Dockerfile` of the directory the package runs from (a checkout, or
site-packages of a pip install: the Dockerfile, its `Dockerfile.dockerignore` allowlist and the image's
requirements ship as package data), built with BuildKit (pulumi-docker-build) and pushed to an ECR repository the
stack owns: scan on push, IMMUTABLE tags, a lifecycle policy keeping the newest images. The tag is the package
version and a hash of the build context, so a changed driver is a new tag (immutable tags cannot move) and an
unchanged one is no new build; the DaemonSet names the pushed digest (`tag@sha256:...`).

Given (`neuron-dra:driverImage`, e.g. the image the release workflow publishes): referenced as given; a
`repo@sha256:...` reference is pinned, a tag-only one floats and `pulumi preview` says so.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

import neuron_dra
from neuron_dra import __version__
from neuron_dra.components.settings import SettingError

DOCKERFILE = Path("neuron_dra") / "driver" / "Dockerfile"
# What the Dockerfile reads from its context (its COPY lines) and the ignore file that admits only these; all ship
# as package data (pyproject.toml), so a pip install builds the same image as a checkout.
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
REQUIREMENTS = DOCKERFILE.with_name("image-requirements.txt")
CONTEXT_FILES = (DOCKERFILE, DOCKERIGNORE, REQUIREMENTS, Path("neuron_dra") / "__init__.py",
                 Path("neuron_dra") / "py.typed")
CONTEXT_TREE = Path("neuron_dra") / "driver"  # copied whole (less __pycache__)
KEEP_IMAGES = 10  # the lifecycle policy expires older pushed images (each a past driver version)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# A reference as the distribution spec's grammar has it, loosely: [registry/]path[:tag][@sha256:digest].
_REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")
IMAGE_SETTING = "NeuronDraDriverArgs.image (config neuron-dra:driverImage)"


def default_source_dir() -> Path:
    """The directory the package runs from (a checkout's root, or site-packages): the image's build context."""
    return Path(neuron_dra.__file__).resolve().parent.parent


def check_image(image: object) -> None:
    """A container image reference: `repo:tag`, `repo@sha256:<64 hex>` or `repo:tag@sha256:<64 hex>`."""
    if not isinstance(image, str) or not _REFERENCE.match(image):
        raise SettingError(IMAGE_SETTING, image, "an image reference such as registry.example.com/neuron-dra-driver"
                           "@sha256:<64 hex digits> (pinned) or ...:<tag> (follows the tag), lower-case path")


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
                           f"{', '.join(missing)}); or give a published image: {IMAGE_SETTING}, e.g. the one the "
                           f"release workflow publishes, ghcr.io/neuron-dra/neuron-dra-driver@sha256:<digest>")
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
class BuiltImage:
    repository: aws.ecr.Repository
    image: docker_build.Image
    ref: pulumi.Output[str]  # tag@sha256:digest of the pushed build
    context: Path


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
    tag = context_tag(context)
    image = docker_build.Image(
        f"{name}-image",
        context=docker_build.BuildContextArgs(location=str(context)),
        dockerfile=docker_build.DockerfileArgs(location=str(context / DOCKERFILE)),
        platforms=[docker_build.Platform(platform)],
        push=True,
        tags=[repository.repository_url.apply(lambda url: f"{url}:{tag}")],
        registries=[docker_build.RegistryArgs(address=repository.repository_url, username=token.user_name,
                                              password=token.password)],
        opts=opts,
    )
    return BuiltImage(repository, image, image.ref, context)
