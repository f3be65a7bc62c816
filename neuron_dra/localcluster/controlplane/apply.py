"""Apply plain manifest dicts to the API server with server-side apply (what `kubectl apply --server-side` does)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client, dynamic

FIELD_MANAGER = "neuron-dra-localcluster"


def apply_all(api_client: client.ApiClient, manifests: Iterable[Mapping[str, Any]]) -> list[str]:
    """Apply each object in order (namespaces and classes first is the caller's job); returns kind/name list."""
    dyn = dynamic.DynamicClient(api_client)
    applied = []
    for obj in manifests:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        kwargs: dict[str, Any] = {"body": dict(obj), "name": meta["name"], "field_manager": FIELD_MANAGER,
                                  "force_conflicts": True}
        if resource.namespaced:
            kwargs["namespace"] = meta.get("namespace", "default")
        resource.server_side_apply(**kwargs)
        applied.append(f"{obj['kind']}/{meta['name']}")
    return applied
