"""Fixtures of the end-to-end suite: the local cluster (real control plane, emulated nodes each with the real
kubelet, a fake runtime and the driver), an API client of it, a namespace per test; and the control plane alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client, config

from neuron_dra.localcluster.cluster import LocalCluster
from tests.support.plane import api, plane  # noqa: F401  (fixtures)

# The end-to-end cluster: the demo's nodes plus an UltraServer node.
E2E_NODES = ("trn2.48xlarge:2", "trn1.32xlarge:1", "inf2.48xlarge:1", "trn2u.48xlarge:1")


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The local cluster, built from the Go module proxy on first use (cached outside the tree), so it works on a
    fresh machine."""
    from neuron_dra.localcluster.cluster import up

    cluster_dir = tmp_path_factory.mktemp("cluster")
    cluster = up(cluster_dir, list(E2E_NODES), ttl=3600, timeout=600, runtime="fake")  # it tests the driver
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(str(local_cluster.kubeconfig))
    yield api_client
    api_client.close()


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
