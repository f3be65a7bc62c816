"""The API server side of the driver: client construction and the claim lookup used by prepare."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from neuron_dra.driver.claims import ClaimLookupError

# (connect, read) seconds: kubelet gives prepare 45 s; a claim GET must fail well before that.
DEFAULT_TIMEOUT = (3.0, 10.0)


class KubeConfigError(RuntimeError):
    pass


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """A client from a kubeconfig file, or the in-cluster service account when `kubeconfig` is None."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
        else:
            config.load_incluster_config(client_configuration=cfg)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no --kubeconfig given)"
        raise KubeConfigError(f"cannot load {where}: {e}") from None
    cfg.retries = 1  # one quick retry on connection errors; the callers retry with backoff themselves
    return client.ApiClient(cfg)


def read_json(resp: Any) -> dict[str, Any]:
    data = json.loads(resp.data)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object from the API server, got {type(data).__name__}")
    return data


class KubeClaimLookup:
    """GET resource.k8s.io/v1 ResourceClaims (RBAC: resourceclaims get)."""

    def __init__(self, api: client.ApiClient, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self._api = client.ResourceV1Api(api)
        self._timeout = timeout

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            resp = self._api.read_namespaced_resource_claim(name, namespace, _preload_content=False,
                                                            _request_timeout=self._timeout)
            return read_json(resp)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e.status} {e.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e}") from None
