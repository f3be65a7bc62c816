"""This node's Neuron ResourceSlices: its devices, its NeuronCores where the API server keeps counters, and the
devices' health taints. Handed to the kubelet-plugin layer as data (`Helper.publish(NeuronSlices(...))`): the
layer's publisher calls them at every pass with its feedback (taints kept, the partitionable-devices probe)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import quote

from neuron_dra.driver.kubeletplugin import PublishFeedback, Slice
from neuron_dra.driver.kubeletplugin.toolkit import ApiClient, Backoff, KubeApi, ResourceSlicePublisher
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool, resource_slices, with_taints

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are served
    from neuron_dra.driver.daemon.observability.metrics import Metrics

log = logging.getLogger(__name__)

TaintSource = Callable[[], Mapping[str, tuple[Mapping[str, str], ...]]]


class NeuronSlices:
    """The slices to publish, built at every pass from the Node (labels, uid), the host and the feedback."""

    def __init__(self, api: ApiClient, host: NeuronHost, node_name: str, options: PublishOptions,
                 capacity_block_id: str | None = None, taints: TaintSource | None = None,
                 force_cores: bool = False) -> None:
        self._api = KubeApi(api)
        self.host = host
        self.node_name = node_name
        self.options = options
        self._capacity_block_id = capacity_block_id
        # Device taints (health): device name -> taints; once the API server drops them (feedback.taints_supported
        # off) slices stay as they were and health goes to kubelet's health stream only.
        self._taints = taints
        # NeuronCores (options.cores): published only once the API server is seen to keep counters
        # (DRAPartitionableDevices, on by default from 1.36); None until probed. `force_cores` skips the probe.
        self.partitions_supported: bool | None = True if force_cores else None
        self.partitions_reason = "forced by --core-partitions=on" if force_cores else ""

    def _node(self) -> tuple[NodeFacts, str]:
        node = self._api.call("GET", f"/api/v1/nodes/{quote(self.node_name, safe='')}")
        labels = node.get("metadata", {}).get("labels") or {}
        return NodeFacts.from_labels(self.node_name, labels, self._capacity_block_id), node["metadata"]["uid"]

    def _publish_options(self, feedback: PublishFeedback) -> PublishOptions:
        if self.options.cores is None:
            return self.options
        if self.partitions_supported is None:
            self.partitions_supported, self.partitions_reason = feedback.probe_partitionable()
            if self.partitions_supported:
                log.info("publishing NeuronCores with counters beside whole devices",
                         extra={"node": self.node_name, "lnc": self.options.cores.lnc,
                                "reason": self.partitions_reason})
            else:
                log.warning("publishing whole Neuron devices only, no NeuronCores",
                            extra={"node": self.node_name, "reason": self.partitions_reason})
        if self.partitions_supported:
            return self.options
        return replace(self.options, cores=None)

    def __call__(self, feedback: PublishFeedback) -> list[Slice]:
        facts, node_uid = self._node()
        pool = build_pool(self.host, facts, self._publish_options(feedback))
        if self._taints is not None and feedback.taints_supported:
            pool = with_taints(pool, self._taints())
        return resource_slices(pool, 0, node_uid)


def slice_publisher(api: ApiClient, host: NeuronHost, node_name: str, options: PublishOptions,
                    metrics: Metrics | None = None, resync_seconds: float = 60.0, backoff: Backoff | None = None,
                    capacity_block_id: str | None = None, taints: TaintSource | None = None,
                    force_cores: bool = False) -> ResourceSlicePublisher:
    """The layer's publisher of `NeuronSlices`, not started (what `Helper.publish` makes; for tests and tools
    that publish without the sockets)."""
    return ResourceSlicePublisher(api, node_name, options.driver_name,
                                  NeuronSlices(api, host, node_name, options, capacity_block_id, taints, force_cores),
                                  metrics, resync_seconds, backoff)
