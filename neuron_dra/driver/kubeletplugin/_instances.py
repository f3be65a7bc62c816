"""Which socket names this instance of the driver listens on: its own (from the pod UID) or the plain ones.

kubelet 1.33+ tracks every registered endpoint of a driver and calls the newest connected one, falling back when
it goes away (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go; pluginwatcher/README.md, "Seamless Upgrade").
Older kubelets keep one endpoint per driver name, where per-instance names would leave a stopped instance
registered. Hence (docs/upgrades.md): `plain` always `dra.sock` / `<driver>-reg.sock`; `per-instance` always the
pod UID's names (the operator vouches for the kubelet); `auto` (default) the pod UID's names when POD_UID is set
and the Node's status.nodeInfo.kubeletVersion is 1.33+, else (no UID, older or unreadable) the plain names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from neuron_dra.driver.errortext import shown

log = logging.getLogger(__name__)

SOCKET_NAME_MODES = ("auto", "per-instance", "plain")
MIN_KUBELET = (1, 33)  # kubernetes/kubernetes PR #129832: several instances of one DRA driver
# The apiserver makes pod UIDs RFC 4122 UUIDs; any short name of letters, digits and dashes is a safe file name.
POD_UID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
_VERSION = re.compile(r"v?(\d{1,4})\.(\d{1,4})(?:\.\d+)?(?:[-+].*)?")


class InstanceError(ValueError):
    pass


def check_pod_uid(value: str) -> str:
    """`value` if it can be a pod UID (it goes into socket file names), or "" for none."""
    if value and not POD_UID.fullmatch(value):
        raise InstanceError(f"POD_UID {shown(value)} is not a pod UID; allowed: up to 64 letters, digits and "
                            "dashes, such as 0f8fad5b-d9cb-469f-a165-70867728950e (the downward API's "
                            "metadata.uid), or empty")
    return value


def kubelet_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a Kubernetes version (a kubeletVersion, the API server's gitVersion) such as v1.36.5 or
    v1.33.0-eks-1234; None when it is not one (at most 4 digits each: int() refuses over 4,300)."""
    m = _VERSION.fullmatch(version)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class Naming:
    instance: str  # "": the plain names
    reason: str


def decide(mode: str, pod_uid: str, kubelet_version: Callable[[], str | None]) -> Naming:
    """The names to listen on; `kubelet_version` is asked only when the answer depends on it."""
    if mode not in SOCKET_NAME_MODES:
        raise InstanceError(f"socket names {shown(mode)} are not allowed; allowed: {', '.join(SOCKET_NAME_MODES)}")
    if mode == "plain":
        return Naming("", "--socket-names=plain")
    if not pod_uid:
        if mode == "per-instance":
            raise InstanceError("--socket-names=per-instance needs the pod UID (env POD_UID from the downward API "
                                "metadata.uid, or --pod-uid)")
        return Naming("", "no pod UID (env POD_UID)")
    if mode == "per-instance":
        return Naming(pod_uid, "--socket-names=per-instance")
    version = kubelet_version()
    if version is None:
        return Naming("", "the kubelet's version could not be read from the Node")
    minor = kubelet_minor(version)
    if minor is None:
        return Naming("", f"the Node's kubeletVersion {shown(version)} is not a version")
    if minor < MIN_KUBELET:
        return Naming("", f"kubelet {version} is older than {MIN_KUBELET[0]}.{MIN_KUBELET[1]}")
    return Naming(pod_uid, f"kubelet {version} registers several instances of a driver")
