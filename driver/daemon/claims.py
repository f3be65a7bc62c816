"""ResourceClaims as prepare sees them: the narrow lookup interface, the per-claim errors, and the
allocation results and opaque configs that belong to this driver on this node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from neuron_dra.driver.model.catalog import InstanceSpec
from neuron_dra.driver.model.config import ConfigError, EffectiveConfig, OpaqueConfig, check_applies, decode


@dataclass(frozen=True)
class ClaimRef:
    """What kubelet sends per claim: namespace, name and UID only."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        # Capped: kubelet's fields are checked after they are first logged, and may be of any size.
        return f"{self.namespace[:63]}/{self.name[:253]} ({self.uid[:128]})"


class Reason(StrEnum):
    """Why a claim failed; the label of the errors metric."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    UID_MISMATCH = "uid_mismatch"
    NOT_ALLOCATED = "not_allocated"
    NOT_FOR_THIS_NODE = "not_for_this_node"
    UNKNOWN_DEVICE = "unknown_device"
    BAD_CONFIG = "bad_config"
    DEVICE_BUSY = "device_busy"
    ALLOCATION_CHANGED = "allocation_changed"
    UNPREPARED_MEANWHILE = "unprepared_meanwhile"
    API_ERROR = "api_error"
    ABANDONED = "abandoned"
    INTERNAL = "internal"


class ClaimError(Exception):
    """One claim cannot be prepared (or unprepared); reported in that claim's `error`, nothing changed."""

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(message)


class ClaimLookupError(RuntimeError):
    """The API server did not answer (unreachable, timeout, 5xx, forbidden): retryable."""


class ClaimLookup(Protocol):
    """The one API call prepare needs. Returns the ResourceClaim as JSON, or None when it does not exist."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver on this node, with the config that applies to it."""

    request: str  # as in the result: "req" or "req/subreq"
    device: str
    admin_access: bool
    config: EffectiveConfig

    @property
    def base_request(self) -> str:
        return self.request.split("/", 1)[0]


def _applies(requests: Sequence[str], result_request: str) -> bool:
    # A config lists requests by name; "req" covers its subrequests, "req/sub" only that subrequest.
    if not requests:
        return True
    return result_request in requests or result_request.split("/", 1)[0] in requests


def _configs(allocation: Mapping[str, Any], driver: str, spec: InstanceSpec
             ) -> list[tuple[tuple[str, ...], OpaqueConfig]]:
    entries = list(enumerate(allocation.get("devices", {}).get("config") or ()))
    # FromClass before FromClaim; within a source the listed order; later entries win.
    entries.sort(key=lambda e: (0 if e[1].get("source") == "FromClass" else 1, e[0]))
    out = []
    for i, entry in entries:
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        where = f"status.allocation.devices.config[{i}] ({entry.get('source', 'unknown source')})"
        try:
            config = decode(opaque.get("parameters"))
            check_applies(config, spec)
        except ConfigError as e:
            raise ClaimError(Reason.BAD_CONFIG, f"{where}: {e}") from None
        out.append((tuple(entry.get("requests") or ()), config))
    return out


def allocated_devices(claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str, spec: InstanceSpec
                      ) -> tuple[AllocatedDevice, ...]:
    """The results of `driver` in `pool` (this node), checked as kubelet's drivers must."""
    uid = claim.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(Reason.UID_MISMATCH,
                         f"claim {ref.namespace}/{ref.name} has uid {uid!r}, kubelet asked for {ref.uid!r}: "
                         "the claim was deleted and replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(Reason.NOT_ALLOCATED, f"claim {ref} is not allocated (status.allocation is not set)")
    results = allocation.get("devices", {}).get("results") or ()
    ours = [r for r in results if r.get("driver") == driver]
    if not ours:
        found = ", ".join(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results) or "none"
        raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                         f"claim {ref} has no devices of driver {driver} (allocated: {found})")
    elsewhere = sorted({str(r.get("pool")) for r in ours if r.get("pool") != pool})
    if elsewhere:
        raise ClaimError(Reason.NOT_FOR_THIS_NODE,
                         f"claim {ref} is allocated to pool {', '.join(elsewhere)}, not to this node's pool {pool}")
    configs = _configs(allocation, driver, spec)
    out = []
    for r in ours:
        request = str(r.get("request", ""))
        effective = EffectiveConfig()
        for requests, config in configs:
            if _applies(requests, request):
                effective = effective.merged(config)
        out.append(AllocatedDevice(request, str(r.get("device", "")), bool(r.get("adminAccess")), effective))
    return tuple(out)
