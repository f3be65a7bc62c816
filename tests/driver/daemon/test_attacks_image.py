"""Issue 42, round 4, item 6: the driver image holds exactly an allowlist. Files planted under neuron_dra/driver (a
.env, a kubeconfig, .aws/credentials, a core dump, editor files, a link) fail the build, named, in its first stage
(no network: --pull=never, nothing installed yet), and so do sources planted beside the real ones (an evil.py, a
.proto) that neuron_dra/driver/image-files.txt does not name; a clean context builds an image whose /opt/app is
exactly the manifest's `image` lines, the tracked *.py and *.proto files (checked on the built tree, slow). Built with
buildah on the local cluster's cached base image (docs/real-runtime.md)."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from neuron_dra.localcluster.build import BuildError
from neuron_dra.localcluster.nodes import images
from tests.support import image_manifest

REPO = Path(__file__).resolve().parents[3]
# components/driver_image.py's DOCKERFILE and DOCKERIGNORE (not imported: components pulls in Pulumi)
DOCKERFILE = Path("neuron_dra") / "driver" / "Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
PLANTED = (".env", "kubeconfig", ".aws/credentials", "core", "daemon/core.1234", "daemon/claims/state.py~",
           "daemon/.state.py.swp", "model/#discovery.py#", "deploy/id_rsa", "daemon/evil.py", "model/evil.py",
           "kubeletplugin/proto/evil.proto", "kubeletplugin/_generated/evil_pb2.py")

pytestmark = pytest.mark.containerd


def tracked_context(root: Path) -> Path:
    """The files of the build context as git tracks them (a clean checkout), under `root`."""
    for name in image_manifest.tracked(REPO):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    return root


def bud(context: Path, reference: str) -> None:
    base = images.build_base()
    images.buildah(["bud", "--isolation", "chroot", "--pull=never", "--layers=false", "-t", reference,
                    "-f", str(context / DOCKERFILE),
                    "--ignorefile", str(context / DOCKERIGNORE),
                    "--build-arg", f"PYTHON_IMAGE={base.reference}", str(context)], f"buildah bud {reference}", None)


@pytest.mark.attacks
@pytest.mark.process
def test_files_planted_in_the_driver_tree_fail_the_build_naming_each(tmp_path: Path) -> None:
    context = tracked_context(tmp_path / "ctx")
    tree = context / "neuron_dra" / "driver"
    for name in PLANTED:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("SECRET\n")
    (tree / "daemon" / "linked.py").symlink_to("/etc/shadow")
    (tree / "daemon" / "main.py").unlink()
    (tree / "daemon" / "main.py").symlink_to("/etc/shadow")  # a name the manifest allows, as a link
    (tree / "model" / "empty").mkdir()
    with pytest.raises(BuildError) as failed:
        bud(context, "localhost/neuron-dra-driver:planted")
    message = str(failed.value)
    assert "holds files that are not the driver's sources" in message
    named = {line.strip() for line in message.splitlines()}
    for name in (*PLANTED, "daemon/linked.py", "daemon/main.py", "model/empty"):
        assert f"neuron_dra/driver/{name}" in named, name
    assert "neuron_dra/driver/daemon/claims/state.py" not in named


@pytest.mark.slow
@pytest.mark.process
def test_the_built_image_holds_exactly_the_driver_sources_and_protos(tmp_path: Path) -> None:
    context = tracked_context(tmp_path / "ctx")
    (context / "neuron_dra" / "driver" / "daemon" / "__pycache__").mkdir(exist_ok=True)
    (context / "neuron_dra" / "driver" / "daemon" / "__pycache__" / "stale.cpython-311.pyc").write_bytes(b"x")
    reference = "localhost/neuron-dra-driver:allowlist"
    bud(context, reference)
    archive = tmp_path / "image.tar"
    try:
        images.buildah(["push", reference, f"oci-archive:{archive}:{reference}"], "buildah push", None)
    finally:
        images.buildah(["rmi", reference], "buildah rmi", None)
    shipped: set[str] = set()
    everything: set[str] = set()
    with tarfile.open(archive) as oci:
        for member in oci.getmembers():
            if not member.isfile() or not member.name.startswith("blobs/"):
                continue
            blob = oci.extractfile(member)
            assert blob is not None
            try:
                with tarfile.open(fileobj=blob, mode="r:*") as layer:
                    names = [m.name.removeprefix("./") for m in layer.getmembers() if not m.isdir()]
            except tarfile.ReadError:
                continue  # a config or manifest blob
            everything.update(names)
            shipped.update(n.removeprefix("opt/app/") for n in names if n.startswith("opt/app/"))
    sources = {n for n in shipped if "__pycache__" not in n}
    manifest = image_manifest.parse((REPO / image_manifest.MANIFEST).read_text())
    assert sources == {path for path, role in manifest.items() if role == "image"}
    assert sources == {p.relative_to(context).as_posix() for p in (context / "neuron_dra").rglob("*")
                       if p.is_file() and p.suffix in (".py", ".proto", ".typed") and p.parent.name != "__pycache__"}
    assert not [n for n in shipped if "__pycache__" in n and "stale" in n]
    assert not [n for n in everything if n.startswith("opt/app/") and n.endswith(("testing.py", ".pyi", "Dockerfile"))]
    assert "opt/venv/bin/neuron-dra-driver" in everything
