"""The Neuron driver on the kubelet-plugin layer: `Daemon` brings up its parts in order (host discovery, the
checkpoint and CDI specs, the DRA service, health, metrics, slice publishing) and takes them down again."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.driver.daemon.options import DaemonOptions
from neuron_dra.driver.kubeletplugin._sockets import SocketError, SocketPaths
from neuron_dra.driver.model.k8s_names import HEALTH_SERVICES

# The rest is imported in the functions that use them, after the sockets are bound (start-up time: docs in `main`).
# Imported in the functions that use them, after the sockets are bound (start-up time: see main.py).
if TYPE_CHECKING:
    import tempfile

    from neuron_dra.driver.daemon.claims.state import DriverState
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.daemon.health.monitor import HealthMonitor
    from neuron_dra.driver.daemon.health.reporting import HealthReporter
    from neuron_dra.driver.daemon.health.stream import HealthStreamService
    from neuron_dra.driver.daemon.liveness import HealthServer
    from neuron_dra.driver.daemon.observability.metrics import Metrics, MetricsServer
    from neuron_dra.driver.daemon.publisher import SlicePublisher
    from neuron_dra.driver.kubeletplugin._claimref import ClaimLookup
    from neuron_dra.driver.kubeletplugin._grpcserver import EventLoopThread
    from neuron_dra.driver.kubeletplugin._instance_lock import InstanceLock
    from neuron_dra.driver.kubeletplugin._kube import ApiClient
    from neuron_dra.driver.kubeletplugin._plugin import PluginServers
    from neuron_dra.driver.model.devices import NeuronHost
    from neuron_dra.driver.model.partitions import CoreLayout

log = logging.getLogger(__name__)

RESOLVE_INTERVAL = 30.0  # seconds between checks of unfinished prepares the API server could not answer for
TRIM_INTERVAL = 60.0  # seconds between returns of free heap memory to the system
SIGNAL_POLL = 0.5  # the main thread's longest wait: how late a stop signal's handler may run
# Seconds a new instance waits for one on the plain socket names (not sharing the state) to stop: its pod's grace
# period (30 s) and some.
UNSHARED_WAIT = 45.0
UNSHARED_POLL = 0.5  # seconds between looks for such an instance appearing while this one serves


class StartupError(RuntimeError):
    pass


class Daemon:
    """All parts of the running driver; `start` brings them up in order, `stop` takes them down."""

    def __init__(self, options: DaemonOptions, lookup: ClaimLookup, api: ApiClient | None,
                 crash: CrashPoints | None = None, metrics: Metrics | None = None,
                 servers: PluginServers | None = None, loop: EventLoopThread | None = None) -> None:
        """`servers` (listening already) and `loop` (the event loop they run in), when given, are the daemon's
        from then on: `stop` ends them."""
        from neuron_dra.driver.daemon.failpoints import CrashPoints

        self.options = options
        self.lookup = lookup
        self.api = api
        self.crash = crash or CrashPoints()
        # prometheus_client only when metrics are served (the DaemonSet's default is off): 0.6 MiB less.
        self.metrics = metrics
        if self.metrics is None and options.metrics_port:
            from neuron_dra.driver.daemon.observability.metrics import Metrics

            self.metrics = Metrics()
        self.stop_event = threading.Event()
        self.host: NeuronHost | None = None
        self.host_root: Path | None = None
        self.state: DriverState | None = None
        self.servers = servers  # listening already when the entry started them (main), else started here
        self.loop = loop  # every gRPC server of the daemon runs in it: one loop thread (grpcserver.py)
        self.health: HealthServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.publisher: SlicePublisher | None = None
        self.health_monitor: HealthMonitor | None = None
        self.health_stream: HealthStreamService | None = None
        self.health_reporter: HealthReporter | None = None
        self._emulated: tempfile.TemporaryDirectory[str] | None = None
        self.instance_lock: InstanceLock | None = None

    def _load_host(self) -> tuple[NeuronHost, Path]:
        from neuron_dra.driver.model.catalog import BUILTIN, Catalog
        from neuron_dra.driver.model.catalog_file import load_catalog
        from neuron_dra.driver.model.discovery import discover
        from neuron_dra.driver.model.emulate import EmulationOptions, emulate

        o = self.options
        catalog: Catalog = load_catalog(o.catalog) if o.catalog else BUILTIN
        if o.emulate:
            # Kept for the daemon's lifetime: prepare reads the UltraServer class files under it.
            import tempfile

            self._emulated = tempfile.TemporaryDirectory(prefix="neuron-dra-emulated-")
            root = emulate(o.emulate, Path(self._emulated.name) / "root", EmulationOptions(host_id=o.node_name),
                           catalog)
        else:
            assert o.host_root is not None
            root = o.host_root
        return discover(root, catalog=catalog), root

    def _discover(self) -> tuple[NeuronHost, Path, CoreLayout]:
        """The host, its root and its NeuronCore layout; StartupError naming what failed."""
        from neuron_dra.driver.model.catalog import UnknownInstanceTypeError
        from neuron_dra.driver.model.catalog_file import CatalogFileError
        from neuron_dra.driver.model.discovery import DiscoveryError
        from neuron_dra.driver.model.partitions import CoreLayout, PartitionError, read_node_lnc

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

    def _load_state(self, host: NeuronHost, root: Path, layout: CoreLayout) -> DriverState:
        """The claims state from the checkpoint, under the lock the driver's instances share."""
        from neuron_dra.driver.daemon.claims.cdi import CdiStore
        from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, CheckpointError
        from neuron_dra.driver.daemon.claims.state import DriverState
        from neuron_dra.driver.kubeletplugin._instance_lock import InstanceLock

        o = self.options
        plugin_dir = o.plugins_dir / o.driver_name
        plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._wait_for_unshared_instance()
        try:
            self.instance_lock = InstanceLock(plugin_dir)  # shared with another instance during a surge rollout
        except OSError as e:
            raise StartupError(f"the lock the driver's instances share: {e}") from e
        # Prepare knows the cores whatever gets published: a core device only reaches a claim once published.
        state = DriverState(host=host, host_root=root, driver_name=o.driver_name, pool_name=o.node_name,
                            cdi=CdiStore(o.cdi_root, o.driver_name), checkpoint=Checkpoint(o.checkpoint_path),
                            lookup=self.lookup, crash=self.crash, metrics=self.metrics, cores=layout,
                            instance_lock=self.instance_lock)
        try:
            state.load()
            state.reconcile_local()
        except (CheckpointError, OSError) as e:
            raise StartupError(str(e)) from e
        return state

    def start(self) -> None:
        o = self.options
        # The sockets first: kubelet can register the driver while the rest starts (plugin.py: DRA calls wait
        # until `serve` below).
        if self.loop is None:
            from neuron_dra.driver.kubeletplugin._grpcserver import EventLoopThread

            self.loop = EventLoopThread()
        if self.servers is None:
            self.servers = listen(o, self.loop)
        from neuron_dra.driver.daemon.health.monitor import HealthMonitor
        from neuron_dra.driver.daemon.health.reporting import HealthReporter
        from neuron_dra.driver.daemon.health.stream import HealthStreamService

        host, root, layout = self._discover()
        self.host, self.host_root = host, root
        self.state = self._load_state(host, root, layout)
        self.health_monitor = HealthMonitor(root, [d.index for d in host.devices], o.health_poll_interval)
        self.health_stream = HealthStreamService(self.health_monitor, host, o.node_name, self.stop_event,
                                                 cores_per_device=layout.logical_per_device)
        self.health_reporter = HealthReporter(self.health_monitor, host, o.node_name, o.driver_name,
                                              o.unhealthy_taint_effect, self.api, self.metrics)
        if self.metrics is not None:  # who holds which devices: read from the state at every scrape
            from neuron_dra.driver.daemon.observability.consumers import ConsumerRefresher

            pods = ConsumerRefresher(self.state.prepared, self.lookup)  # pods joining shared claims later
            pods.start(self.stop_event)
            self.metrics.attribute(self.state.prepared, o.node_name, [d.index for d in host.devices], layout,
                                   self.health_reporter.taints, pods.current)
        report = self.health_reporter.in_background(self.stop_event)
        report(self.health_monitor.current())  # devices already unhealthy at start (events, metrics)
        self.health_monitor.add_listener(report)
        self.servers.serve(self.state, self.health_stream.methods())
        if o.healthcheck_port:
            from neuron_dra.driver.daemon.liveness import HealthServer

            self.health = HealthServer(o.sockets, o.bind_address, o.healthcheck_port,
                                       registered=self.servers.registration.registered, loop=self.loop)
            self.health.start()
        if o.metrics_port and self.metrics is not None:
            self.metrics_server = self.metrics.serve(o.bind_address, o.metrics_port)
            log.info("metrics listening", extra={"port": self.metrics_server.port})
        if self.api is not None:
            self._publish(self.api, host, layout)
        else:
            log.warning("no API client: not publishing ResourceSlices")
        self.health_monitor.start(self.stop_event)
        self.watch_for_unshared_instance()

    def _publish(self, api: ApiClient, host: NeuronHost, layout: CoreLayout) -> None:
        """Publish the node's ResourceSlices (NeuronCores too unless --core-partitions off), republished on taints."""
        from neuron_dra.driver.daemon.publisher import SlicePublisher
        from neuron_dra.driver.model.slices import PublishOptions

        o = self.options
        assert self.health_reporter is not None
        cores = None if o.core_partitions == "off" else layout
        if cores is None:
            log.info("publishing whole Neuron devices only, no NeuronCores", extra={
                "node": o.node_name, "reason": o.core_partitions_reason or "--core-partitions=off"})
        self.publisher = SlicePublisher(api, host, o.node_name, PublishOptions(driver_name=o.driver_name, cores=cores),
                                        self.metrics, taints=self.health_reporter.taints,
                                        force_cores=o.core_partitions == "on")
        self.health_reporter.republish = self.publisher.refresh
        self.publisher.start(self.stop_event)

    def _wait_for_unshared_instance(self) -> None:
        """With names of its own, wait until nothing listens on the plain names: an instance there (the previous
        release, or one on plain names) neither takes the instances' lock nor refreshes its state, so both must
        not change the checkpoint. kubelet calls this instance meanwhile (the newest registered); those calls
        wait until `serve`, and the DaemonSet stops the other pod once this one is Ready (registered)."""
        o = self.options
        if not o.instance:
            return
        from neuron_dra.driver.kubeletplugin._sockets import is_listening

        plain = SocketPaths.for_driver(o.plugins_dir, o.registry_dir, o.driver_name)
        if not is_listening(plain.registration):
            return
        log.warning("an instance of the driver on the plain socket names is running (the previous release?); "
                    "waiting until it stops before loading the claims", extra={"socket": str(plain.registration)})
        began = time.monotonic()
        while is_listening(plain.registration) and time.monotonic() - began < UNSHARED_WAIT:
            if self.stop_event.wait(0.2):
                return
        log.info("the instance on the plain socket names is gone" if not is_listening(plain.registration) else
                 "the instance on the plain socket names still runs; going on", extra={
                     "waited_seconds": round(time.monotonic() - began, 3)})

    def watch_for_unshared_instance(self) -> threading.Thread | None:
        """With names of its own: once an instance appears on the plain names (a rollback to the previous
        release, which takes no lock and keeps its state in memory), write the checkpoint as that release can
        read it (it refuses a journal it cannot verify and exits; kubelet starts it again), and once it still
        listens a poll later (it loaded the claims), unregister, so that kubelet sends every new call to that
        one and the two never both change the checkpoint. This instance stops when its pod does."""
        o = self.options
        if not o.instance or self.servers is None:
            return None
        from neuron_dra.driver.daemon.claims.allocation import ClaimError
        from neuron_dra.driver.daemon.claims.checkpoint import CheckpointError
        from neuron_dra.driver.kubeletplugin._sockets import is_listening

        plain = SocketPaths.for_driver(o.plugins_dir, o.registry_dir, o.driver_name)
        servers = self.servers
        state = self.state

        def watch() -> None:
            seen = 0
            while not self.stop_event.wait(UNSHARED_POLL):
                seen = seen + 1 if is_listening(plain.registration) else 0
                if seen == 1 and state is not None:
                    # The previous release refuses a checkpoint with a journal (version 2) rather than misread
                    # it: from now on this instance writes snapshots it can read, for its (re)start to load.
                    try:
                        state.hand_over()
                    except (ClaimError, CheckpointError, OSError) as e:
                        log.error("writing the checkpoint for the previous release failed",
                                  extra={"error": str(e)})
                if seen == 2:  # it loaded the claims and still listens: it serves from here on
                    log.warning("an instance of the driver on the plain socket names started (a rollback to the "
                                "previous release?); unregistering so that kubelet calls only that one",
                                extra={"socket": str(plain.registration)})
                    servers.unregister()
                    return

        thread = threading.Thread(target=watch, name="unshared-instance-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Until stop_event: re-check unfinished prepares that could not be resolved yet, trim the heap."""
        from neuron_dra.driver.daemon.claims.allocation import ClaimError
        from neuron_dra.driver.kubeletplugin import _memory as memory

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
            memory.trim()
            until = time.monotonic() + (TRIM_INTERVAL if not pending else min(TRIM_INTERVAL, RESOLVE_INTERVAL))
            # In short waits: a signal that arrives just before the main thread blocks does not interrupt that
            # wait, and its Python handler (signals.py) runs only once the thread runs bytecode again.
            while not self.stop_event.is_set() and time.monotonic() < until:
                self.stop_event.wait(min(SIGNAL_POLL, until - time.monotonic()))

    def stop(self) -> None:
        self.stop_event.set()
        if self.servers is not None:
            self.servers.stop(self.options.drain_seconds)
        if self.health is not None:
            self.health.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.loop is not None:
            self.loop.close()  # after every server in it stopped
        if self.state is not None:
            self.state.close()
        if self.instance_lock is not None:
            self.instance_lock.close()
        if self._emulated is not None:
            self._emulated.cleanup()
        log.info("stopped")


def listen(options: DaemonOptions, loop: EventLoopThread) -> PluginServers:
    """The kubelet-facing servers, in `loop`, with both sockets listening and the registration socket answered
    (plugin.py)."""
    from neuron_dra.driver.kubeletplugin._plugin import PluginServers

    servers = PluginServers(options.sockets, options.driver_name, extra_services=HEALTH_SERVICES, loop=loop)
    try:
        servers.listen()
    except (SocketError, OSError) as e:
        servers.stop(0)
        raise StartupError(str(e)) from e
    return servers


