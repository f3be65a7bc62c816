"""neuron_dra/driver/Dockerfile: the image holds the daemon's own dependencies at the repository's pinned versions and
the `neuron_dra.driver` package only, which must run without the rest of the repository.

(No container engine runs here, so the image itself is not built in the tests; the layout it creates is what
`test_daemon_imports_only_what_the_image_has` reproduces.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import image_manifest

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "neuron_dra" / "driver" / "Dockerfile"
IMAGE_REQUIREMENTS = REPO / "neuron_dra" / "driver" / "image-requirements.txt"


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_image_pins_match_the_repository() -> None:
    image, repo = pins(IMAGE_REQUIREMENTS), pins(REPO / "requirements.txt")
    # No kubernetes client and no urllib3: driver/kubeletplugin/_kube.py talks to the API server on the standard
    # library's TLS sockets, its answers parsed by httptools; the daemon's gRPC is grpcio
    # (driver/kubeletplugin/_grpcserver.py).
    # pydantic and its own dependencies: the catalog file's models (loaded only when a catalog file is given).
    assert set(image) == {"protobuf", "grpcio", "httptools", "pyyaml", "prometheus-client", "pydantic", "pydantic-core",
                          "annotated-types", "typing-inspection", "typing-extensions"}
    assert {name: repo.get(name) for name in image} == image


def test_dockerfile_copies_existing_paths_and_runs_the_driver() -> None:
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), f"{src} in {DOCKERFILE} does not exist"
    assert 'ENTRYPOINT ["neuron-dra-driver"]' in text  # the DaemonSet's command
    assert "from neuron_dra.driver.daemon.main import main" in text
    assert "PYTHONDONTWRITEBYTECODE=1" in text  # read-only root filesystem


def test_the_image_manifest_is_the_tracked_driver_tree() -> None:
    """neuron_dra/driver/image-files.txt, the allowlist the Dockerfile's `sources` stage enforces, is what
    `make image-manifest` renders from `git ls-files` now: a file added to or removed from the driver is in it."""
    committed = (REPO / image_manifest.MANIFEST).read_text()
    assert committed == image_manifest.render(image_manifest.tracked(REPO)), "run `make image-manifest`"
    entries = image_manifest.parse(committed)
    shipped = {path for path, role in entries.items() if role == "image"}
    assert "neuron_dra/driver/daemon/main.py" in shipped and "neuron_dra/py.typed" in shipped
    assert not [p for p in shipped if not p.endswith((".py", ".proto", "py.typed"))]
    assert {"neuron_dra/driver/Dockerfile", "neuron_dra/driver/image-files.txt"} <= set(entries)


@pytest.mark.parametrize(("path", "problem"), [
    ("neuron_dra/driver/daemon/testing.py", "test harness"),
    ("neuron_dra/driver/model/test_catalog.py", "test harness"),
    ("neuron_dra/driver/conftest.py", "test harness"),
    ("neuron_dra/driver/.env", "neither a source"),
    ("neuron_dra/driver/deploy/values.json", "neither a source"),
    ("neuron_dra/driver/daemon/my file.py", "letters, digits"),
])
def test_the_image_manifest_refuses_harnesses_and_unknown_files(path: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        image_manifest.render([path])


@pytest.mark.process
def test_daemon_imports_only_what_the_image_has() -> None:
    code = "import sys, neuron_dra.driver.daemon.main; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    ours = {m for m in out if m.startswith("neuron_dra")}
    assert all(m == "neuron_dra" or m.startswith("neuron_dra.driver") for m in ours), sorted(ours)
    assert "tests.support.claims_dir_daemon" not in ours
    # (grpc imports grpc_tools by itself when installed; not in the image)
    assert not [m for m in out if m.split(".")[0] in ("pulumi", "pulumi_aws", "pulumi_kubernetes", "cel", "celpy")]
    # Neither the kubernetes client (17-19 MiB) nor yaml (only for a kubeconfig or catalog file) at start-up, and no
    # urllib3 at all (the API client is http.client's).
    assert not [m for m in out if m.split(".")[0] in ("kubernetes", "urllib3", "yaml", "pydantic")]


# What the entry imports until the registration socket answers (main.start_early), kubelet giving GetInfo 1 s: the
# gRPC servers and the socket names only. The claims and device model come with the state, the API client after.
START_EARLY = """
import sys, tempfile
from pathlib import Path
from neuron_dra.driver.daemon import main
from neuron_dra.driver.kubeletplugin.toolkit import EventLoopThread
d = Path(tempfile.mkdtemp())
o = main.parse_options(["--node-name", "n", "--plugins-dir", str(d / "p"), "--registry-dir", str(d / "r")], {})
helper = main.start_early(main.with_socket_names(o, None), EventLoopThread())
assert helper is not None and helper.paths.registration.exists()
print("\\n".join(sorted(sys.modules)))
helper.close()
"""


@pytest.mark.process
def test_registration_answers_before_the_claims_model_and_api_client_are_imported() -> None:
    out = subprocess.run([sys.executable, "-c", START_EARLY], capture_output=True, text=True, check=True).stdout.split()
    ours = {m.removeprefix("neuron_dra.driver.") for m in out if m.startswith("neuron_dra.driver.")}
    later = {"daemon.driver", "daemon.claims", "daemon.health", "kubeletplugin._kube", "kubeletplugin._slicepublisher",
             "model.catalog", "model.config", "model.discovery"}
    assert "kubeletplugin._plugin" in ours and not later & ours, sorted(later & ours)
    # ctypes.util.find_library runs `ldconfig -p` in a child process (_memory.py finds malloc's knobs without it)
    assert not {"ctypes.util", "urllib3", "yaml"} & set(out)


@pytest.mark.process
def test_daemon_serves_grpc_with_grpcio_not_its_own_http2() -> None:
    """The daemon's HTTP/2 is grpcio's: no HTTP/2 framing or HPACK library of its own is imported."""
    code = ("import sys, neuron_dra.driver.daemon.main, neuron_dra.driver.kubeletplugin._plugin, "
            "neuron_dra.driver.daemon.liveness; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "grpc" in out and not {"h2", "hyperframe", "hpack"} & set(out)
    requirements = (REPO / "neuron_dra" / "driver" / "image-requirements.txt").read_text()
    assert "grpcio==" in requirements and "h2==" not in requirements and "hpack==" not in requirements
