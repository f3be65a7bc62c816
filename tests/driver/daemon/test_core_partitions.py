"""`--core-partitions auto`: NeuronCores with counters only where the API server's scheduler keeps each node's
counter slices to that node (Kubernetes 1.37+, kubernetes#138917); on 1.36 whole devices only, with the reason
(issue 29 item 4). The decision against stated versions, and against a real 1.36 kube-apiserver's /version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon.options import DaemonOptions, decide_core_partitions, parse_options, with_core_partitions
from neuron_dra.driver.model.k8s_names import COUNTERS_PER_NODE_MINOR


def never() -> str | None:
    raise AssertionError("the version is asked only for auto")


@pytest.mark.parametrize(("version", "mode", "fragment"), [
    ("v1.36.5", "off", "kubernetes#138917, fixed in 1.37"),
    ("v1.35.4", "off", "nodes squared"),
    ("v1.36.3-eks-4f4795d", "off", "the API server is v1.36.3-eks-4f4795d"),
    ("v1.37.1", "auto", "the API server is v1.37.1"),
    ("v1.37.2-eks-0a1b2c3", "auto", "v1.37.2-eks"),
    ("v2.0.0", "auto", "v2.0.0"),
    (None, "off", "version is unknown"),
    ("garbage", "off", "version is unknown ('garbage')"),
])
def test_auto_follows_the_api_servers_version(version: str | None, mode: str, fragment: str) -> None:
    decided, reason = decide_core_partitions("auto", lambda: version)
    assert decided == mode and fragment in reason


def test_on_and_off_are_kept_without_asking() -> None:
    assert decide_core_partitions("on", never) == ("on", "--core-partitions=on")
    assert decide_core_partitions("off", never) == ("off", "--core-partitions=off")
    assert parse_options(["--node-name", "n"], {}).core_partitions == "auto"  # the default
    assert parse_options(["--node-name", "n"], {"CORE_PARTITIONS": "on"}).core_partitions == "on"
    assert COUNTERS_PER_NODE_MINOR == 37
    no_api = with_core_partitions(DaemonOptions(node_name="n"), None)
    assert no_api.core_partitions == "off" and "unknown" in no_api.core_partitions_reason


@pytest.fixture(scope="module")
def api_136(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from neuron_dra.localcluster.controlplane.plane import ControlPlane

    plane = ControlPlane.start(Path(tmp_path_factory.mktemp("plane")), kubernetes_version="1.36",
                               max_lifetime_s=600)
    api = plane.api_client()
    try:
        yield api
    finally:
        api.close()
        plane.stop()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_real_136_api_server_gets_whole_devices_only(api_136: Any) -> None:
    options = with_core_partitions(DaemonOptions(node_name="n"), api_136)
    assert options.core_partitions == "off"
    assert "the API server is v1.36." in options.core_partitions_reason
    assert "kubernetes#138917" in options.core_partitions_reason
