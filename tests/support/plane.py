"""The control-plane fixtures (`plane`, `api`), for the suites that talk to a real API server.

Imported by the conftest.py of those suites. `kubernetes` and `localcluster` are imported when a fixture is first
used, not when this module is: importing it costs a unit test nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubernetes import client

    from neuron_dra.localcluster.controlplane.plane import ControlPlane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane per test module (etcd, kube-apiserver, controller-manager, scheduler); all stopped after."""
    from neuron_dra.localcluster.controlplane.plane import ControlPlane, running

    cp = ControlPlane.start(tmp_path_factory.mktemp("controlplane"), max_lifetime_s=1800)
    try:
        yield cp
    finally:
        cp.stop()
    assert running(cp.dir) == []


@pytest.fixture(scope="module")
def api(plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An admin API client of the module's control plane."""
    api_client: client.ApiClient = plane.api_client()
    yield api_client
    api_client.close()
