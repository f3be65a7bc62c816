"""The Neuron driver on the kubelet-plugin layer: `Daemon` brings up its parts in order (host discovery, the
checkpoint and CDI specs, the DRA service, health, metrics, slice publishing) and takes them down again."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.driver.daemon.claims.allocation import ClaimError
from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, CheckpointError
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.daemon.failpoints import CrashPoints
from neuron_dra.driver.daemon.health.monitor import HealthMonitor
from neuron_dra.driver.daemon.health.reporting import HealthReporter
from neuron_dra.driver.daemon.health.stream import HealthStreamService
from neuron_dra.driver.daemon.liveness import HealthServer
from neuron_dra.driver.daemon.observability.consumers import ConsumerRefresher
from neuron_dra.driver.daemon.options import DaemonOptions
from neuron_dra.driver.daemon.publisher import NeuronSlices
from neuron_dra.driver.errortext import capped
from neuron_dra.driver.kubeletplugin import ClaimLookup, Helper, SocketError, start
from neuron_dra.driver.kubeletplugin.toolkit import ApiClient, EventLoopThread, SocketPaths, is_listening, trim_memory
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, UnknownInstanceTypeError
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.discovery import DiscoveryError, discover
from neuron_dra.driver.model.emulate import EmulationOptions, emulate
from neuron_dra.driver.model.partitions import CoreLayout, PartitionError, read_node_lnc
from neuron_dra.driver.model.slices import PublishOptions

# prometheus_client is imported only when metrics are served (main.py makes the Metrics then).
if TYPE_CHECKING:
    from neuron_dra.driver.daemon.observability.metrics import Metrics, MetricsServer

log = logging.getLogger(__name__)

RESOLVE_INTERVAL = 30.0  # seconds between checks of unfinished prepares the API server could not answer for
TRIM_INTERVAL = 60.0  # seconds between returns of free heap memory to the system
SIGNAL_POLL = 0.5  # the main thread's longest wait: how late a stop signal's handler may run


class StartupError(RuntimeError):
    pass


class Daemon:
    """All parts of the running driver; `start` brings them up in order, `stop` takes them down."""

    def __init__(self, options: DaemonOptions, lookup: ClaimLookup, api: ApiClient | None,
                 crash: CrashPoints | None = None, metrics: Metrics | None = None,
                 helper: Helper | None = None, loop: EventLoopThread | None = None) -> None:
        """`helper` (listening already, kubeletplugin.start) and `loop` (the event loop its servers run in), when
        given, are the daemon's from then on: `stop` ends them. `metrics`: None when metrics are not served."""
        self.options = options
        self.lookup = lookup
        self.api = api
        self.crash = crash or CrashPoints()
        self.metrics = metrics
        self.stop_event = threading.Event()
        self.host: NeuronHost | None = None
        self.host_root: Path | None = None
        self.state: DriverState | None = None
        self.helper = helper  # listening already when the entry started it (main), else started here
        self.loop = loop  # every gRPC server of the daemon runs in it: one loop thread (_grpcserver.py)
        self.health: HealthServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.slices: NeuronSlices | None = None  # what is published (handed to the helper as data)
        self.health_monitor: HealthMonitor | None = None
        self.health_stream: HealthStreamService | None = None
        self.health_reporter: HealthReporter | None = None
        self._emulated: tempfile.TemporaryDirectory[str] | None = None
        self.stop_was_withdrawn = False
        self._own_registration: tuple[int, int, int] | None = None

    def _load_host(self) -> tuple[NeuronHost, Path]:
        o = self.options
        catalog: Catalog = load_catalog(o.catalog) if o.catalog else BUILTIN
        if o.emulate:
            # Kept for the daemon's lifetime: prepare reads the UltraServer class files under it.
            self._emulated = tempfile.TemporaryDirectory(prefix="neuron-dra-emulated-")
            root = emulate(o.emulate, Path(self._emulated.name) / "root", EmulationOptions(host_id=o.node_name),
                           catalog)
        else:
            assert o.host_root is not None
            root = o.host_root
        return discover(root, catalog=catalog), root

    def _discover(self) -> tuple[NeuronHost, Path, CoreLayout]:
        """The host, its root and its NeuronCore layout; StartupError naming what failed."""
        try:
            host, root = self._load_host()
        except CatalogFileError as e:
            raise StartupError(f"catalog file: {e}") from e
        except (DiscoveryError, UnknownInstanceTypeError) as e:
            raise StartupError(f"host discovery failed: {e}") from e
        log.info("discovered host", extra={"instance_type": host.instance_type, "devices": len(host.devices),
                                           "host_root": str(root),
                                           "kernel_driver_version": host.kernel_driver_version})
        try:
            return host, root, CoreLayout.for_spec(host.spec, read_node_lnc(root, host.spec, self.options.lnc))
        except PartitionError as e:
            raise StartupError(f"node LNC: {e}") from e

    def _load_state(self, helper: Helper, host: NeuronHost, root: Path, layout: CoreLayout) -> DriverState:
        """The claims state from the checkpoint, under the lock the helper holds around each call, with the flock
        the driver's instances share (taken once no instance that does not share it listens on the plain names)."""
        o = self.options
        try:
            lock = helper.lock_instances(self.stop_event)
        except OSError as e:
            raise StartupError(f"the lock the driver's instances share: {e}") from e
        # Prepare knows the cores whatever gets published: a core device only reaches a claim once published.
        state = DriverState(host=host, host_root=root, driver_name=o.driver_name, pool_name=o.node_name,
                            cdi=CdiStore(o.cdi_root, o.driver_name), checkpoint=Checkpoint(o.checkpoint_path),
                            lookup=self.lookup, crash=self.crash, metrics=self.metrics, cores=layout,
                            lock=lock)
        try:
            state.load()
            state.reconcile_local()
        except (CheckpointError, OSError) as e:
            raise StartupError(str(e)) from e
        return state

    def start(self) -> None:
        o = self.options
        # The sockets first: kubelet can register the driver while the rest starts (DRA calls wait until
        # `serve` below).
        if self.loop is None:
            self.loop = EventLoopThread()
        if self.helper is None:
            self.helper = listen(o, self.loop)
        helper = self.helper
        self._own_registration = file_identity(helper.paths.registration)  # to tell a takeover at stop
        host, root, layout = self._discover()
        self.host, self.host_root = host, root
        self.state = state = self._load_state(helper, host, root, layout)
        self.health_monitor = HealthMonitor(root, [d.index for d in host.devices], o.health_poll_interval)
        self.health_stream = HealthStreamService(self.health_monitor, host, o.node_name, self.stop_event,
                                                 cores_per_device=layout.logical_per_device)
        self.health_reporter = HealthReporter(self.health_monitor, host, o.node_name, o.driver_name,
                                              o.unhealthy_taint_effect, self.api, self.metrics)
        if self.metrics is not None:  # who holds which devices: read from the state at every scrape
            pods = ConsumerRefresher(state.prepared, self.lookup)  # pods joining shared claims later
            pods.start(self.stop_event)
            self.metrics.attribute(state.prepared, o.node_name, [d.index for d in host.devices], layout,
                                   self.health_reporter.taints, pods.current)
        report = self.health_reporter.in_background(self.stop_event)
        report(self.health_monitor.current())  # devices already unhealthy at start (events, metrics)
        self.health_monitor.add_listener(report)
        helper.serve(state, self.lookup, self.health_stream.methods())
        if o.healthcheck_port:
            self.health = HealthServer(o.sockets, o.bind_address, o.healthcheck_port, registered=helper.registered,
                                       loop=self.loop, node_addresses=o.node_addresses)
            self.health.start()
            if self.metrics is not None:
                self.metrics.health_front(self.health.front.counts)
        if o.metrics_port and self.metrics is not None:
            self.metrics_server = self.metrics.serve(o.bind_address, o.metrics_port)
            log.info("metrics listening", extra={"port": self.metrics_server.port})
        if self.api is not None:
            self._publish(self.api, host, layout)
        else:
            log.warning("no API client: not publishing ResourceSlices")
        self.health_monitor.start(self.stop_event)
        helper.watch_for_unshared_instance(self.stop_event, self._hand_over)

    def _hand_over(self) -> None:
        """An instance of the previous release appeared on the plain names: it refuses a checkpoint with a
        journal (version 2) rather than misread it, so from now on this instance writes snapshots it can read,
        for its (re)start to load."""
        if self.state is None:
            return
        try:
            self.state.hand_over()
        except (ClaimError, CheckpointError, OSError) as e:
            log.error("writing the checkpoint for the previous release failed", extra={"error": str(e)})

    def _publish(self, api: ApiClient, host: NeuronHost, layout: CoreLayout) -> None:
        """Publish the node's ResourceSlices (NeuronCores too unless --core-partitions off), republished on taints."""
        o = self.options
        assert self.health_reporter is not None
        cores = None if o.core_partitions == "off" else layout
        if cores is None:
            log.info("publishing whole Neuron devices only, no NeuronCores", extra={
                "node": o.node_name, "reason": o.core_partitions_reason or "--core-partitions=off"})
        assert self.helper is not None
        self.slices = NeuronSlices(api, host, o.node_name, PublishOptions(driver_name=o.driver_name, cores=cores),
                                   taints=self.health_reporter.taints, force_cores=o.core_partitions == "on")
        publisher = self.helper.publish(self.slices, api, o.node_name, self.stop_event, self.metrics)
        self.health_reporter.republish = publisher.refresh

    def run(self) -> None:
        """Until stop_event: re-check unfinished prepares that could not be resolved yet, trim the heap."""
        assert self.state is not None
        pending = True
        next_resolve = 0.0
        while not self.stop_event.is_set():
            now = time.monotonic()
            if pending and now >= next_resolve:
                try:
                    pending = bool(self.state.resolve_unfinished().unresolved)
                except (ClaimError, OSError) as e:  # dropping an entry failed (checkpoint or CDI file): retried
                    log.warning("checking unfinished prepares failed; retrying later", extra={"error": str(e)})
                next_resolve = now + RESOLVE_INTERVAL
            trim_memory()
            until = time.monotonic() + (TRIM_INTERVAL if not pending else min(TRIM_INTERVAL, RESOLVE_INTERVAL))
            # In short waits: a signal that arrives just before the main thread blocks does not interrupt that
            # wait, and its Python handler (_signals.py) runs only once the thread runs bytecode again.
            while not self.stop_event.is_set() and time.monotonic() < until:
                self.stop_event.wait(min(SIGNAL_POLL, until - time.monotonic()))

    def stop(self) -> None:
        self.stop_event.set()
        self._withdraw()
        if self.helper is not None:
            self.helper.stop(self.options.drain_seconds)
        if self.health is not None:
            self.health.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.loop is not None:
            self.loop.close()  # after every server in it stopped
        if self.state is not None:
            self.state.close()
        if self.helper is not None:
            self.helper.close()  # the instances' lock, after the state's last write
        if self._emulated is not None:
            self._emulated.cleanup()
        log.info("stopped")

    def _withdraw(self) -> None:
        """A stop that is no hand-over takes the node's devices out of scheduling first (docs/upgrades.md, "A
        clean stop"): unless another instance of the driver listens on this node (a surge rollout: its slices
        stay, as kubelet's hand-over expects), delete our slices within options.withdraw_seconds. Never raises."""
        if self.helper is None or self.slices is None or self.stop_was_withdrawn:
            return
        self.stop_was_withdrawn = True
        own = self.options.sockets
        others = other_instances(own, self.options.plugin.plain_sockets)
        now = file_identity(own.registration)
        if None not in (now, self._own_registration) and now != self._own_registration \
                and is_listening(own.registration):
            others.append(own.registration)  # plain names (kubelet < 1.33): a newer instance took them over
        if others:
            log.info("another instance of the driver serves this node: its slices stay for it",
                     extra={"node": self.options.node_name, "socket": str(others[0])})
            return
        try:
            deleted = self.helper.withdraw(self.options.withdraw_seconds)
        except Exception as e:  # the API server did not do it in time: kubelet's wipe follows (about 30 s)
            log.warning("could not withdraw this node's ResourceSlices as the driver stops; kubelet removes them "
                        "about 30 s after the driver is gone", extra={"node": self.options.node_name,
                                                                      "error": capped(f"{type(e).__name__}: {e}")})
            return
        log.info("withdrew this node's devices from scheduling as the driver stops",
                 extra={"node": self.options.node_name, "slices_deleted": deleted})


def other_instances(own: SocketPaths, plain: SocketPaths) -> list[Path]:
    """The sockets on which another instance of this driver listens on this node (by name: the per-instance ones
    and, for an instance of its own names, the plain ones), found at the moment of the call."""
    candidates = [*own.siblings(), *([] if plain == own else [plain.registration, plain.dra])]
    return [p for p in candidates if p not in (own.registration, own.dra) and is_listening(p)]


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, change time) of the file at `path`: another one when another instance bound it since."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def listen(options: DaemonOptions, loop: EventLoopThread) -> Helper:
    """The kubelet plugin helper in `loop`, with both sockets listening and registration answered."""
    try:
        return start(None, options.plugin, loop)
    except (SocketError, OSError) as e:
        raise StartupError(str(e)) from e
