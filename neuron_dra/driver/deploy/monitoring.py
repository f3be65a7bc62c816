"""What a Prometheus needs to find the drivers' metrics, and the dashboard's ConfigMap (docs/metrics.md).

Plain objects from plain arguments (deploy/manifests.py fills them in from DriverDeployOptions): a headless Service
over the driver pods' metrics port, a prometheus-operator PodMonitor (monitoring.coreos.com/v1), and a
ConfigMap holding the Grafana dashboard for the Grafana sidecar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Manifest = dict[str, Any]
METRICS_PORT_NAME = "metrics"
SCRAPE_INTERVAL = "30s"
NODE_LABEL = "node"  # the target label every series gets: the node the driver pod runs on


def metrics_service(meta: Manifest, selector: Mapping[str, str], port: int) -> Manifest:
    """Headless: its endpoints are the pods themselves (one per node), for a scrape config of role endpoints."""
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"clusterIP": "None", "selector": dict(selector),
                 "ports": [{"name": METRICS_PORT_NAME, "port": port, "targetPort": METRICS_PORT_NAME,
                            "protocol": "TCP"}]},
    }


def pod_monitor(meta: Manifest, selector: Mapping[str, str], namespace: str) -> Manifest:
    """Scrape every driver pod's metrics port; the pod's node becomes the `node` label. honorLabels: the
    attribution series carry `node` themselves (the same value), and must keep it."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": meta,
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [{
                "port": METRICS_PORT_NAME, "path": "/metrics", "interval": SCRAPE_INTERVAL, "honorLabels": True,
                "relabelings": [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                 "targetLabel": NODE_LABEL}],
            }],
        },
    }


def dashboard_config_map(meta: Manifest, dashboard: Mapping[str, Any], file_name: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {file_name: json.dumps(dashboard, indent=1, sort_keys=True)}}


def scrape_peers(namespaces: tuple[str, ...], pod_labels: Mapping[str, str]) -> list[Manifest]:
    """NetworkPolicy `from` entries: pods in these namespaces (all of them, or those with `pod_labels`)."""
    peers: list[Manifest] = []
    for ns in namespaces:
        peer: Manifest = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
        if pod_labels:
            peer["podSelector"] = {"matchLabels": dict(pod_labels)}
        peers.append(peer)
    return peers
