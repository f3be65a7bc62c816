"""`python -m neuron_dra.driver.groups`: the UltraServer group controller's entry (flags, logs, signals, the
leader election thread, the watches and the pass loop). Exit status 0 after SIGTERM/SIGINT (the Lease released),
2 for bad flags or an unusable kubeconfig."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence

from neuron_dra.driver.groups.controller import SHARED_COUNTERS, ControllerOptions, GroupController
from neuron_dra.driver.groups.lease import LeaderElector, LeaseOptions
from neuron_dra.driver.kubeletplugin.toolkit import (
    KubeApi,
    KubeConfigError,
    api_client,
    configure_logs,
    set_on_signals,
)
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME, TAINT_EFFECTS, check_dns_label, check_driver_name

log = logging.getLogger(__name__)
DEFAULT_LEASE = "neuron-dra-ultraserver"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m neuron_dra.driver.groups",
                                description="Publish each UltraServer as one group device (docs/ultraserver.md).")
    p.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "neuron-dra-driver"),
                   help="namespace of the Lease (default: $POD_NAMESPACE)")
    p.add_argument("--lease-name", default=DEFAULT_LEASE)
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="this replica's name in the Lease (default: $POD_NAME)")
    p.add_argument("--kubeconfig", default=None, help="default: the in-cluster service account")
    p.add_argument("--resync-seconds", type=float, default=60.0)
    p.add_argument("--taint-effect", default="NoSchedule", choices=TAINT_EFFECTS)
    p.add_argument("--shared-counters", default="off", choices=SHARED_COUNTERS,
                   help="auto: keep a 4-node UltraServer's whole and halves apart with shared counters where the "
                        "API server serves them (1.36+); off (default): never (each counter slice costs every DRA "
                        "pod's scheduling a scan of all slices, a cost that grows faster than the cluster: "
                        "docs/ultraserver.md §2a)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logs(args.log_level)
    try:
        driver = check_driver_name("--driver-name", args.driver_name)
        namespace = check_dns_label("--namespace", args.namespace)
        lease = LeaseOptions(namespace, check_dns_label("--lease-name", args.lease_name), args.identity)
        options = ControllerOptions(driver, resync=args.resync_seconds, taint_effect=args.taint_effect,
                                    shared_counters=args.shared_counters)
        api = KubeApi(api_client(args.kubeconfig))
    except (ValueError, KubeConfigError, OSError) as e:
        print(f"neuron-dra ultraserver controller: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    set_on_signals(stop)
    elector = LeaderElector(api, lease)
    controller = GroupController(api, options)
    election = threading.Thread(target=elector.run, args=(stop,), name="lease", daemon=True)
    election.start()
    controller.start_watches(stop)
    log.info("UltraServer group controller started", extra={"driver": driver, "identity": lease.identity})
    controller.run(stop, elector.leading)
    election.join(timeout=lease.renew_deadline)
    return 0
