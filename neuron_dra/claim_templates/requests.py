"""Typed device requests: what a workload needs, without CEL. Each renders to resource.k8s.io/v1 JSON.

- `Neuron(count | ALL, ...)`: Neuron devices by instance types or families, topology, LNC, kernel driver
  version, minimum HBM or cores, raw CEL as an escape hatch.
- `Connected(size)`: one id-aligned connected group (torus: 4 = a row, 8 = two rows, 16 = the torus; inf2
  rings: a contiguous segment; all-to-all hosts and whole nodes need no constraint); `RingSegment(size)`: the
  same on ring hosts only.
- `UltraServerNode(mode)`: the UltraServer pseudo-device of a node, with UltraServerConfig.
- `Efa(count, aligned_to=...)`: EFA devices in the same devicegroup as the named Neuron request's.
- `FirstAvailable(option, ...)`: the first alternative that fits.
- `NeuronCores(n, ...)`: an aligned group of n NeuronCores of one device (Kubernetes 1.36+, docs/neuron-cores.md).

A request's tests render as one CEL expression (`merged_selectors`). Bad input raises TemplateError at
construction, naming the field, the value and what is allowed. Instance types and families come from
`catalog=` (the built-in catalog, or a catalog file's).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from typing import Any, ClassVar, Final

from neuron_dra.claim_templates.cel_env import CelCompileError, CelEnvironment
from neuron_dra.claim_templates.cel_types import CelValueError, Quantity
from neuron_dra.claim_templates.drivers import Drivers
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.keywords import given, keyword_hints
from neuron_dra.claim_templates.names import check_dns_label, check_label_key, check_labels
from neuron_dra.claim_templates.node_types import LNC_CHOICES
from neuron_dra.driver.errortext import did_you_mean
from neuron_dra.driver.model import config as driver_config
from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec, TopologyKind
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME
from neuron_dra.driver.model.partitions import CoreLayout
from neuron_dra.driver.model.slices import AWS_DOMAIN, DEVICEGROUP_SIZES, NEURON_DEVICE, NEURON_NODE
from neuron_dra.driver.model.taints import unhealthy_taint_key

MAX_COUNT = 32  # a claim gets at most 32 devices
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
# Attributes that only grid (torus) hosts publish: reading them on an all-to-all host can never match.
GRID_ONLY_ATTRIBUTES = ("topology_x", "topology_y", "topology4_id", "topology8_id")


class AllDevices(Enum):
    """`allocationMode: All`: every matching device of the node (one value, ALL)."""

    ALL = "ALL"

    def __repr__(self) -> str:
        return "ALL"

    __str__ = __repr__


ALL: Final = AllDevices.ALL
Count = int | AllDevices


class GroupAttribute(StrEnum):
    """Which attribute names a connected group."""

    AUTO = "auto"  # AWS's devicegroup ids where every target type publishes them, else topology ids
    AWS = "aws"  # resource.aws.com/devicegroup{N}_id: works with AWS's driver too (EFA types only)
    NEURON = "neuron"  # topology{N}_id of this driver: every topology kind


def _whole(value: object, low: int = 1, high: int | None = None) -> bool:
    """Whether `value` is an int (not a bool) from `low` to `high` (None: no upper bound)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high)


@dataclass(frozen=True)
class AnyTopology:
    """No placement constraint."""


@keyword_hints
@dataclass(frozen=True)
class Connected:
    """All devices of the request in one connected, id-aligned group of `size` (default: the count)."""

    size: int | None = None
    attribute: GroupAttribute = GroupAttribute.AUTO

    def __post_init__(self) -> None:
        if self.size is not None and not _whole(self.size):
            raise TemplateError("Connected.size", self.size, "a positive group size, or None for the request's count")
        if not isinstance(self.attribute, GroupAttribute):
            raise TemplateError("Connected.attribute", self.attribute, ", ".join(a.value for a in GroupAttribute))


@keyword_hints
@dataclass(frozen=True)
class RingSegment:
    """A contiguous, aligned segment of an inf2 device ring (size divides the ring length)."""

    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and not _whole(self.size):
            raise TemplateError("RingSegment.size", self.size, "a positive segment length, or None for the count")


Topology = AnyTopology | Connected | RingSegment


@keyword_hints
@dataclass(frozen=True)
class AtLeast:
    """A minimum kernel driver version, 1 to 4 dot-separated numbers (e.g. `2.25`)."""

    version: str

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not re.fullmatch(r"\d+(\.\d+){0,3}", self.version):
            raise TemplateError("AtLeast.version", self.version, "1 to 4 dot-separated numbers, e.g. '2.25.4.0'")

    @property
    def parts(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.version.split("."))


KernelDriver = str | AtLeast


def _as_tuple(field_name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(dict.fromkeys(value))
    raise TemplateError(field_name, value, "a string or a sequence of strings")


def _count(field_name: str, value: object, allow_all: bool) -> None:
    if allow_all and value is ALL:
        return
    if not _whole(value, 1, MAX_COUNT):
        allowed = f"an integer from 1 to {MAX_COUNT}" + (", or ALL" if allow_all else "")
        raise TemplateError(field_name, value, allowed)


def _check_selectors(field_name: str, selectors: tuple[str, ...]) -> list[tuple[str, frozenset[str]]]:
    """Compile each selector; returns (expression, attribute names it reads) per selector."""
    if len(selectors) > MAX_SELECTORS:
        raise TemplateError(field_name, len(selectors), f"at most {MAX_SELECTORS} selectors")
    env = CelEnvironment()
    out = []
    for expr in selectors:
        try:
            compiled = env.compile(expr)
        except CelCompileError as e:
            raise TemplateError(field_name, expr, f"a valid device selector ({e.message})") from e
        out.append((expr, frozenset(r.name for r in compiled.refs)))
    return out


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_cel_string(v) for v in values) + "]"


def check_distinct(field_name: str, names: Sequence[str], allowed: str) -> None:
    for n in names:
        if names.count(n) > 1:
            raise TemplateError(field_name, n, allowed)


def _sizes(sizes: Sequence[int]) -> str:
    return ", ".join(map(str, sorted(set(sizes))))


def _selector(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def merged_selectors(parts: Sequence[str], raw: Sequence[str]) -> list[dict[str, Any]]:
    """The request's selectors as one CEL expression (none when there is nothing to test).

    kube-scheduler copies a device's attributes for every selector it evaluates (docs/scale.md §2), so one `&&`
    costs one copy; `&&` stops at the first false part, so callers list cheap, selective parts first. `parts` are
    this module's tests (safe to join as they are), `raw` users' selectors (parenthesized when joined); raw ones
    that would take the expression past Kubernetes' size or cost limit stay separate selectors."""
    joined = [*parts, *(f"({r})" if len(parts) + len(raw) > 1 else r for r in raw)]
    if not joined:
        return []
    expression = " && ".join(joined)
    if raw and len(joined) > 1:
        try:
            CelEnvironment().compile(expression)
        except CelCompileError:
            return [*merged_selectors(parts, ()), *(_selector(r) for r in raw)]
    return [_selector(expression)]


def opaque_config(driver: str, requests: Sequence[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """A `devices.config[]` entry for `requests` (all when empty)."""
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def neuron_config(lnc: int) -> dict[str, Any]:
    return {"apiVersion": driver_config.API_VERSION, "kind": driver_config.NEURON_CONFIG, "logicalNeuronCore": lnc}


def ultraserver_config(mode: int) -> dict[str, Any]:
    return {"apiVersion": driver_config.API_VERSION, "kind": driver_config.ULTRASERVER_CONFIG,
            "ultraserverMode": mode}


TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("", "NoSchedule", "NoExecute")  # "": every effect


@keyword_hints
@dataclass(frozen=True)
class Toleration:
    """A device toleration (`exactly.tolerations[]`): the request may get devices with a matching taint.

    `key=""` with Exists tolerates every taint; `seconds` (tolerationSeconds) delays eviction by a NoExecute
    taint and needs effect NoExecute. Matching is node-taint matching (docs/neuron-health.md §4)."""

    key: str = ""
    operator: str = "Exists"
    value: str = ""
    effect: str = ""
    seconds: int | None = None

    def __post_init__(self) -> None:
        if self.key:
            check_label_key("Toleration.key", self.key)
        if self.operator not in TOLERATION_OPERATORS:
            raise TemplateError("Toleration.operator", self.operator, " or ".join(TOLERATION_OPERATORS))
        if not self.key and self.operator != "Exists":
            raise TemplateError("Toleration.operator", self.operator, "Exists when the key is empty (every taint)")
        if self.operator == "Exists" and self.value:
            raise TemplateError("Toleration.value", self.value, "empty with operator Exists")
        if self.operator == "Equal":
            check_labels("Toleration.value", {"value": self.value})
        if self.effect not in TOLERATION_EFFECTS:
            raise TemplateError("Toleration.effect", self.effect, "'' (every effect), NoSchedule or NoExecute")
        if self.seconds is not None:
            if not _whole(self.seconds, 0):
                raise TemplateError("Toleration.seconds", self.seconds, "a number of seconds >= 0, or None (forever)")
            if self.effect != "NoExecute":
                raise TemplateError("Toleration.seconds", self.seconds, "only with effect='NoExecute' (it delays "
                                                                        "eviction; other effects ignore it)")

    def to_api(self, drivers: Drivers) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.operator == "Equal":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.seconds is not None:
            out["tolerationSeconds"] = self.seconds
        return out


@keyword_hints
@dataclass(frozen=True)
class TolerateUnhealthy:
    """Tolerates the driver's own taint on unhealthy devices (`<driver>/unhealthy`, any value): for diagnostics
    pods that must run on a broken device. `effect=""` tolerates NoSchedule and NoExecute."""

    effect: str = ""
    seconds: int | None = None

    def __post_init__(self) -> None:
        self.toleration(DEFAULT_DRIVER_NAME)  # the same checks

    def toleration(self, driver: str) -> Toleration:
        return Toleration(key=unhealthy_taint_key(driver), effect=self.effect, seconds=self.seconds)

    def to_api(self, drivers: Drivers) -> dict[str, Any]:
        return self.toleration(drivers.neuron_driver).to_api(drivers)


Tolerance = Toleration | TolerateUnhealthy


def _tolerations(field_name: str, value: object) -> tuple[Tolerance, ...]:
    items = (value,) if isinstance(value, Toleration | TolerateUnhealthy) else value
    if not isinstance(items, Sequence) or isinstance(items, str) or \
            not all(isinstance(t, Toleration | TolerateUnhealthy) for t in items):
        raise TemplateError(field_name, value, "Toleration(...) / TolerateUnhealthy(...) or a sequence of them")
    return tuple(items)


@dataclass(frozen=True)
class Rendered:
    """A request's part of a ResourceClaimSpec."""

    request: dict[str, Any]
    constraints: list[dict[str, Any]] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)


def _attributes(drivers: Drivers) -> str:
    return f"device.attributes[{_cel_string(drivers.neuron_driver)}]"


def _exact(drivers: Drivers, class_name: str, count: Count, parts: Sequence[str], raw: Sequence[str],
           tolerations: Sequence[Tolerance] = ()) -> dict[str, Any]:
    """An ExactDeviceRequest / DeviceSubRequest body (every request kind's): `parts` and `raw` selectors as
    merged_selectors joins them."""
    body: dict[str, Any] = {"deviceClassName": class_name}
    selectors = merged_selectors(parts, raw)
    if selectors:
        body["selectors"] = selectors
    if count is ALL:
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = count
    if tolerations:
        body["tolerations"] = [t.to_api(drivers) for t in tolerations]
    return body


class _Exact:
    """What Neuron, UltraServerNode, NeuronCores and Efa share: one `exactly` request from `exact` and `extras`."""

    name: str
    selectors: Sequence[str] | str
    device_class: ClassVar[str] = "neuron_class"  # the Drivers field that names the request's DeviceClass

    def _normalize(self, *fields: str) -> None:
        """Check the name; store the sequence fields (selectors, tolerations, ...) as tuples."""
        kind = type(self).__name__
        check_dns_label(f"{kind}.name", self.name)
        for f in fields:
            convert = _tolerations if f == "tolerations" else _as_tuple
            object.__setattr__(self, f, convert(f"{kind}.{f}", getattr(self, f)))

    def selector_expressions(self, drivers: Drivers) -> list[str]:
        """The request's own tests, cheap and selective first (merged_selectors adds the raw selectors)."""
        return []

    def exact(self, drivers: Drivers) -> dict[str, Any]:
        """The ExactDeviceRequest / DeviceSubRequest body."""
        return _exact(drivers, getattr(drivers, self.device_class), getattr(self, "count", 1),
                      self.selector_expressions(drivers), self.selectors, getattr(self, "tolerations", ()))

    def extras(self, drivers: Drivers, ref: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Constraints and configs for this request, `ref` being its name in them (`req` or `req/sub`)."""
        return [], []

    def render(self, drivers: Drivers) -> Rendered:
        constraints, configs = self.extras(drivers, self.name)
        return Rendered({"name": self.name, "exactly": self.exact(drivers)}, constraints, configs)


class _Targeted(_Exact):
    """A request kept to instance types or families of a catalog (Neuron, NeuronCores)."""

    instance_types: Sequence[str] | str
    families: Sequence[str] | str
    catalog: Catalog

    @property
    def explicit_targets(self) -> bool:
        return bool(self.instance_types or self.families)

    @property
    def target_types(self) -> tuple[str, ...]:
        """The instance types this request may land on (its instance types and families; else all)."""
        types = self.catalog.types
        by_family = tuple(t for t, s in types.items() if s.family.name in self.families)
        if self.instance_types and self.families:
            return tuple(t for t in self.instance_types if t in by_family)
        return tuple(self.instance_types) or by_family or tuple(types)

    def _checked_targets(self) -> Sequence[str]:
        """`target_types` after checking the catalog and the names they were built from."""
        request, catalog = type(self).__name__, self.catalog
        if not isinstance(catalog, Catalog):
            raise TemplateError(f"{request}.catalog", catalog, "a Catalog (driver.catalog.BUILTIN or a catalog file's)")
        for t in self.instance_types:
            if t not in catalog.types:
                raise TemplateError(f"{request}.instance_types", t, f"a catalog instance type (or a catalog file's, "
                                    f"passed as {request}(catalog=...)){catalog.unknown_type_text(t)}")
        for f in self.families:
            if f not in catalog.family_map:
                raise TemplateError(f"{request}.families", f, ", ".join(catalog.family_map)
                                    + did_you_mean(f, catalog.family_map))
        if not self.target_types:
            raise TemplateError(f"{request}.families", self.families,
                                f"families that contain one of the instance types {', '.join(self.instance_types)}")
        return self.target_types

    def _type_tests(self, drivers: Drivers) -> list[str]:
        """The instanceType test when the request names instance types or families."""
        if not self.explicit_targets:
            return []
        d, types = _attributes(drivers), self.target_types
        return [f"{d}.instanceType == {_cel_string(types[0])}" if len(types) == 1
                else f"{d}.instanceType in {_cel_list(types)}"]


@keyword_hints
@dataclass(frozen=True)
class Neuron(_Targeted):
    """Neuron devices: `count` of them (1..32) or ALL on the node."""

    count: Count = 1
    name: str = "neurons"
    instance_types: Sequence[str] | str = ()  # stored as a tuple
    families: Sequence[str] | str = ()
    topology: Topology = AnyTopology()
    lnc: int | None = None  # Logical NeuronCores (Trainium2 and later): one of LNC_VALUES
    kernel_driver: KernelDriver | None = None  # exact version string, or AtLeast(...)
    min_memory: str | None = None  # HBM per device, a quantity such as "64Gi"
    min_cores: int | None = None  # physical NeuronCores per device
    selectors: Sequence[str] | str = ()  # raw CEL, ANDed with the rest (after them: one expression)
    tolerations: Sequence[Tolerance] | Tolerance = ()  # e.g. TolerateUnhealthy() for diagnostics pods
    catalog: Catalog = field(default=BUILTIN, repr=False)  # where instance types and families come from

    def __post_init__(self) -> None:
        _count("Neuron.count", self.count, allow_all=True)
        self._normalize("tolerations", "instance_types", "families", "selectors")
        targets = self._checked_targets()
        types = self.catalog.types
        most = max(types[t].device_count for t in targets)
        if isinstance(self.count, int) and self.count > most:
            raise TemplateError("Neuron.count", self.count, f"1 to {most} on {', '.join(targets)}")
        self._check_topology(targets)
        _check_lnc("Neuron.lnc", self.lnc, self.catalog, targets)
        self._check_kernel_driver()
        self._check_minimums(targets)
        compiled = _check_selectors("Neuron.selectors", self.selectors)  # type: ignore[arg-type]
        self._check_grid_selectors(targets, compiled)

    @property
    def group_size(self) -> int | None:
        if isinstance(self.topology, AnyTopology):
            return None
        size = self.topology.size
        return size if size is not None else (self.count if isinstance(self.count, int) else None)

    def _specs(self, targets: Sequence[str]) -> list[InstanceSpec]:
        return [self.catalog.types[t] for t in targets]

    def _pseudo_device_possible(self) -> bool:
        """Whether a target type publishes the UltraServer pseudo-device (which the Neuron class selects too)."""
        return not self.explicit_targets or any(s.ultraserver is not None for s in self._specs(self.target_types))

    def _check_grid_selectors(self, targets: Sequence[str], compiled: Sequence[tuple[str, frozenset[str]]]) -> None:
        """Raw selectors reading grid-only attributes can never match when every target is all-to-all."""
        specs = self._specs(targets)
        if not specs or not all(s.all_to_all for s in specs):
            return
        for expr, names in compiled:
            grid = sorted(names & set(GRID_ONLY_ATTRIBUTES))
            if grid:
                raise TemplateError("Neuron.selectors", expr,
                                    f"selectors without the grid attributes {', '.join(grid)}: all-to-all hosts "
                                    f"({', '.join(targets)}) publish no {', '.join(GRID_ONLY_ATTRIBUTES)}")

    def _check_topology(self, targets: Sequence[str]) -> None:
        if isinstance(self.topology, AnyTopology):
            return
        kind = type(self.topology).__name__
        if not isinstance(self.topology, Connected | RingSegment):
            raise TemplateError("Neuron.topology", self.topology, "AnyTopology(), Connected(size) or RingSegment(size)")
        if self.count is ALL:
            raise TemplateError("Neuron.count", "ALL", f"a device count with {kind} (ALL takes every device already)")
        size = self.group_size
        assert size is not None and isinstance(self.count, int)
        specs = self._specs(targets)
        if isinstance(self.topology, RingSegment):
            specs = [s for s in specs if s.topology is TopologyKind.RING]
            if not specs:
                rings = ", ".join(t for t, s in self.catalog.types.items() if s.topology is TopologyKind.RING)
                raise TemplateError("Neuron.topology", self.topology,
                                    f"RingSegment on ring hosts only ({rings}); targets: {', '.join(targets)}")
        possible = sorted({n for s in specs for n in s.group_sizes()})
        if size not in possible:
            raise TemplateError(f"{kind}.size", size,
                                f"the connected group sizes of {', '.join(s.instance_type for s in specs)}: "
                                f"{_sizes(possible)}")
        if self.count > size:
            raise TemplateError("Neuron.count", self.count, f"at most the group size {size} with {kind}({size})")
        attribute = self.topology.attribute if isinstance(self.topology, Connected) else GroupAttribute.NEURON
        if attribute is GroupAttribute.AWS:
            aws = [s.instance_type for s in specs if s.has_device_efa and size in s.group_sizes()]
            if size not in DEVICEGROUP_SIZES or not aws:
                raise TemplateError("Connected.attribute", attribute.value,
                                    f"'aws' needs a devicegroup size ({_sizes(DEVICEGROUP_SIZES)}) on EFA instance "
                                    "types; use GroupAttribute.NEURON or AUTO")
        offering = [s for s in specs if size in s.group_sizes()]
        meshes = [s.instance_type for s in offering if s.all_to_all]
        if size > 1 and meshes and attribute is not GroupAttribute.AUTO:
            raise TemplateError("Connected.attribute", attribute.value,
                                f"AUTO on all-to-all hosts ({', '.join(meshes)}): any {size} of their devices are "
                                "connected, so no group attribute is needed and they publish none")
        constrained = self._constrained(size, offering)
        if meshes and constrained and self.explicit_targets:
            raise TemplateError("Neuron.topology", self.topology,
                                f"one topology kind per request: {kind}({size}) needs a group attribute on "
                                f"{', '.join(s.instance_type for s in constrained)}, which all-to-all hosts "
                                f"({', '.join(meshes)}) do not publish; restrict instance_types or families, or use "
                                "FirstAvailable(one Neuron per kind)")

    @staticmethod
    def _constrained(size: int, offering: Sequence[InstanceSpec]) -> list[InstanceSpec]:
        """The target types on which `size` connected devices need a matchAttribute: not all-to-all hosts, and
        not the whole node (any `device_count` devices of a node are all of them)."""
        return [s for s in offering if not s.all_to_all and size < s.device_count]

    def group_attribute(self, drivers: Drivers) -> str | None:
        """The attribute that names the request's connected group, or None (no constraint)."""
        size = self.group_size
        if size is None or size == 1:
            return None  # one device is always connected; no constraint keeps it working with AWS's driver
        assert isinstance(self.topology, Connected | RingSegment)
        attribute = self.topology.attribute if isinstance(self.topology, Connected) else GroupAttribute.NEURON
        if attribute is GroupAttribute.AUTO:
            offering = [s for s in self._specs(self.target_types) if size in s.group_sizes()]
            if not self._constrained(size, offering):
                return None  # all-to-all hosts and whole nodes: any `size` devices are connected
            aws_ok = size in DEVICEGROUP_SIZES and all(s.has_device_efa for s in offering if not s.all_to_all)
            attribute = GroupAttribute.AWS if aws_ok else GroupAttribute.NEURON
        if attribute is GroupAttribute.AWS:
            return f"{AWS_DOMAIN}/devicegroup{size}_id"
        return f"{drivers.neuron_driver}/topology{size}_id"

    def _check_kernel_driver(self) -> None:
        v = self.kernel_driver
        if v is None or isinstance(v, AtLeast):
            return
        if not isinstance(v, str) or not re.fullmatch(r"\d+\.\d+\.\d+\.\d+", v):
            raise TemplateError("Neuron.kernel_driver", v, "a 4-part version such as '2.25.4.0', or AtLeast('2.25')")

    def _check_minimums(self, targets: Sequence[str]) -> None:
        specs = self._specs(targets)
        if self.min_memory is not None:
            try:
                wanted = Quantity.parse(self.min_memory) if isinstance(self.min_memory, str) else None
            except CelValueError:
                wanted = None
            if wanted is None or wanted.sign() <= 0:
                raise TemplateError("Neuron.min_memory", self.min_memory, "a positive quantity such as '64Gi'")
            if isinstance(self.min_memory, str) and re.fullmatch(r"\+?[0-9]+(\.[0-9]*)?", self.min_memory.strip()):
                # A bare number is bytes to Kubernetes: '64' would ask for 64 bytes of HBM, never what is meant.
                raise TemplateError("Neuron.min_memory", self.min_memory,
                                    f"a quantity with a unit such as '{self.min_memory.strip()}Gi' (a bare number "
                                    "is bytes)")
            best = max(specs, key=lambda s: s.hbm_bytes_per_device)
            if wanted.value > best.hbm_bytes_per_device:
                raise TemplateError("Neuron.min_memory", self.min_memory,
                                    f"at most {best.hbm_bytes_per_device // 2**30}Gi ({best.instance_type})")
        if self.min_cores is not None:
            best = max(specs, key=lambda s: s.physical_cores_per_device)
            if not _whole(self.min_cores, 1, best.physical_cores_per_device):
                raise TemplateError("Neuron.min_cores", self.min_cores,
                                    f"1 to {best.physical_cores_per_device} ({best.instance_type})")

    def selector_expressions(self, drivers: Drivers) -> list[str]:
        d = _attributes(drivers)
        c = f"device.capacity[{_cel_string(drivers.neuron_driver)}]"
        # The class keeps NeuronCores out; the UltraServer pseudo-device only a selector does, or a group
        # constraint (the pseudo-device has no group id, and the allocator never chooses a device that lacks the
        # matchAttribute). Where neither is needed, the test would only make the expression longer.
        guard = self._pseudo_device_possible() and self.group_attribute(drivers) is None
        out = [f"{d}.resourceType == {_cel_string(NEURON_DEVICE)}"] if guard else []
        out += self._type_tests(drivers)
        if isinstance(self.topology, RingSegment):
            out.append(f"{d}.topologyKind == {_cel_string(TopologyKind.RING.value)}")
        if isinstance(self.kernel_driver, str):
            out.append(f"{d}.neuronDriverVersion == {_cel_string(self.kernel_driver)}")
        elif isinstance(self.kernel_driver, AtLeast):
            out.append(_at_least(f"{d}.neuronDriverVersion", self.kernel_driver.parts))
        if self.min_memory is not None:
            out.append(f"'memory' in {c} && {c}.memory.compareTo(quantity({_cel_string(self.min_memory)})) >= 0")
        if self.min_cores is not None:
            out.append(f"'cores' in {c} && {c}.cores.compareTo(quantity('{self.min_cores}')) >= 0")
        return out

    def extras(self, drivers: Drivers, ref: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        constraints = []
        attribute = self.group_attribute(drivers)
        if attribute is not None:
            constraints.append({"requests": [ref], "matchAttribute": attribute})
        configs = [opaque_config(drivers.neuron_driver, [ref], neuron_config(self.lnc))] if self.lnc is not None else []
        return constraints, configs

    def max_devices(self) -> int:
        if isinstance(self.count, int):
            return self.count
        return max(self.catalog.types[t].device_count for t in self.target_types)


def _at_least(attribute: str, parts: tuple[int, ...]) -> str:
    """`attribute` (a dotted version string) >= parts, comparing numerically part by part."""
    def cmp(i: int) -> str:
        if i == len(parts) - 1:
            return f"int(v[{i}]) >= {parts[i]}"
        return f"int(v[{i}]) > {parts[i]} || (int(v[{i}]) == {parts[i]} && ({cmp(i + 1)}))"
    return f"cel.bind(v, {attribute}.split('.'), v.size() >= {len(parts)} && ({cmp(0)}))"


@keyword_hints
@dataclass(frozen=True)
class UltraServerNode(_Exact):
    """The UltraServer pseudo-device of a trn2u node, with the UltraServer mode (1, 2 or 4 nodes)."""

    mode: int
    name: str = "ultraserver"
    lnc: int | None = None
    selectors: Sequence[str] | str = ()
    tolerations: Sequence[Tolerance] | Tolerance = ()

    def __post_init__(self) -> None:
        self._normalize("tolerations", "selectors")
        try:
            driver_config.decode(ultraserver_config(self.mode))
            if self.lnc is not None:
                driver_config.decode(neuron_config(self.lnc))
        except driver_config.ConfigError as e:
            field_name = "UltraServerNode.mode" if e.field == "ultraserverMode" else "UltraServerNode.lnc"
            raise e.restated(TemplateError, field_name) from e
        _check_selectors("UltraServerNode.selectors", self.selectors)  # type: ignore[arg-type]

    def selector_expressions(self, drivers: Drivers) -> list[str]:
        return [f"{_attributes(drivers)}.resourceType == {_cel_string(NEURON_NODE)}"]

    def extras(self, drivers: Drivers, ref: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        configs = [opaque_config(drivers.neuron_driver, [ref], ultraserver_config(self.mode))]
        if self.lnc is not None:
            configs.append(opaque_config(drivers.neuron_driver, [ref], neuron_config(self.lnc)))
        return [], configs

    def max_devices(self) -> int:
        return 1


@keyword_hints
@dataclass(frozen=True)
class Efa(_Exact):
    """EFA devices; `aligned_to` names a Neuron request whose devices share their devicegroup."""

    device_class = "efa_class"

    count: int = 1
    name: str = "efa"
    aligned_to: str | None = "neurons"
    group: int | None = None  # devicegroup size to align on (1, 4, 8, 16); default from the Neuron request
    selectors: Sequence[str] | str = ()

    def __post_init__(self) -> None:
        _count("Efa.count", self.count, allow_all=False)
        self._normalize("selectors")
        if self.aligned_to is not None:
            check_dns_label("Efa.aligned_to", self.aligned_to)
        if self.group is not None and self.group not in (1, *DEVICEGROUP_SIZES):
            raise TemplateError("Efa.group", self.group, f"a devicegroup size: 1, {_sizes(DEVICEGROUP_SIZES)}")
        _check_selectors("Efa.selectors", self.selectors)  # type: ignore[arg-type]

    def max_devices(self) -> int:
        return self.count


def default_group(neuron_count: int | None) -> int:
    """The smallest devicegroup that holds `neuron_count` devices (1 = the device's own EFA)."""
    if neuron_count == 1:
        return 1
    return next((n for n in DEVICEGROUP_SIZES if neuron_count is not None and neuron_count <= n),
                DEVICEGROUP_SIZES[-1])


@keyword_hints
@dataclass(frozen=True, init=False)
class FirstAvailable:
    """The first of several alternatives that fits (`firstAvailable`, at most 8): Neuron devices or NeuronCores,
    e.g. `FirstAvailable(NeuronCores(4), Neuron(1))` (a core group, else a whole device)."""

    options: tuple[Neuron | NeuronCores, ...]
    name: str

    def __init__(self, *options: Neuron | NeuronCores, name: str = "neurons") -> None:
        check_dns_label("FirstAvailable.name", name)
        if not 1 <= len(options) <= MAX_SUBREQUESTS:
            raise TemplateError("FirstAvailable.options", len(options), f"1 to {MAX_SUBREQUESTS} alternatives")
        named = []
        for i, option in enumerate(options, start=1):
            if not isinstance(option, Neuron | NeuronCores):
                raise TemplateError("FirstAvailable.options", option, "Neuron(...) or NeuronCores(...) alternatives")
            if "name" not in given(option):  # named by default: number the alternatives
                option = _renamed(option, f"option{i}")
            named.append(option)
        check_distinct("FirstAvailable.options", [o.name for o in named], "distinct alternative names")
        object.__setattr__(self, "options", tuple(named))
        object.__setattr__(self, "name", name)

    def render(self, drivers: Drivers) -> Rendered:
        subs, constraints, configs = [], [], []
        for option in self.options:
            subs.append({"name": option.name, **option.exact(drivers)})
            c, cfg = option.extras(drivers, f"{self.name}/{option.name}")
            constraints += c
            configs += cfg
        return Rendered({"name": self.name, "firstAvailable": subs}, constraints, configs)

    def max_devices(self) -> int:
        return min(o.max_devices() for o in self.options)


def _renamed(option: Neuron | NeuronCores, name: str) -> Neuron | NeuronCores:
    return replace(option, name=name)


@keyword_hints
@dataclass(frozen=True)
class NeuronCores(_Targeted):
    """`count` NeuronCores (logical cores at the node's LNC) of one Neuron device, one aligned, contiguous range
    of NEURON_RT_VISIBLE_CORES ids (a power of two, held together by `coreGroup{count}_id`, docs/neuron-cores.md
    §2-3). `node_lnc` keeps the request to nodes of that LNC (the count's meaning changes with it)."""

    device_class = "neuron_core_class"

    count: int = 1
    name: str = "cores"
    instance_types: Sequence[str] | str = ()
    families: Sequence[str] | str = ()
    node_lnc: int | None = None
    selectors: Sequence[str] | str = ()
    tolerations: Sequence[Tolerance] | Tolerance = ()
    catalog: Catalog = field(default=BUILTIN, repr=False)

    def __post_init__(self) -> None:
        self._normalize("instance_types", "families", "selectors", "tolerations")
        targets = self._checked_targets()
        types = self.catalog.types
        _check_lnc("NeuronCores.node_lnc", self.node_lnc, self.catalog, targets)
        sizes = sorted({n for t in targets for n in self._sizes(types[t])})
        if not _whole(self.count) or self.count not in sizes:
            raise TemplateError("NeuronCores.count", self.count,
                                f"the aligned core group sizes of {', '.join(targets)}: {_sizes(sizes)}")
        _check_selectors("NeuronCores.selectors", self.selectors)  # type: ignore[arg-type]

    def _sizes(self, spec: InstanceSpec) -> tuple[int, ...]:
        lncs = (self.node_lnc,) if self.node_lnc is not None else \
            (driver_config.LNC_VALUES if spec.lnc_supported else (1,))
        return tuple(n for lnc in lncs for n in CoreLayout.for_spec(spec, lnc).claim_sizes())

    def selector_expressions(self, drivers: Drivers) -> list[str]:
        d = _attributes(drivers)
        out = self._type_tests(drivers)  # the NeuronCore class selects resourceType neuron_core already
        if self.node_lnc is not None:
            out.append(f"{d}.lnc == {self.node_lnc}")
        if self.count > 1:  # only nodes whose devices have groups of this size
            out.append(f"'coreGroup{self.count}_id' in {d}")
        return out

    def extras(self, drivers: Drivers, ref: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The core group constraint, `ref` being the request's name in it (`req` or `req/sub`); no configs."""
        if self.count == 1:
            return [], []
        return [{"requests": [ref], "matchAttribute": f"{drivers.neuron_driver}/coreGroup{self.count}_id"}], []

    def max_devices(self) -> int:
        return self.count


Request = Neuron | UltraServerNode | Efa | FirstAvailable | NeuronCores


def _check_lnc(field_name: str, lnc: int | None, catalog: Catalog, targets: Sequence[str]) -> None:
    """An LNC (None: unset) is one of LNC_VALUES, and applies to Trainium2 and later: when no target has it, the
    fix is to drop the argument; when some do, to keep the request to those."""
    if lnc is None:
        return
    if isinstance(lnc, bool) or lnc not in driver_config.LNC_VALUES:
        raise TemplateError(field_name, lnc, LNC_CHOICES)
    without = [t for t in targets if not catalog.types[t].lnc_supported]
    if not without:
        return
    argument = field_name.rpartition(".")[2]
    devices = sorted({catalog.types[t].family.device_name for t in without})
    if len(without) == len(targets):
        raise TemplateError(field_name, lnc, f"no {argument} on {', '.join(without)}: {' and '.join(devices)} "
                            f"{'has' if len(devices) == 1 else 'have'} no Logical NeuronCores (Trainium2 and later "
                            f"only); drop {argument}")
    lnc_types = ", ".join(t for t in targets if catalog.types[t].lnc_supported)
    raise TemplateError(field_name, lnc, f"LNC only on Trainium2 and later; this request may also land on "
                        f"{', '.join(without)}: keep it to {lnc_types} (instance_types or families), or drop "
                        f"{argument}")
