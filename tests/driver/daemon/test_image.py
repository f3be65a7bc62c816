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
    # No kubernetes client: driver/kubeletplugin/_kube.py talks to the API server on urllib3;
    # the daemon's gRPC is grpcio (driver/kubeletplugin/_grpcserver.py).
    # pydantic and its own dependencies: the catalog file's models (loaded only when a catalog file is given).
    assert set(image) == {"protobuf", "grpcio", "pyyaml", "prometheus-client", "urllib3", "pydantic", "pydantic-core",
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


@pytest.mark.process
def test_daemon_imports_only_what_the_image_has() -> None:
    code = "import sys, neuron_dra.driver.daemon.main; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    ours = {m for m in out if m.startswith("neuron_dra")}
    assert all(m == "neuron_dra" or m.startswith("neuron_dra.driver") for m in ours), sorted(ours)
    assert "tests.support.claims_dir_daemon" not in ours
    # (grpc imports grpc_tools by itself when installed; not in the image)
    assert not [m for m in out if m.split(".")[0] in ("pulumi", "pulumi_aws", "pulumi_kubernetes", "cel", "celpy")]
    # Neither the kubernetes client (17-19 MiB) nor yaml (only for a kubeconfig or catalog file) at start-up; urllib3
    # once the sockets are bound (main imports the API client then).
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
