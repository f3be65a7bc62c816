"""`start(driver, options, lookup=...) -> Helper`: the kubelet-plugin helper a DRA driver runs on, as the Go
helper's `kubeletplugin.Start` (k8s.io/dynamic-resource-allocation/kubeletplugin). It listens early (registration
is answered before the driver's state is loaded; DRA calls wait until `serve`), names the sockets (per instance
during a rolling update, docs/upgrades.md), waits for and watches an instance on the plain names, GETs and checks
each claim before the driver's prepare and holds the lock the instances share around each call (_calls.py), and
keeps the driver's ResourceSlices published (`publish`)."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.driver.kubeletplugin import _grpcserver as grpcserver
from neuron_dra.driver.kubeletplugin._calls import Calls, Driver
from neuron_dra.driver.kubeletplugin._claimref import ClaimLookup
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, InstanceLock
from neuron_dra.driver.kubeletplugin._plugin import DRA_LIMITS, PluginServers
from neuron_dra.driver.kubeletplugin._sockets import SocketError, SocketPaths, is_listening

if TYPE_CHECKING:  # the API client and the publisher are imported once a driver publishes
    from neuron_dra.driver.kubeletplugin._kube import ApiClient
    from neuron_dra.driver.kubeletplugin._slicepublisher import (
        Backoff,
        PublisherMetrics,
        Resources,
        ResourceSlicePublisher,
        Slice,
    )

log = logging.getLogger(__name__)

# Seconds a new instance waits for one on the plain socket names (not sharing the driver's state) to stop: its
# pod's grace period (30 s) and some.
UNSHARED_WAIT = 45.0
UNSHARED_POLL = 0.5  # seconds between looks for such an instance appearing while this one serves


@dataclass(frozen=True)
class Options:
    """Where and as whom the helper listens."""

    driver_name: str
    plugins_dir: Path  # kubelet's plugins directory: the DRA socket and the lock go under <plugins_dir>/<driver>
    registry_dir: Path  # kubelet's plugin registry: the registration socket
    instance: str = ""  # the pod UID for names of this instance's own (rolling update); "": the plain names
    extra_services: tuple[str, ...] = ()  # served on the DRA socket too, advertised after the DRA versions
    limits: grpcserver.Limits = DRA_LIMITS

    @property
    def sockets(self) -> SocketPaths:
        return SocketPaths.for_driver(self.plugins_dir, self.registry_dir, self.driver_name, self.instance)

    @property
    def plain_sockets(self) -> SocketPaths:
        return SocketPaths.for_driver(self.plugins_dir, self.registry_dir, self.driver_name)

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name


class Helper:
    """A started plugin: both sockets listening, registration answered. See `start`."""

    def __init__(self, options: Options, loop: grpcserver.EventLoopThread | None = None) -> None:
        self.options = options
        self.servers = PluginServers(options.sockets, options.driver_name, extra_services=options.extra_services,
                                     limits=options.limits, loop=loop)
        self.instance_lock: InstanceLock | None = None
        self.lock = CallLock()  # held around each DRA call; the instances' flock joins it (`lock_instances`)
        self._calls: Calls | None = None
        self._watch: threading.Thread | None = None
        self._stopped = False
        self._publisher: ResourceSlicePublisher | None = None

    @property
    def registered(self) -> threading.Event:
        """Set while kubelet has this instance registered."""
        return self.servers.registration.registered

    @property
    def paths(self) -> SocketPaths:
        return self.servers.paths

    def serve(self, driver: Driver, lookup: ClaimLookup,
              extra_methods: Mapping[str, grpcserver.Method] = {}) -> None:
        """Answer DRA calls with `driver` (calls that came in meanwhile waited for this); `lookup` GETs the claims
        its prepare is handed."""
        self._calls = Calls(driver, lookup, self.lock)
        self.servers.serve(self._calls, extra_methods)

    def lock_instances(self, stop: threading.Event) -> CallLock:
        """The lock held around each DRA call (`lock`), now with the flock the driver's instances share (a
        rolling update runs two), taken once no instance that does not share it listens on the plain names
        (`wait_for_unshared_instance`). The driver holds it for its own work on what the calls change (loading,
        background checks, stopping). OSError when the lock's file cannot be opened."""
        if self.instance_lock is None:
            self.options.plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
            self.wait_for_unshared_instance(stop)
            self.instance_lock = InstanceLock(self.options.plugin_dir)
            self.lock.attach(self.instance_lock)
        return self.lock

    def wait_for_unshared_instance(self, stop: threading.Event, timeout: float = UNSHARED_WAIT) -> None:
        """With names of its own, wait until nothing listens on the plain names: an instance there (the previous
        release, or one on plain names) neither takes the instances' lock nor refreshes its state, so both must
        not change the driver's records. kubelet calls this instance meanwhile (the newest registered); those
        calls wait until `serve`, and the DaemonSet stops the other pod once this one is Ready (registered)."""
        if not self.options.instance:
            return
        plain = self.options.plain_sockets
        if not is_listening(plain.registration):
            return
        log.warning("an instance of the driver on the plain socket names is running (the previous release?); "
                    "waiting until it stops before loading the claims", extra={"socket": str(plain.registration)})
        began = time.monotonic()
        while is_listening(plain.registration) and time.monotonic() - began < timeout:
            if stop.wait(0.2):
                return
        log.info("the instance on the plain socket names is gone" if not is_listening(plain.registration) else
                 "the instance on the plain socket names still runs; going on", extra={
                     "waited_seconds": round(time.monotonic() - began, 3)})

    def watch_for_unshared_instance(self, stop: threading.Event, on_appear: Callable[[], None] = lambda: None,
                                    poll: float = UNSHARED_POLL) -> threading.Thread | None:
        """With names of its own: once an instance appears on the plain names (a rollback to the previous
        release, which takes no lock and keeps its state in memory), call `on_appear` (the driver writes its
        records as that release reads them), and once it still listens a poll later (it loaded them), unregister,
        so that kubelet sends every new call to that one and the two never both change the records. This
        instance stops when its pod does."""
        if not self.options.instance:
            return None
        plain = self.options.plain_sockets

        def watch() -> None:
            seen = 0
            while not stop.wait(poll):
                seen = seen + 1 if is_listening(plain.registration) else 0
                if seen == 1:
                    on_appear()
                if seen == 2:  # it loaded the claims and still listens: it serves from here on
                    log.warning("an instance of the driver on the plain socket names started (a rollback to the "
                                "previous release?); unregistering so that kubelet calls only that one",
                                extra={"socket": str(plain.registration)})
                    self.unregister()
                    return

        self._watch = threading.Thread(target=watch, name="unshared-instance-watch", daemon=True)
        self._watch.start()
        return self._watch

    def publish(self, resources: Sequence[Slice] | Resources, api: ApiClient, node_name: str, stop: threading.Event,
                metrics: PublisherMetrics | None = None, resync_seconds: float = 60.0,
                backoff: Backoff | None = None) -> ResourceSlicePublisher:
        """Keep `resources` (this node's ResourceSlices, generation 0: the publisher numbers them) published as the
        Go helper's `PublishResources` does (_slicepublisher.py): the slices as data, or a function of the
        publisher's feedback (`PublishFeedback`: taints kept, partitionable devices) that returns them at every
        pass. A later call hands over new ones and publishes them at once. The first call starts the publishing
        thread, which ends with `stop`."""
        if callable(resources):
            source: Resources = resources
        else:
            slices = copy.deepcopy(list(resources))
            source = lambda _: copy.deepcopy(slices)  # noqa: E731 - the publisher changes what it is handed
        if self._publisher is None:
            from neuron_dra.driver.kubeletplugin._slicepublisher import ResourceSlicePublisher

            self._publisher = ResourceSlicePublisher(api, node_name, self.options.driver_name, source, metrics,
                                                     resync_seconds, backoff)
            self._publisher.start(stop)
        else:
            self._publisher.resources = source
            self._publisher.refresh()
        return self._publisher

    def withdraw(self, seconds: float = 5.0) -> int:
        """Delete this node's slices within `seconds` (a stop no other instance follows) and publish nothing
        again; returns how many, 0 when nothing was published. API errors propagate."""
        return 0 if self._publisher is None else self._publisher.withdraw(seconds)

    def unregister(self) -> None:
        """Leave kubelet's calls to another instance; calls already sent here are still answered."""
        self.servers.unregister()

    def stop(self, grace: float = 5.0) -> None:
        """Unregister, then give the DRA calls running `grace` seconds (the sockets go, see _plugin.py)."""
        if not self._stopped:
            self._stopped = True
            self.servers.stop(grace)

    def close(self) -> None:
        """After `stop` and the driver's last write under it: the instances' lock goes."""
        self.stop(0)
        if self._calls is not None:
            self._calls.close()
        if self.instance_lock is not None:
            self.instance_lock.close()
            self.instance_lock = None


def start(driver: Driver | None, options: Options, loop: grpcserver.EventLoopThread | None = None,
          extra_methods: Mapping[str, grpcserver.Method] = {}, lookup: ClaimLookup | None = None) -> Helper:
    """Listen on both sockets and answer registration; serve `driver` at once (its claims GET with `lookup`), or,
    when it is None (its state still loading), once `Helper.serve` is called: kubelet's DRA calls wait until then.
    `loop`: the event loop the servers run in (the driver's, shared with its other servers); SocketError when a
    socket cannot be bound."""
    if driver is not None and lookup is None:
        raise ValueError("start: a driver is served with a claim lookup (lookup=...), which GETs its claims")
    helper = Helper(options, loop)
    try:
        helper.servers.listen()
    except (SocketError, OSError) as e:
        helper.stop(0)
        raise SocketError(str(e)) from e
    if driver is not None:
        assert lookup is not None
        helper.serve(driver, lookup, extra_methods)
    return helper

