"""`neuron-dra-driver` (also `python -m neuron_dra.driver`): the DRA kubelet plugin daemon of one node.

Flags fall back to the environment variables of AWS's Helm chart (NODE_NAME, KUBELET_PLUGINS_DIRECTORY_PATH,
KUBELET_REGISTRAR_DIRECTORY_PATH, CDI_ROOT, HEALTHCHECK_PORT), so the daemon is a drop-in for its DaemonSet.
Start-up: discover the host, load the checkpoint, rewrite CDI specs and clean up after a crash, serve the
DRA socket and then the registration socket, then health, metrics and slice publishing. SIGTERM/SIGINT
stop it cleanly: the node's slices withdrawn unless another instance takes over (docs/upgrades.md, "A clean
stop"), then the registration socket. Nothing the API server answers at start stops it (what cannot be read is
unknown, with one warning), and an unreachable API server never does: publishing retries with backoff and
prepares fail per claim until the server answers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from neuron_dra.driver import kubeletplugin
from neuron_dra.driver.daemon.options import DaemonOptions, parse_options, with_api_facts, with_socket_names
from neuron_dra.driver.errortext import capped
from neuron_dra.driver.kubeletplugin import toolkit

# The one lazy-import boundary of the daemon: the rest of it (daemon/driver.py and what it imports: the claims
# model, discovery, the checkpoint, device health) and the API client are imported below once the sockets listen,
# so kubelet, which gives GetInfo 1 s, registers the driver at once (tests/driver/daemon/test_image.py).
if TYPE_CHECKING:
    from neuron_dra.driver.daemon.failpoints import CrashPoints
    from neuron_dra.driver.kubeletplugin import ClaimLookup, Helper
    from neuron_dra.driver.kubeletplugin.toolkit import ApiClient, EventLoopThread

log = logging.getLogger(__name__)


def run_daemon(options: DaemonOptions, lookup: ClaimLookup, api: ApiClient | None,
               crash: CrashPoints | None = None, helper: Helper | None = None,
               loop: EventLoopThread | None = None) -> int:
    """Run until SIGTERM/SIGINT (from the main thread). Exit code 0 on a clean stop, 1 when start-up fails."""
    toolkit.limit_arenas()  # before threads allocate (main applied it before the registration server's)
    from neuron_dra.driver.daemon.driver import Daemon, StartupError

    metrics = None
    if options.metrics_port:  # prometheus_client only when metrics are served (the default is off): 0.6 MiB less
        from neuron_dra.driver.daemon.observability.metrics import Metrics

        metrics = Metrics()
    daemon = Daemon(options, lookup, api, crash, metrics, helper=helper, loop=loop)
    toolkit.set_on_signals(daemon.stop_event)
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


def start_early(options: DaemonOptions, loop: EventLoopThread) -> Helper | None:
    """Both sockets listening and the registration socket answered before the daemon imports the rest of itself
    (the API client, discovery, the checkpoint), so kubelet finds and registers the driver at once; DRA calls wait
    until the state is loaded (kubeletplugin.start). None when listening fails (the daemon's start then fails with
    the reason)."""
    toolkit.limit_arenas()  # before the gRPC servers' threads
    try:
        return kubeletplugin.start(None, options.plugin, loop)
    except (kubeletplugin.SocketError, OSError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv, os.environ)
    toolkit.configure_logs(options.log_level)
    # The socket names may depend on the kubelet's version, read from the Node: then the API client comes first,
    # and that read is short (options.STARTUP_READ_SECONDS) so the sockets still listen in time.
    asks = options.socket_names == "auto" and bool(options.pod_uid)
    toolkit.limit_arenas()  # before the loop thread allocates
    loop = toolkit.EventLoopThread()  # the daemon's from run_daemon on
    helper: Helper | None = None
    try:
        if not asks:
            options = with_socket_names(options, None)
            helper = start_early(options, loop)
        from neuron_dra.driver.daemon.failpoints import CrashPoints

        try:
            crash = CrashPoints.from_env(os.environ)
            api = toolkit.api_client(options.kubeconfig, toolkit.ClientOptions(
                toolkit.Rate(options.kube_api_qps, options.kube_api_burst), options.kube_api_timeout))
        except (ValueError, toolkit.KubeConfigError) as e:
            log.error("start-up failed", extra={"error": str(e)})
            _close(helper, loop)
            return 2
        # Never raises for what the API server answers: what cannot be read is unknown, with one warning.
        options = with_api_facts(options, api, names=asks)
        if asks:
            helper = start_early(options, loop)
    except toolkit.InstanceError as e:  # --socket-names per-instance without a pod UID
        log.error("start-up failed", extra={"error": str(e)})
        _close(helper, loop)
        return 2
    except Exception as e:  # a fault nothing above names: still the one line (with its traceback), and exit 1
        log.error("start-up failed", exc_info=True, extra={"error": f"unexpected {capped(repr(e))}"})
        _close(helper, loop)
        return 1
    return run_daemon(options, toolkit.KubeClaimLookup(api), api, crash, helper, loop)


def _close(helper: Helper | None, loop: EventLoopThread) -> None:
    if helper is not None:
        helper.close()
    loop.close()


if __name__ == "__main__":
    sys.exit(main())
