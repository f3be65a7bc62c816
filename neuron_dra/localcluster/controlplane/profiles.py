"""Control-plane profiles: the client rate limits and concurrency of the local control plane's components.

`default` runs every component with its upstream defaults. `tuned` raises what caps claim pods per second at
1,000 nodes (docs/scale.md §3 names each setting, its default and its upstream source):
- kube-controller-manager `--kube-api-qps/--kube-api-burst` (default 20/30): its resourceclaim controller makes
  two writes per claim pod (the claim, the pod's status), so the default caps pods at about 10/s;
- kube-scheduler `clientConnection.qps/burst` in its KubeSchedulerConfiguration (default 50/100): a claim pod
  costs it a claim status write and a binding;
- kube-scheduler `percentageOfNodesToScore` (default adaptive: 50 - nodes/125 percent, at least 5 %): it stops
  filtering a pod once it found that share of feasible nodes (never fewer than 100), and a claim pod's filter
  work is per node (the DRA plugin's allocator on each), so 10 % filters 100 of 1,000 nodes instead of 420;
- kube-apiserver `--max-requests-inflight/--max-mutating-requests-inflight` (default 400/200): headroom for the
  two clients' higher rates;
- kube-controller-manager `--concurrent-resourceclaim-syncs` (default 50) is kept: it does not limit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class ControlPlaneProfile:
    """Extra flags per component and the scheduler's client limits (None: its defaults, no config file)."""

    name: str
    apiserver_args: tuple[str, ...] = ()
    controller_manager_args: tuple[str, ...] = ()
    scheduler_qps: float | None = None
    scheduler_burst: int | None = None
    percentage_of_nodes_to_score: int | None = None  # None: the scheduler's adaptive default

    @property
    def scheduler_configured(self) -> bool:
        return any(v is not None for v in (self.scheduler_qps, self.scheduler_burst,
                                           self.percentage_of_nodes_to_score))


TUNED_KCM_QPS = 300
TUNED_KCM_BURST = 500
TUNED_SCHEDULER_QPS = 300
TUNED_SCHEDULER_BURST = 500
TUNED_PERCENTAGE_OF_NODES_TO_SCORE = 10

PROFILES: Mapping[str, ControlPlaneProfile] = {
    "default": ControlPlaneProfile("default"),
    "tuned": ControlPlaneProfile(
        "tuned",
        apiserver_args=("--max-requests-inflight=800", "--max-mutating-requests-inflight=400"),
        controller_manager_args=(f"--kube-api-qps={TUNED_KCM_QPS}", f"--kube-api-burst={TUNED_KCM_BURST}"),
        scheduler_qps=TUNED_SCHEDULER_QPS,
        scheduler_burst=TUNED_SCHEDULER_BURST,
        percentage_of_nodes_to_score=TUNED_PERCENTAGE_OF_NODES_TO_SCORE,
    ),
}


def get_profile(name: str) -> ControlPlaneProfile:
    """The profile called `name`; an unknown name is a ValueError listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"control-plane profile {name!r} is not known; choose one of {', '.join(PROFILES)}") from None


def scheduler_config(profile: ControlPlaneProfile, kubeconfig: Path, profiling: bool = False) -> dict[str, Any]:
    """The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) for a profile with scheduler settings.

    With --config the scheduler ignores its deprecated flags (--kubeconfig, --leader-elect, --profiling), so the
    file carries them: the kubeconfig, leader election on, profiling off as the flags of the default profile (on with
    `profiling`: /debug/pprof on the scheduler's secure port, for bench_scale --pprof)."""
    connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if profile.scheduler_qps is not None:
        connection["qps"] = profile.scheduler_qps
    if profile.scheduler_burst is not None:
        connection["burst"] = profile.scheduler_burst
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": True},
        "enableProfiling": profiling,
    }
    if profile.percentage_of_nodes_to_score is not None:
        config["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    return config
