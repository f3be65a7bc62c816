"""The UltraServer group controller of a local cluster (docs/ultraserver.md §3, docs/local-cluster.md): the objects
of `driver/deploy/ultraserver.py` (service account, RBAC, the admission policy that keeps it to group slices, the
group DeviceClass) applied as they are, and the controller itself (`python -m neuron_dra.driver.groups`) as a host
process under that service account's token, restarted when it exits, like the other control-plane-side processes.
The Deployment is not applied: the fake runtime runs no pods, so with either runtime the controller runs on the host
and reaches the API server on loopback, one way for both (on containerd nodes the Deployment does run as a pod, as
the Helm chart's end-to-end test shows: tests/e2e/test_e2e_helm.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from neuron_dra.driver.deploy.ultraserver import UltraServerControllerOptions, manifests
from neuron_dra.localcluster.controlplane.apply import apply_all
from neuron_dra.localcluster.controlplane.plane import ControlPlane
from neuron_dra.localcluster.processes import procs
from neuron_dra.localcluster.processes.restarting import Restarting

IDENTITY = "localcluster"  # the controller's name in its Lease
RESYNC_SECONDS = 10  # a released claim is noticed on a pass; a small cluster affords a short period


@dataclass(frozen=True)
class GroupControllerPaths:
    """Under DIR/ultraserver: its kubeconfig, log and pid file (`cluster down` stops what a pid file names)."""

    base: Path

    @classmethod
    def of(cls, cluster_dir: Path) -> GroupControllerPaths:
        return cls(cluster_dir / "ultraserver")

    @property
    def kubeconfig(self) -> Path:
        return self.base / "controller.kubeconfig"

    @property
    def log(self) -> Path:
        return self.base / "controller.log"

    @property
    def pids(self) -> Path:
        return self.base / "pids"

    @property
    def pid_file(self) -> Path:
        return self.pids / "controller.pid"


def controller_options(driver_name: str, namespace: str) -> UltraServerControllerOptions:
    # Shared counters on: a local cluster has a handful of nodes, far below where their scheduling cost bites
    # (docs/ultraserver.md §2a), and its end-to-end tests show the whole and a half excluding each other.
    return UltraServerControllerOptions(driver_name=driver_name, namespace=namespace, resync_seconds=RESYNC_SECONDS,
                                        shared_counters="auto")


def controller_objects(options: UltraServerControllerOptions) -> list[dict[str, Any]]:
    """What `neuron-dra plan` creates for the controller, minus its Deployment (the supervisor runs it)."""
    return [o for o in manifests(options) if o["kind"] != "Deployment"]


def controller_argv(options: UltraServerControllerOptions, kubeconfig: Path) -> list[str]:
    return [sys.executable, "-m", "neuron_dra.driver.groups", f"--driver-name={options.driver_name}",
            f"--namespace={options.namespace}", f"--lease-name={options.name}", f"--identity={IDENTITY}",
            f"--taint-effect={options.taint_effect}", f"--resync-seconds={options.resync_seconds}",
            f"--shared-counters={options.shared_counters}",
            f"--kubeconfig={kubeconfig}"]


class LocalGroupController:
    """Applies the controller's objects and runs it until `stop()` or the cluster's deadline."""

    def __init__(self, cluster_dir: Path, api: client.ApiClient, control_plane: ControlPlane, driver_name: str,
                 namespace: str, deadline: float, token_lifetime_s: int) -> None:
        self.paths = GroupControllerPaths.of(cluster_dir)
        self.api = api
        self.control_plane = control_plane
        self.options = controller_options(driver_name, namespace)
        self.deadline = deadline
        self.token_lifetime_s = token_lifetime_s
        self.process: Restarting | None = None

    def start(self) -> None:
        o, p = self.options, self.paths
        apply_all(self.api, controller_objects(o))  # after the driver's objects: its namespace exists
        p.pids.mkdir(parents=True, exist_ok=True)
        token = self.control_plane.service_account_token(o.namespace, o.name, expiration_s=self.token_lifetime_s,
                                                         create=False)
        self.control_plane.token_kubeconfig(token, o.service_account_user, p.kubeconfig)
        p.kubeconfig.chmod(0o600)
        argv = controller_argv(o, p.kubeconfig)
        self.process = Restarting("ultraserver-controller",
                                  lambda life: procs.spawn(argv, log=p.log, pid_file=p.pid_file, lifetime_s=life),
                                  p.pid_file, self.deadline)
        self.process.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
