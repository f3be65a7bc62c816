"""The API server side of the driver: client construction, the few REST calls it makes, and the claim lookup.

The calls go through the `kubernetes` client's ApiClient (its kubeconfig and in-cluster configuration,
authentication with token refresh, TLS, retries) but not through its generated API methods: those validate
every call with pydantic, and the validators of the six calls the daemon makes cost about 25 MiB of resident
memory (V1Node's alone 17 MiB), a third of the daemon's budget. Bodies and responses are plain JSON.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from neuron_dra.driver.claims import ClaimLookupError

# (connect, read) seconds: kubelet gives prepare 45 s; a claim GET must fail well before that.
DEFAULT_TIMEOUT = (3.0, 10.0)
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
Timeout = float | tuple[float, float]


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


class KubeApi:
    """JSON requests through an ApiClient; a non-2xx answer raises ApiException (with .status)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Mapping[str, Any] | None = None, timeout: Timeout = DEFAULT_TIMEOUT) -> Any:
        """The urllib3 response (not yet read), for streaming; see `call` for JSON."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        serialized = self._api.param_serialize(method, path, query_params=params, header_params=headers,
                                               body=dict(body) if body is not None else None,
                                               auth_settings=["BearerToken"])
        resp = self._api.call_api(*serialized, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            text = resp.read().decode("utf-8", "replace")
            raise ApiException(status=resp.status, reason=resp.reason, body=text[:2000])
        return resp.response

    def call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
             body: Mapping[str, Any] | None = None, timeout: Timeout = DEFAULT_TIMEOUT) -> dict[str, Any]:
        return read_json(self.request(method, path, query=query, body=body, timeout=timeout))

    def watch(self, path: str, query: Mapping[str, Any], timeout: Timeout) -> Generator[dict[str, Any], None, None]:
        """Watch events ({"type", "object"}) until the server ends the watch."""
        resp = self.request("GET", path, query={**query, "watch": "true"}, timeout=timeout)
        try:
            pending = b""
            for chunk in resp.stream(64 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.close()  # a watch left early: this connection cannot be reused
            resp.release_conn()


class KubeClaimLookup:
    """GET resource.k8s.io/v1 ResourceClaims (RBAC: resourceclaims get)."""

    def __init__(self, api: client.ApiClient, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self._api = KubeApi(api)
        self._timeout = timeout

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"
        try:
            return self._api.call("GET", path, timeout=self._timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e.status} {e.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise ClaimLookupError(f"GET resourceclaims {namespace}/{name}: {e}") from None
