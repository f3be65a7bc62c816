"""Shared fixtures: emulated host trees are the fixtures of every part."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from neuron_dra.localcluster.cluster import LocalCluster
from neuron_dra.localcluster.controlplane import ControlPlane, running

# Fixtures that start a control plane: a test using one (directly or through another fixture) is a `cluster` test
# even if its module forgot the marker, so `make test-fast` never waits for a control plane.
CLUSTER_FIXTURES = frozenset({"plane", "api", "local_cluster", "kube", "ns"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


# The end-to-end cluster: the demo's nodes plus an UltraServer node.
E2E_NODES = ("trn2.48xlarge:2", "trn1.32xlarge:1", "inf2.48xlarge:1", "trn2u.48xlarge:1")


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., Path]:
    """Write an emulated host tree of an instance type and return its root."""

    def make(instance_type: str, **options: object) -> Path:
        root = tmp_path / f"host-{instance_type}"
        return emulate(instance_type, root, EmulationOptions(**options))  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The local cluster: real control plane, emulated nodes each with the real kubelet, a fake runtime and the driver.

    Built from the Go module proxy on first use (cached outside the tree), so it works on a fresh machine.
    """
    from neuron_dra.localcluster.cluster import up

    cluster_dir = tmp_path_factory.mktemp("cluster")
    cluster = up(cluster_dir, list(E2E_NODES), ttl=3600, timeout=600, runtime="fake")  # it tests the driver
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(str(local_cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def ns(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace per test. At the end its pods are deleted (and so unprepared) and their ResourceClaims are gone,
    so the next test finds every device free (the scheduler counts a claim's devices until the claim is deleted)."""
    from tests.support.e2e import eventually, namespace_name

    core, res = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    name = namespace_name("e2e-", request.node.name)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    # Pods are refused until the service-account controller has made the namespace's `default` account.
    eventually(lambda: any(sa.metadata is not None and sa.metadata.name == "default"
                           for sa in core.list_namespaced_service_account(name).items), 30,
               what=f"service account default in {name}")
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(name).items, 90, what=f"pods of {name} gone")
    eventually(lambda: not res.list_namespaced_resource_claim(name).items, 60, what=f"claims of {name} gone")
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane per test module (etcd, kube-apiserver, controller-manager, scheduler); all stopped after."""
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
