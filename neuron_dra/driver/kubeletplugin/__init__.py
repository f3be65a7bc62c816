"""The kubelet-plugin helper a DRA driver runs on: `start(driver, options, lookup=...) -> Helper`, as the Go
helper's `kubeletplugin.Start` (k8s.io/dynamic-resource-allocation/kubeletplugin). This face has what a driver
needs: the helper and its options, the Driver protocol and what its calls hand over and answer (Claim, ClaimRef,
CallScope, ClaimFailed, PreparedDevice), the claim lookup, the lock held around calls, and the ResourceSlices
handed to `Helper.publish` as data. Nothing here names Neuron hardware.

The parts a driver's process uses beside the helper (the API client, gRPC serving of its own services and the
generated protocols, logs, signals, memory, atomic files, instance naming) are in the one other face,
`kubeletplugin.toolkit`; the private modules behind both are not imported from outside the layer (import
contracts in pyproject.toml).

What kubelet's registration needs (the helper, the gRPC servers, socket names) is imported with this module;
the publisher on first use, so a driver answers registration before it has imported the API client
(tests/driver/daemon/test_image.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuron_dra.driver.kubeletplugin._calls import Driver, PreparedDevice
from neuron_dra.driver.kubeletplugin._claimref import (
    CallScope,
    Claim,
    ClaimFailed,
    ClaimLookup,
    ClaimLookupError,
    ClaimRef,
)
from neuron_dra.driver.kubeletplugin._helper import Helper, Options, start
from neuron_dra.driver.kubeletplugin._instance_lock import CallLock, LockTimeout
from neuron_dra.driver.kubeletplugin._plugin import MAX_CLAIMS_PER_CALL
from neuron_dra.driver.kubeletplugin._sockets import SocketError

if TYPE_CHECKING:
    from neuron_dra.driver.kubeletplugin._slicepublisher import PublishFeedback, Slice


def __getattr__(name: str) -> Any:
    if name not in ("PublishFeedback", "Slice"):  # imported on first use: the publisher's module
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._slicepublisher"), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_CLAIMS_PER_CALL",
    "CallLock", "CallScope", "Claim", "ClaimFailed", "ClaimLookup", "ClaimLookupError", "ClaimRef", "Driver",
    "Helper", "LockTimeout", "Options", "PreparedDevice", "PublishFeedback", "Slice", "SocketError", "start",
]
