"""The daemon's options: its flags, their fallbacks to the environment of AWS's Helm chart (NODE_NAME,
KUBELET_PLUGINS_DIRECTORY_PATH, KUBELET_REGISTRAR_DIRECTORY_PATH, CDI_ROOT, HEALTHCHECK_PORT), and what start-up
resolves against the API server (the socket names, `--core-partitions auto`)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from neuron_dra.driver import kubeletplugin
from neuron_dra.driver.errortext import capped, shown
from neuron_dra.driver.kubeletplugin import toolkit
from neuron_dra.driver.kubeletplugin.toolkit import (
    DAEMON_BURST,
    DAEMON_QPS,
    SOCKET_NAME_MODES,
    InstanceError,
    SocketPaths,
    check_pod_uid,
    decide,
    kubelet_minor,
)
from neuron_dra.driver.model.errors import NotAllowed
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
    HEALTH_SERVICES,
    PLUGINS_DIR_ENV,
    REGISTRY_DIR_ENV,
    TAINT_EFFECTS,
    check_driver_name,
    is_dns_subdomain,
)
from neuron_dra.driver.model.version import VERSION

# The API client is the layer's, imported once used (after the sockets are bound; main.py).
if TYPE_CHECKING:
    from neuron_dra.driver.kubeletplugin.toolkit import ApiClient

log = logging.getLogger(__name__)

# On SIGTERM, seconds the DRA calls already running get to finish (the DaemonSet's grace period is 30 s).
DRAIN_SECONDS = 20.0
# On SIGTERM that is no hand-over, seconds to delete the node's slices in, before the drain (docs/upgrades.md):
# with DRAIN_SECONDS within the grace period.
WITHDRAW_SECONDS = 5.0


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
    # Where kubelet's probe comes from (the node's own addresses): the health port's lane of their own
    # (docs/hardening.md §1); empty: one lane for every peer.
    node_addresses: tuple[str, ...] = ()
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
    withdraw_seconds: float = WITHDRAW_SECONDS

    @property
    def sockets(self) -> SocketPaths:
        return SocketPaths.for_driver(self.plugins_dir, self.registry_dir, self.driver_name, self.instance)

    @property
    def plugin(self) -> kubeletplugin.Options:
        """What the kubelet plugin helper listens as (the health stream served beside the DRA service)."""
        return kubeletplugin.Options(self.driver_name, self.plugins_dir, self.registry_dir, self.instance,
                                     extra_services=HEALTH_SERVICES)

    @property
    def checkpoint_path(self) -> Path:
        return self.plugins_dir / self.driver_name / CHECKPOINT_FILE


def _bounded(kind: type[float] | type[int], low: float, high: float, what: str, allowed: str = "",
             out_of_range: str = "{value}: allowed {allowed}") -> Callable[[str], float]:
    """A flag's parser: `kind` from `low` to `high`; errors name the value, `what` it must be and what is allowed."""
    allowed = allowed or f"{low:g} to {high:g}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} ({allowed})") from e
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(out_of_range.format(value=value, allowed=allowed))
        return value

    return parse


_port = _bounded(int, 0, 65535, "a port number", "0 = off, or 1-65535", "{value} is not a port number ({allowed})")


def _driver_name(text: str) -> str:
    try:  # the one driver-name check (deploy.DriverName runs it for the pydantic models)
        return check_driver_name("--driver-name", text)
    except NotAllowed as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: {e.allowed}, e.g. "
                                         f"{DEFAULT_DRIVER_NAME}") from e


def _node_name(text: str) -> str:
    if not is_dns_subdomain(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a node name; allowed: {DNS_SUBDOMAIN_RULE}")
    return text


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address (the pod's IP, e.g. from the downward API "
                                         "status.podIP, or 127.0.0.1)") from e


def _addresses(text: str) -> tuple[str, ...]:
    """Comma-separated IP addresses ("": none)."""
    try:
        return tuple(str(ipaddress.ip_address(a.strip())) for a in text.split(",") if a.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of IP addresses (the node's, e.g. "
                                         "from the downward API status.hostIP)") from e


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

    def flag(name: str, variable: str, default: str | None, text: str, **kw: Any) -> None:
        """A flag whose default is env `variable`, else `default`; its help names both."""
        shown = f" (default {default})" if default else ""
        p.add_argument(name, default=env_default(variable, default), help=f"{text} [env {variable}]{shown}".lstrip(),
                       **kw)

    flag("--node-name", "NODE_NAME", None, "this node (and pool) name", type=_node_name, metavar="NAME")
    p.add_argument("--driver-name", type=_driver_name, default=DEFAULT_DRIVER_NAME, metavar="NAME",
                   help=f"DRA driver name (default {DEFAULT_DRIVER_NAME})")
    flag("--plugins-dir", PLUGINS_DIR_ENV, DEFAULT_PLUGINS_DIR, "kubelet plugins dir", type=_abs_dir, metavar="DIR")
    flag("--registry-dir", REGISTRY_DIR_ENV, DEFAULT_REGISTRY_DIR, "kubelet plugin registry dir", type=_abs_dir,
         metavar="DIR")
    flag("--cdi-root", "CDI_ROOT", DEFAULT_CDI_ROOT, "CDI spec dir", type=_abs_dir, metavar="DIR")
    flag("--healthcheck-port", "HEALTHCHECK_PORT", "0", "gRPC health port, service 'liveness'; 0 = off", type=_port,
         metavar="PORT")
    flag("--metrics-port", "METRICS_PORT", "0", "Prometheus /metrics port; 0 = off", type=_port, metavar="PORT")
    p.add_argument("--bind-address", default=env_default("BIND_ADDRESS", env_default("POD_IP", "127.0.0.1")),
                   type=_address, metavar="ADDR",
                   help="the one address of the health and metrics ports, where kubelet's probe connects "
                        "[env BIND_ADDRESS, else env POD_IP (the downward API's status.podIP; the node's IP "
                        "with hostNetwork)] (default 127.0.0.1)")
    p.add_argument("--node-address", dest="node_addresses", default=_addresses(env_default("HOST_IP", "") or ""),
                   type=_addresses, metavar="ADDRS",
                   help="the node's own addresses, comma-separated, where kubelet's probe comes from: the health "
                        "port keeps a lane of its own for them, so a flood from elsewhere cannot starve the probe "
                        "[env HOST_IP (the downward API's status.hostIP)] (default none: one lane)")
    p.add_argument("--kubeconfig", default=None, metavar="FILE", help="kubeconfig file (default: in-cluster)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--host-root", type=_abs_dir, metavar="DIR",
                     help="root of the host's /sys and /dev as mounted in the container (default /)")
    src.add_argument("--emulate", metavar="INSTANCE_TYPE",
                     help="emulate this instance type (of the catalog) in a temporary host tree (for local clusters "
                          "and tests)")
    flag("--catalog", CATALOG_ENV, None, "catalog file with more instance types (docs/catalog-file.md)", type=Path,
         metavar="FILE")
    flag("--health-poll-interval", "HEALTH_POLL_INTERVAL", "1",
         "seconds between reads of the devices' hardware error counters", metavar="SECONDS",
         type=_bounded(float, 0.05, 60, "a number of seconds", out_of_range="{value} seconds: allowed {allowed}"))
    flag("--unhealthy-taint-effect", "UNHEALTHY_TAINT_EFFECT", DEFAULT_TAINT_EFFECT,
         "effect of the taint on unhealthy devices", choices=TAINT_EFFECTS)
    flag("--log-level", "LOG_LEVEL", "info", "", choices=["debug", "info", "warning", "error"])
    flag("--core-partitions", "CORE_PARTITIONS", "auto",
         "publish NeuronCores with counters beside whole devices: auto (where the API server is Kubernetes "
         f"1.{COUNTERS_PER_NODE_MINOR}+, whose scheduler keeps each node's counters to that node, and keeps "
         "ResourceSlice sharedCounters; on 1.36 a claim pod's scheduler CPU grows with nodes squared), on, off",
         choices=CORE_PARTITION_MODES)
    p.add_argument("--lnc", type=_lnc, default=env_default("NODE_LNC", None), metavar="1|2",
                   help="the node's Logical NeuronCore config (env NODE_LNC; default: the host's "
                        "/opt/aws/neuron/logical_nc_config, else 2 on Trainium2+)")
    flag("--kube-api-qps", "KUBE_API_QPS", f"{DAEMON_QPS:g}", "API requests per second, sustained (kubelet's default)",
         type=_bounded(float, 0.1, 1000, "a number of requests per second"), metavar="QPS")
    flag("--kube-api-burst", "KUBE_API_BURST", str(DAEMON_BURST),
         "API requests allowed at once above the QPS (kubelet's default)",
         type=_bounded(int, 1, 1000, "a whole number of requests"), metavar="N")
    flag("--kube-api-timeout", "KUBE_API_TIMEOUT", "10",
         "deadline of one API request, the whole answer included; kubelet gives a prepare 45 s",
         type=_bounded(float, 0.5, 40, "a number of seconds"), metavar="SECONDS")
    flag("--pod-uid", "POD_UID", "", "this pod's UID (downward API metadata.uid) for socket names of its own",
         metavar="UID")
    flag("--socket-names", "SOCKET_NAMES", "auto", "auto: per instance when there is a pod UID and the node's "
         "kubelet is 1.33+, else plain; per-instance; plain (docs/upgrades.md)", choices=SOCKET_NAME_MODES)
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
    return DaemonOptions(**vars(a) | {"host_root": host_root, "pod_uid": pod_uid})


# Each read of the API server at start-up (the kubelet's version for the socket names, the API server's for
# `--core-partitions auto`) gets at most this long, whatever --kube-api-timeout says: the registration socket
# waits for the first and kubelet's probe for both, so a slow or dripping API server must not keep them closed
# (issue 42: 20-80 s). Both run at once; a healthy API server answers in milliseconds.
STARTUP_READ_SECONDS = 3.0
MAX_VERSION_CHARS = 256  # a version string is short: a longer "version" is not one


@dataclass(frozen=True)
class Read:
    """One string read from the API server: its value, or None and why not."""

    value: str | None
    error: str = ""


def read_string(api: ApiClient, path: str, keys: tuple[str, ...], seconds: float) -> Read:
    """The short string at `keys` in the answer to GET `path`. Never raises: whatever the answer is (an error,
    garbage, nested past the recursion limit, huge, dripping past the deadline), a failure is a Read with the
    reason, so nothing the API server says can end start-up (issue 42 item 2)."""
    where = ".".join(keys)
    try:
        value: object = toolkit.KubeApi(api).call("GET", path, seconds=seconds)
    except (toolkit.ApiException, toolkit.ApiClientError) as e:
        return Read(None, capped(str(e)))
    except Exception as e:  # anything else the answer provoked: the same, never a traceback
        return Read(None, f"GET {path}: {capped(f'{type(e).__name__}: {e}')}")
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str):
        return Read(None, f"GET {path}: {where} is {shown(value)}, not a string")
    if len(value) > MAX_VERSION_CHARS:
        return Read(None, f"GET {path}: {where} {shown(value)} is not a version (over {MAX_VERSION_CHARS} "
                          "characters)")
    return Read(value)


def kubelet_version(api: ApiClient, node_name: str, seconds: float) -> Read:
    """The node's kubelet version as the Node reports it (status.nodeInfo.kubeletVersion)."""
    return read_string(api, f"/api/v1/nodes/{quote(node_name, safe='')}", ("status", "nodeInfo", "kubeletVersion"),
                       seconds)


def server_version(api: ApiClient, seconds: float) -> Read:
    """The API server's version (GET /version, gitVersion: `v1.36.5`, `v1.37.1-eks-...`)."""
    return read_string(api, "/version", ("gitVersion",), seconds)


def decide_core_partitions(mode: str, version: Callable[[], str | None]) -> tuple[str, str]:
    """`--core-partitions` resolved to on, off or auto (publish NeuronCores if the API server keeps counters:
    the publisher's probe), with the reason; `version` (the API server's) is asked only for auto."""
    if mode != "auto":
        return mode, f"--core-partitions={mode}"
    seen = version()
    parsed = None if seen is None else kubelet_minor(seen)  # digits bounded: int() refuses over 4,300
    if seen is None or parsed is None:
        return "off", (f"the API server's version is unknown ({shown(seen)}): whole devices only, which never slow "
                       "the scheduler (--core-partitions on publishes NeuronCores)")
    if parsed < (1, COUNTERS_PER_NODE_MINOR):
        return "off", (f"the API server is {seen}: its scheduler reads every node's counter slices on each node "
                       f"(kubernetes#138917, fixed in 1.{COUNTERS_PER_NODE_MINOR}), so NeuronCores with counters make "
                       "every claim pod's scheduling cost grow with nodes squared (--core-partitions on publishes "
                       "them anyway)")
    return "auto", f"the API server is {seen}"


def with_api_facts(options: DaemonOptions, api: ApiClient | None, names: bool = True,
                   partitions: bool = True) -> DaemonOptions:
    """`options` with what start-up resolves against the API server: the socket names (`names`: the instance id,
    instances.py) and `--core-partitions auto` (`partitions`). Only the reads that decide are made, both at once,
    each within STARTUP_READ_SECONDS (and --kube-api-timeout); whatever could not be read is unknown (the plain
    socket names, no NeuronCore counters), said in one warning. Never raises for anything the API server
    answers."""
    seconds = min(STARTUP_READ_SECONDS, options.kube_api_timeout)
    reads: dict[str, Callable[[], Read]] = {}
    if api is not None and names and options.socket_names == "auto" and options.pod_uid:
        reads["kubelet_version"] = lambda: kubelet_version(api, options.node_name, seconds)
    if api is not None and partitions and options.core_partitions == "auto":
        reads["server_version"] = lambda: server_version(api, seconds)
    got = _read_at_once(reads, seconds + 2.0)
    failed = {f"{what}_error": r.error for what, r in got.items() if r.value is None}
    if failed:
        log.warning("cannot read from the API server at start-up; going on without it (the plain socket names, "
                    "whole devices only)", extra={"node": options.node_name, **failed})
    if names:
        known = got.get("kubelet_version")
        naming = decide(options.socket_names, options.pod_uid, lambda: None if known is None else known.value)
        log.info("socket names chosen", extra={"instance": naming.instance or "(plain names)",
                                               "reason": naming.reason})
        options = replace(options, instance=naming.instance)
    if partitions:
        seen = got.get("server_version")
        mode, reason = decide_core_partitions(options.core_partitions, lambda: None if seen is None else seen.value)
        options = replace(options, core_partitions=mode, core_partitions_reason=reason)
    return options


def _read_at_once(reads: Mapping[str, Callable[[], Read]], seconds: float) -> dict[str, Read]:
    """Each read in a thread of its own, all waited for at most `seconds` together (a read's own deadline ends it
    sooner; one that has not ended, e.g. in a name lookup no deadline covers, counts as failed and is left)."""
    got: dict[str, Read] = {}
    threads = []
    for what, read in reads.items():
        def run(what: str = what, read: Callable[[], Read] = read) -> None:
            got[what] = read()

        thread = threading.Thread(target=run, name=f"startup-read-{what}", daemon=True)
        thread.start()
        threads.append(thread)
    until = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, until - time.monotonic()))
    return {what: got.get(what) or Read(None, f"no answer within {seconds:g} s") for what in reads}


def with_core_partitions(options: DaemonOptions, api: ApiClient | None) -> DaemonOptions:
    """`options` with `--core-partitions auto` resolved against the API server's version (once, at start)."""
    return with_api_facts(options, api, names=False)


def with_socket_names(options: DaemonOptions, api: ApiClient | None) -> DaemonOptions:
    """`options` with the instance id chosen (instances.py); asks the API server only when that decides."""
    return with_api_facts(options, api, partitions=False)
