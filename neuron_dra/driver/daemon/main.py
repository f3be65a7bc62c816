"""`neuron-dra-driver` (also `python -m neuron_dra.driver`): the DRA kubelet plugin daemon of one node.

Flags fall back to the environment variables of AWS's Helm chart (NODE_NAME, KUBELET_PLUGINS_DIRECTORY_PATH,
KUBELET_REGISTRAR_DIRECTORY_PATH, CDI_ROOT, HEALTHCHECK_PORT), so the daemon is a drop-in for its DaemonSet.
Start-up: discover the host, load the checkpoint, rewrite CDI specs and clean up after a crash, serve the
DRA socket and then the registration socket, then health, metrics and slice publishing. SIGTERM/SIGINT
stop it cleanly (registration socket first). An unreachable API server never stops it: publishing retries
with backoff and prepares fail per claim until the server answers.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from neuron_dra.driver.daemon import logs
from neuron_dra.driver.daemon.instances import SOCKET_NAME_MODES, InstanceError, check_pod_uid, decide
from neuron_dra.driver.daemon.ratelimit import DAEMON_BURST, DAEMON_QPS
from neuron_dra.driver.daemon.signals import set_on_signals
from neuron_dra.driver.daemon.sockets import SocketError, SocketPaths
from neuron_dra.driver.model.errortext import capped
from neuron_dra.driver.model.k8s_names import (
    CATALOG_ENV,
    CHECKPOINT_FILE,
    CORE_PARTITION_MODES,
    COUNTERS_PER_NODE_MINOR,
    DEFAULT_CDI_ROOT,
    DEFAULT_DRIVER_NAME,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    DEFAULT_TAINT_EFFECT,
    DNS_SUBDOMAIN_RULE,
    DRIVER_NAME_MAX,
    DRIVER_NAME_RULE,
    HEALTH_SERVICES,
    PLUGINS_DIR_ENV,
    REGISTRY_DIR_ENV,
    TAINT_EFFECTS,
    is_dns_subdomain,
)
from neuron_dra.driver.model.version import VERSION

# Imported in the functions that use them, after the sockets are bound (start-up time: docs in `main`).
if TYPE_CHECKING:
    import tempfile

    from neuron_dra.driver.daemon.claims import ClaimLookup
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.daemon.grpcserver import EventLoopThread
    from neuron_dra.driver.daemon.health import HealthServer
    from neuron_dra.driver.daemon.health_monitor import HealthMonitor
    from neuron_dra.driver.daemon.health_reporting import HealthReporter
    from neuron_dra.driver.daemon.health_stream import HealthStreamService
    from neuron_dra.driver.daemon.instance_lock import InstanceLock
    from neuron_dra.driver.daemon.kube import ApiClient
    from neuron_dra.driver.daemon.metrics import Metrics, MetricsServer
    from neuron_dra.driver.daemon.plugin import PluginServers
    from neuron_dra.driver.daemon.publisher import SlicePublisher
    from neuron_dra.driver.daemon.state import DriverState
    from neuron_dra.driver.model.devices import NeuronHost

log = logging.getLogger("neuron_dra.driver.daemon.main")

RESOLVE_INTERVAL = 30.0  # seconds between checks of unfinished prepares the API server could not answer for
TRIM_INTERVAL = 60.0  # seconds between returns of free heap memory to the system
SIGNAL_POLL = 0.5  # the main thread's longest wait: how late a stop signal's handler may run
# On SIGTERM, seconds the DRA calls already running get to finish (the DaemonSet's grace period is 30 s).
DRAIN_SECONDS = 20.0
# Seconds a new instance waits for one on the plain socket names (not sharing the state) to stop: its pod's grace
# period (30 s) and some.
UNSHARED_WAIT = 45.0
UNSHARED_POLL = 0.5  # seconds between looks for such an instance appearing while this one serves


@dataclass(frozen=True)
class DaemonOptions:
    node_name: str
    driver_name: str = DEFAULT_DRIVER_NAME
    plugins_dir: Path = Path(DEFAULT_PLUGINS_DIR)
    registry_dir: Path = Path(DEFAULT_REGISTRY_DIR)
    cdi_root: Path = Path(DEFAULT_CDI_ROOT)
    healthcheck_port: int = 0  # 0: off
    metrics_port: int = 0  # 0: off
    # Health and metrics listen here only: kubelet probes and Prometheus scrape the pod IP (docs/hardening.md §1).
    bind_address: str = "127.0.0.1"
    kubeconfig: str | None = None  # None: in-cluster service account
    host_root: Path | None = Path("/")
    emulate: str | None = None  # instance type to emulate instead of reading host_root
    catalog: Path | None = None  # catalog file with more instance types (docs/catalog-file.md); None: built-in
    log_level: str = "info"
    health_poll_interval: float = 1.0  # seconds between reads of the hardware error counters
    unhealthy_taint_effect: str = DEFAULT_TAINT_EFFECT
    # auto: NeuronCores with counters where the API server is Kubernetes 1.37+ and keeps counters; on; off.
    # `with_core_partitions` resolves auto to auto (probe the counters) or off, with the reason.
    core_partitions: str = "auto"
    core_partitions_reason: str = ""
    lnc: int | None = None  # the node's LNC; None: /opt/aws/neuron/logical_nc_config, else the family's default
    # The API client (kube.py): client-side rate limit as kubelet's defaults (ratelimit.py), each request's deadline.
    kube_api_qps: float = DAEMON_QPS
    kube_api_burst: int = DAEMON_BURST
    kube_api_timeout: float = 10.0
    # Surge rollouts (docs/upgrades.md): the pod UID, how the socket names are chosen (instances.py), and the
    # instance id chosen ("": the plain names; set by `with_socket_names`).
    pod_uid: str = ""
    socket_names: str = "auto"
    instance: str = ""
    drain_seconds: float = DRAIN_SECONDS

    @property
    def sockets(self) -> SocketPaths:
        return SocketPaths.for_driver(self.plugins_dir, self.registry_dir, self.driver_name, self.instance)

    @property
    def checkpoint_path(self) -> Path:
        return self.plugins_dir / self.driver_name / CHECKPOINT_FILE


def _port(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 = off, or 1-65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 = off, or 1-65535)")
    return value


def _driver_name(text: str) -> str:
    if not is_dns_subdomain(text, DRIVER_NAME_MAX):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: {DRIVER_NAME_RULE}, e.g. "
                                         f"{DEFAULT_DRIVER_NAME}")
    return text


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0.05 to 60)") from None
    if not 0.05 <= value <= 60:
        raise argparse.ArgumentTypeError(f"{value} seconds: allowed 0.05 to 60")
    return value


def _bounded(kind: type[float] | type[int], low: float, high: float, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} ({low:g} to {high:g})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: allowed {low:g} to {high:g}")
        return value

    return parse


def _node_name(text: str) -> str:
    if not is_dns_subdomain(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a node name; allowed: {DNS_SUBDOMAIN_RULE}")
    return text


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address (the pod's IP, e.g. from the downward API "
                                         "status.podIP, or 127.0.0.1)") from None




def _lnc(text: str) -> int:
    if text not in ("1", "2"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Logical NeuronCore config; allowed: 1 or 2")
    return int(text)


def _abs_dir(text: str) -> Path:
    p = Path(text)
    if not p.is_absolute():
        raise argparse.ArgumentTypeError(f"{text!r} must be an absolute path (kubelet resolves it on the host)")
    return p


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuron-dra-driver", description="The Neuron DRA kubelet plugin of one node.")

    def env_default(name: str, fallback: str | None) -> str | None:
        return env.get(name) or fallback

    p.add_argument("--node-name", type=_node_name, default=env_default("NODE_NAME", None), metavar="NAME",
                   help="this node (and pool) name [env NODE_NAME]")
    p.add_argument("--driver-name", type=_driver_name, default=DEFAULT_DRIVER_NAME, metavar="NAME",
                   help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    p.add_argument("--plugins-dir", type=_abs_dir, metavar="DIR",
                   default=env_default(PLUGINS_DIR_ENV, DEFAULT_PLUGINS_DIR),
                   help=f"kubelet plugins dir [env {PLUGINS_DIR_ENV}] (default {DEFAULT_PLUGINS_DIR})")
    p.add_argument("--registry-dir", type=_abs_dir, metavar="DIR",
                   default=env_default(REGISTRY_DIR_ENV, DEFAULT_REGISTRY_DIR),
                   help=f"kubelet plugin registry dir [env {REGISTRY_DIR_ENV}] "
                        f"(default {DEFAULT_REGISTRY_DIR})")
    p.add_argument("--cdi-root", type=_abs_dir, metavar="DIR", default=env_default("CDI_ROOT", DEFAULT_CDI_ROOT),
                   help=f"CDI spec dir [env CDI_ROOT] (default {DEFAULT_CDI_ROOT})")
    p.add_argument("--healthcheck-port", type=_port, default=env_default("HEALTHCHECK_PORT", "0"), metavar="PORT",
                   help="gRPC health port, service 'liveness'; 0 = off [env HEALTHCHECK_PORT] (default 0)")
    p.add_argument("--metrics-port", type=_port, default=env_default("METRICS_PORT", "0"), metavar="PORT",
                   help="Prometheus /metrics port; 0 = off [env METRICS_PORT] (default 0)")
    p.add_argument("--bind-address", default=env_default("BIND_ADDRESS", env_default("POD_IP", "127.0.0.1")),
                   type=_address, metavar="ADDR",
                   help="the one address of the health and metrics ports, where kubelet's probe connects "
                        "[env BIND_ADDRESS, else env POD_IP (the downward API's status.podIP; the node's IP "
                        "with hostNetwork)] (default 127.0.0.1)")
    p.add_argument("--kubeconfig", default=None, metavar="FILE", help="kubeconfig file (default: in-cluster)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--host-root", type=_abs_dir, metavar="DIR",
                     help="root of the host's /sys and /dev as mounted in the container (default /)")
    src.add_argument("--emulate", metavar="INSTANCE_TYPE",
                     help="emulate this instance type (of the catalog) in a temporary host tree (for local clusters "
                          "and tests)")
    p.add_argument("--catalog", type=Path, default=env_default(CATALOG_ENV, None), metavar="FILE",
                   help=f"catalog file with more instance types (docs/catalog-file.md) [env {CATALOG_ENV}]")
    p.add_argument("--health-poll-interval", type=_interval, default=env_default("HEALTH_POLL_INTERVAL", "1"),
                   metavar="SECONDS", help="seconds between reads of the devices' hardware error counters "
                                           "[env HEALTH_POLL_INTERVAL] (default 1)")
    p.add_argument("--unhealthy-taint-effect", choices=TAINT_EFFECTS,
                   default=env_default("UNHEALTHY_TAINT_EFFECT", DEFAULT_TAINT_EFFECT),
                   help="effect of the taint on unhealthy devices [env UNHEALTHY_TAINT_EFFECT] "
                        f"(default {DEFAULT_TAINT_EFFECT})")
    p.add_argument("--log-level", default=env_default("LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"], help="[env LOG_LEVEL] (default info)")
    p.add_argument("--core-partitions", choices=CORE_PARTITION_MODES,
                   default=env_default("CORE_PARTITIONS", "auto"),
                   help="publish NeuronCores with counters beside whole devices: auto (where the API server is "
                        f"Kubernetes 1.{COUNTERS_PER_NODE_MINOR}+, whose scheduler keeps each node's counters to "
                        "that node, and keeps ResourceSlice sharedCounters; on 1.36 a claim pod's scheduler CPU "
                        "grows with nodes squared), on, off [env CORE_PARTITIONS] (default auto)")
    p.add_argument("--lnc", type=_lnc, default=env_default("NODE_LNC", None), metavar="1|2",
                   help="the node's Logical NeuronCore config (env NODE_LNC; default: the host's "
                        "/opt/aws/neuron/logical_nc_config, else 2 on Trainium2+)")
    p.add_argument("--kube-api-qps", type=_bounded(float, 0.1, 1000, "a number of requests per second"),
                   default=env_default("KUBE_API_QPS", f"{DAEMON_QPS:g}"), metavar="QPS",
                   help=f"API requests per second, sustained (kubelet's default) [env KUBE_API_QPS] "
                        f"(default {DAEMON_QPS:g})")
    p.add_argument("--kube-api-burst", type=_bounded(int, 1, 1000, "a whole number of requests"),
                   default=env_default("KUBE_API_BURST", str(DAEMON_BURST)), metavar="N",
                   help=f"API requests allowed at once above the QPS (kubelet's default) [env KUBE_API_BURST] "
                        f"(default {DAEMON_BURST})")
    p.add_argument("--kube-api-timeout", type=_bounded(float, 0.5, 40, "a number of seconds"),
                   default=env_default("KUBE_API_TIMEOUT", "10"), metavar="SECONDS",
                   help="deadline of one API request, the whole answer included; kubelet gives a prepare 45 s "
                        "[env KUBE_API_TIMEOUT] (default 10)")
    p.add_argument("--pod-uid", default=env_default("POD_UID", ""), metavar="UID",
                   help="this pod's UID (downward API metadata.uid) for socket names of its own [env POD_UID]")
    p.add_argument("--socket-names", choices=SOCKET_NAME_MODES, default=env_default("SOCKET_NAMES", "auto"),
                   help="auto: per instance when there is a pod UID and the node's kubelet is 1.33+, else "
                        "plain; per-instance; plain [env SOCKET_NAMES] (default auto; docs/upgrades.md)")
    p.add_argument("--version", action="version", version=f"neuron-dra-driver {VERSION}")
    return p


def parse_options(argv: Sequence[str] | None, env: Mapping[str, str]) -> DaemonOptions:
    parser = build_parser(env)
    a = parser.parse_args(argv)
    if not a.node_name:
        parser.error("--node-name (or env NODE_NAME) is required")
    host_root = None if a.emulate else (a.host_root or Path("/"))
    try:
        pod_uid = check_pod_uid(a.pod_uid or "")
    except InstanceError as e:
        parser.error(str(e))
    return DaemonOptions(
        node_name=a.node_name, driver_name=a.driver_name, plugins_dir=Path(a.plugins_dir),
        registry_dir=Path(a.registry_dir), cdi_root=Path(a.cdi_root), healthcheck_port=int(a.healthcheck_port),
        metrics_port=int(a.metrics_port), bind_address=a.bind_address, kubeconfig=a.kubeconfig, host_root=host_root,
        emulate=a.emulate, log_level=a.log_level, health_poll_interval=float(a.health_poll_interval),
        unhealthy_taint_effect=a.unhealthy_taint_effect, core_partitions=a.core_partitions,
        lnc=None if a.lnc is None else int(a.lnc), catalog=Path(a.catalog) if a.catalog else None,
        kube_api_qps=float(a.kube_api_qps), kube_api_burst=int(a.kube_api_burst),
        kube_api_timeout=float(a.kube_api_timeout), pod_uid=pod_uid, socket_names=a.socket_names,
    )


def kubelet_version(api: ApiClient, node_name: str, seconds: float) -> str | None:
    """The node's kubelet version as the Node reports it (status.nodeInfo.kubeletVersion); None on any failure."""
    from urllib.parse import quote

    from neuron_dra.driver.daemon.kube import ApiClientError, ApiException, KubeApi

    try:
        node = KubeApi(api).call("GET", f"/api/v1/nodes/{quote(node_name, safe='')}", seconds=seconds)
    except (ApiException, ApiClientError) as e:
        log.warning("cannot read the node's kubelet version", extra={"node": node_name, "error": str(e)})
        return None
    version = (node.get("status") or {}).get("nodeInfo", {}).get("kubeletVersion")
    return version if isinstance(version, str) else None


_SERVER_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def server_version(api: ApiClient, seconds: float) -> str | None:
    """The API server's version (GET /version, gitVersion: `v1.36.5`, `v1.37.1-eks-...`); None on any failure."""
    from neuron_dra.driver.daemon.kube import ApiClientError, ApiException, KubeApi

    try:
        version = KubeApi(api).call("GET", "/version", seconds=seconds).get("gitVersion")
    except (ApiException, ApiClientError) as e:
        log.warning("cannot read the API server's version", extra={"error": str(e)})
        return None
    return version if isinstance(version, str) else None


def decide_core_partitions(mode: str, version: Callable[[], str | None]) -> tuple[str, str]:
    """`--core-partitions` resolved to on, off or auto (publish NeuronCores if the API server keeps counters:
    the publisher's probe), with the reason; `version` (the API server's) is asked only for auto."""
    if mode != "auto":
        return mode, f"--core-partitions={mode}"
    seen = version()
    m = _SERVER_VERSION.match(seen or "")
    if m is None:
        return "off", (f"the API server's version is unknown ({seen!r}): whole devices only, which never slow the "
                       "scheduler (--core-partitions on publishes NeuronCores)")
    major, minor = int(m.group(1)), int(m.group(2))
    if (major, minor) < (1, COUNTERS_PER_NODE_MINOR):
        return "off", (f"the API server is {seen}: its scheduler reads every node's counter slices on each node "
                       f"(kubernetes#138917, fixed in 1.{COUNTERS_PER_NODE_MINOR}), so NeuronCores with counters make "
                       "every claim pod's scheduling cost grow with nodes squared (--core-partitions on publishes "
                       "them anyway)")
    return "auto", f"the API server is {seen}"


def with_core_partitions(options: DaemonOptions, api: ApiClient | None) -> DaemonOptions:
    """`options` with `--core-partitions auto` resolved against the API server's version (once, at start)."""
    mode, reason = decide_core_partitions(
        options.core_partitions,
        lambda: None if api is None else server_version(api, options.kube_api_timeout))
    return replace(options, core_partitions=mode, core_partitions_reason=reason)


def with_socket_names(options: DaemonOptions, api: ApiClient | None) -> DaemonOptions:
    """`options` with the instance id chosen (instances.py); asks the API server only when that decides."""
    naming = decide(options.socket_names, options.pod_uid,
                    lambda: None if api is None else kubelet_version(api, options.node_name,
                                                                     options.kube_api_timeout))
    log.info("socket names chosen", extra={"instance": naming.instance or "(plain names)", "reason": naming.reason})
    return replace(options, instance=naming.instance)


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
            from neuron_dra.driver.daemon.metrics import Metrics

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

    def start(self) -> None:
        o = self.options
        # The sockets first: kubelet can register the driver while the rest starts (plugin.py: DRA calls wait
        # until `serve` below).
        if self.loop is None:
            from neuron_dra.driver.daemon.grpcserver import EventLoopThread

            self.loop = EventLoopThread()
        if self.servers is None:
            self.servers = listen(o, self.loop)
        from neuron_dra.driver.daemon.cdi import CdiStore
        from neuron_dra.driver.daemon.checkpoint import Checkpoint, CheckpointError
        from neuron_dra.driver.daemon.health_monitor import HealthMonitor
        from neuron_dra.driver.daemon.health_reporting import HealthReporter
        from neuron_dra.driver.daemon.health_stream import HealthStreamService
        from neuron_dra.driver.daemon.state import DriverState
        from neuron_dra.driver.model.catalog import UnknownInstanceTypeError
        from neuron_dra.driver.model.catalog_file import CatalogFileError
        from neuron_dra.driver.model.discovery import DiscoveryError
        from neuron_dra.driver.model.partitions import CoreLayout, PartitionError, read_node_lnc

        try:
            self.host, self.host_root = self._load_host()
        except CatalogFileError as e:
            raise StartupError(f"catalog file: {e}") from None
        except (DiscoveryError, UnknownInstanceTypeError) as e:
            raise StartupError(f"host discovery failed: {e}") from None
        log.info("discovered host", extra={"instance_type": self.host.instance_type,
                                           "devices": len(self.host.devices), "host_root": str(self.host_root),
                                           "kernel_driver_version": self.host.kernel_driver_version})
        try:
            layout = CoreLayout.for_spec(self.host.spec, read_node_lnc(self.host_root, self.host.spec, o.lnc))
        except PartitionError as e:
            raise StartupError(f"node LNC: {e}") from None
        plugin_dir = o.plugins_dir / o.driver_name
        plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._wait_for_unshared_instance()
        from neuron_dra.driver.daemon.instance_lock import InstanceLock

        try:
            self.instance_lock = InstanceLock(plugin_dir)  # shared with another instance during a surge rollout
        except OSError as e:
            raise StartupError(f"the lock the driver's instances share: {e}") from None
        # Prepare knows the cores whatever gets published: a core device only reaches a claim once published.
        self.state = DriverState(host=self.host, host_root=self.host_root, driver_name=o.driver_name,
                                 pool_name=o.node_name, cdi=CdiStore(o.cdi_root, o.driver_name),
                                 checkpoint=Checkpoint(o.checkpoint_path), lookup=self.lookup, crash=self.crash,
                                 metrics=self.metrics, cores=layout, instance_lock=self.instance_lock)
        try:
            self.state.load()
            self.state.reconcile_local()
        except (CheckpointError, OSError) as e:
            raise StartupError(str(e)) from None
        self.health_monitor = HealthMonitor(self.host_root, [d.index for d in self.host.devices],
                                            o.health_poll_interval)
        self.health_stream = HealthStreamService(self.health_monitor, self.host, o.node_name, self.stop_event,
                                                 cores_per_device=layout.logical_per_device)
        self.health_reporter = HealthReporter(self.health_monitor, self.host, o.node_name, o.driver_name,
                                              o.unhealthy_taint_effect, self.api, self.metrics)
        if self.metrics is not None:  # who holds which devices: read from the state at every scrape
            from neuron_dra.driver.daemon.consumers import ConsumerRefresher

            pods = ConsumerRefresher(self.state.prepared, self.lookup)  # pods joining shared claims later
            pods.start(self.stop_event)
            self.metrics.attribute(self.state.prepared, o.node_name, [d.index for d in self.host.devices], layout,
                                   self.health_reporter.taints, pods.current)
        report = self.health_reporter.in_background(self.stop_event)
        report(self.health_monitor.current())  # devices already unhealthy at start (events, metrics)
        self.health_monitor.add_listener(report)
        self.servers.serve(self.state, self.health_stream.methods())
        if o.healthcheck_port:
            from neuron_dra.driver.daemon.health import HealthServer

            self.health = HealthServer(o.sockets, o.bind_address, o.healthcheck_port,
                                       registered=self.servers.registration.registered, loop=self.loop)
            self.health.start()
        if o.metrics_port and self.metrics is not None:
            self.metrics_server = self.metrics.serve(o.bind_address, o.metrics_port)
            log.info("metrics listening", extra={"port": self.metrics_server.port})
        if self.api is not None:
            from neuron_dra.driver.daemon.publisher import SlicePublisher
            from neuron_dra.driver.model.slices import PublishOptions

            cores = None if o.core_partitions == "off" else layout
            if cores is None:
                log.info("publishing whole Neuron devices only, no NeuronCores", extra={
                    "node": o.node_name, "reason": o.core_partitions_reason or "--core-partitions=off"})
            self.publisher = SlicePublisher(self.api, self.host, o.node_name,
                                            PublishOptions(driver_name=o.driver_name, cores=cores), self.metrics,
                                            taints=self.health_reporter.taints,
                                            force_cores=o.core_partitions == "on")
            self.health_reporter.republish = self.publisher.refresh
            self.publisher.start(self.stop_event)
        else:
            log.warning("no API client: not publishing ResourceSlices")
        self.health_monitor.start(self.stop_event)
        self.watch_for_unshared_instance()

    def _wait_for_unshared_instance(self) -> None:
        """With names of its own, wait until nothing listens on the plain names: an instance there (the previous
        release, or one on plain names) neither takes the instances' lock nor refreshes its state, so both must
        not change the checkpoint. kubelet calls this instance meanwhile (the newest registered); those calls
        wait until `serve`, and the DaemonSet stops the other pod once this one is Ready (registered)."""
        o = self.options
        if not o.instance:
            return
        from neuron_dra.driver.daemon.sockets import SocketPaths, is_listening

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
        from neuron_dra.driver.daemon.checkpoint import CheckpointError
        from neuron_dra.driver.daemon.claims import ClaimError
        from neuron_dra.driver.daemon.sockets import SocketPaths, is_listening

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
        from neuron_dra.driver.daemon import memory
        from neuron_dra.driver.daemon.claims import ClaimError

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
    from neuron_dra.driver.daemon.plugin import PluginServers

    servers = PluginServers(options.sockets, options.driver_name, extra_services=HEALTH_SERVICES, loop=loop)
    try:
        servers.listen()
    except (SocketError, OSError) as e:
        servers.stop(0)
        raise StartupError(str(e)) from None
    return servers


def run_daemon(options: DaemonOptions, lookup: ClaimLookup, api: ApiClient | None,
               crash: CrashPoints | None = None, servers: PluginServers | None = None,
               loop: EventLoopThread | None = None) -> int:
    """Run until SIGTERM/SIGINT (from the main thread). Exit code 0 on a clean stop, 1 when start-up fails."""
    from neuron_dra.driver.daemon import memory

    memory.limit_arenas()  # before threads allocate (main applied it before the registration server's threads)
    daemon = Daemon(options, lookup, api, crash, servers=servers, loop=loop)
    set_on_signals(daemon.stop_event)
    try:
        daemon.start()
    except StartupError as e:
        log.error("start-up failed", extra={"error": str(e)})
        daemon.stop()
        return 1
    except Exception as e:  # a fault no check above names: still the one line operators look for, and exit 1
        log.exception("start-up failed", extra={"error": f"unexpected {capped(repr(e))}"})
        daemon.stop()
        return 1
    try:
        daemon.run()
    finally:
        daemon.stop()
    return 0


def start_early(options: DaemonOptions, loop: EventLoopThread) -> PluginServers | None:
    """Both sockets listening and the registration socket answered before the daemon imports the rest of itself
    (the API client, discovery, the checkpoint), so kubelet finds and registers the driver at once; DRA calls wait
    until the state is loaded (plugin.py). None when listening fails (the daemon's start then fails with the
    reason)."""
    from neuron_dra.driver.daemon import memory

    memory.limit_arenas()  # before the gRPC servers' threads
    try:
        return listen(options, loop)
    except StartupError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv, os.environ)
    logs.configure(options.log_level)
    # The socket names may depend on the kubelet's version, read from the Node: then the API client comes first.
    asks = options.socket_names == "auto" and bool(options.pod_uid)
    from neuron_dra.driver.daemon import memory
    from neuron_dra.driver.daemon.grpcserver import EventLoopThread

    memory.limit_arenas()  # before the loop thread allocates
    loop = EventLoopThread()  # the daemon's from run_daemon on
    servers = None if asks else start_early(with_socket_names(options, None), loop)
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.daemon.kube import ClientOptions, KubeClaimLookup, api_client
    from neuron_dra.driver.daemon.kubeconfig import KubeConfigError
    from neuron_dra.driver.daemon.ratelimit import Rate

    try:
        crash = CrashPoints.from_env(os.environ)
        api = api_client(options.kubeconfig, ClientOptions(Rate(options.kube_api_qps, options.kube_api_burst),
                                                           options.kube_api_timeout))
    except (ValueError, KubeConfigError) as e:
        log.error("start-up failed", extra={"error": str(e)})
        if servers is not None:
            servers.stop(0)
        loop.close()
        return 2
    options = with_core_partitions(with_socket_names(options, api if asks else None), api)
    if asks:
        servers = start_early(options, loop)
    return run_daemon(options, KubeClaimLookup(api), api, crash, servers, loop)


if __name__ == "__main__":
    sys.exit(main())
