"""`neuron-dra-driver` (also `python -m neuron_dra.driver`): the DRA kubelet plugin daemon of one node.

Flags fall back to the environment variables of AWS's Helm chart (NODE_NAME, KUBELET_PLUGINS_DIRECTORY_PATH,
KUBELET_REGISTRAR_DIRECTORY_PATH, CDI_ROOT, HEALTHCHECK_PORT), so the daemon is a drop-in for its DaemonSet.
Start-up: discover the host, load the checkpoint, rewrite CDI specs and clean up after a crash, serve the
DRA socket and then the registration socket, then health, metrics and slice publishing. SIGTERM/SIGINT
stop it cleanly (registration socket first). An unreachable API server never stops it: publishing retries
with backoff and prepares fail per claim until the server answers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from neuron_dra.driver.daemon.driver import Daemon, StartupError, listen
from neuron_dra.driver.daemon.options import DaemonOptions, parse_options, with_core_partitions, with_socket_names
from neuron_dra.driver.errortext import capped
from neuron_dra.driver.kubeletplugin import _logs as logs
from neuron_dra.driver.kubeletplugin._signals import set_on_signals

# Imported in the functions that use them, after the sockets are bound (start-up time: comments in `main`).
if TYPE_CHECKING:
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.kubeletplugin._claimref import ClaimLookup
    from neuron_dra.driver.kubeletplugin._grpcserver import EventLoopThread
    from neuron_dra.driver.kubeletplugin._kube import ApiClient
    from neuron_dra.driver.kubeletplugin._plugin import PluginServers

log = logging.getLogger(__name__)


def run_daemon(options: DaemonOptions, lookup: ClaimLookup, api: ApiClient | None,
               crash: CrashPoints | None = None, servers: PluginServers | None = None,
               loop: EventLoopThread | None = None) -> int:
    """Run until SIGTERM/SIGINT (from the main thread). Exit code 0 on a clean stop, 1 when start-up fails."""
    from neuron_dra.driver.kubeletplugin import _memory as memory

    memory.limit_arenas()  # before threads allocate (main applied it before the registration server's threads)
    daemon = Daemon(options, lookup, api, crash, servers=servers, loop=loop)
    set_on_signals(daemon.stop_event)
    try:
        daemon.start()
    except Exception as e:  # a fault no StartupError names (with its traceback): still the one line, and exit 1
        named = isinstance(e, StartupError)
        log.error("start-up failed", exc_info=not named,
                  extra={"error": str(e) if named else f"unexpected {capped(repr(e))}"})
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
    from neuron_dra.driver.kubeletplugin import _memory as memory

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
    from neuron_dra.driver.kubeletplugin import _memory as memory
    from neuron_dra.driver.kubeletplugin._grpcserver import EventLoopThread

    memory.limit_arenas()  # before the loop thread allocates
    loop = EventLoopThread()  # the daemon's from run_daemon on
    servers = None if asks else start_early(with_socket_names(options, None), loop)
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.kubeletplugin._kube import ClientOptions, KubeClaimLookup, api_client
    from neuron_dra.driver.kubeletplugin._kubeconfig import KubeConfigError
    from neuron_dra.driver.kubeletplugin._ratelimit import Rate

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
