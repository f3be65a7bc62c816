"""`ClaimTemplates`: ResourceClaimTemplates from typed claim template objects, checked before anything deploys.

The component runs each template's check against the instance types of the node groups in the same stack
while the program runs, so `pulumi preview` (and `neuron-dra plan`) fail with the check's message when the
cluster cannot satisfy a template, instead of a pod waiting forever. Templates are
`neuron_dra.claim_templates.ClaimTemplate` objects or anything else with `name`, `namespace` and
`to_manifest()`; the check is `neuron_dra.claim_templates`' own unless one is given. A Kubernetes provider is
given as `opts.provider` (Pulumi passes it on to the children).

A template that requests EFA devices (`Efa()`, DeviceClass `efa.networking.k8s.aws`) needs an EFA DRA driver:
`efa_driver` is the stack's `EfaDraDriver` (the templates then wait for it) or `"external"` when the cluster
already runs one; without either the component fails naming that fix.

Names carry through from the driver: given `driver` (a `NeuronDraDriver`), every ClaimTemplate that was given no
Drivers of its own is rendered with that driver's name and DeviceClass names and the EfaDraDriver's EFA class
(`ClaimTemplate.for_drivers`), and every `deviceClassName` of every template must be a class the driver or the
EFA driver creates (NeuronCores have none before Kubernetes 1.36): else the component fails naming the class and
the classes that exist.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi

from neuron_dra.components import core_scale
from neuron_dra.components.efa_driver import EXTERNAL, EfaDraDriver, EfaDriverRef, class_requests, missing_efa_driver
from neuron_dra.components.inputs import component_args, keyword_hints, on_cluster
from neuron_dra.components.k8s_objects import create_object, resource_name
from neuron_dra.components.settings import SettingError
from neuron_dra.components.template_like import ClaimTemplateLike as ClaimTemplateLike
from neuron_dra.components.template_like import template_key as template_key
from neuron_dra.driver.deploy import DriverDeployOptions
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.efa import EFA_DEVICE_CLASS, EFA_DRIVER

if TYPE_CHECKING:
    from neuron_dra.claim_templates import Drivers

# Raises (any exception; its message is shown) when no node of these instance types can satisfy the template.
TemplateCheck = Callable[[ClaimTemplateLike, Sequence[str]], None]


class ClaimTemplateCheckError(ValueError):
    """A claim template that the cluster's node groups cannot satisfy."""

    def __init__(self, template: str, instance_types: Sequence[str], reason: str) -> None:
        self.template = template
        self.instance_types = tuple(instance_types)
        self.reason = reason
        super().__init__(
            f"claim template {template} cannot be satisfied by the cluster's node groups "
            f"({', '.join(instance_types)}): {reason}"
        )


def default_check(template: ClaimTemplateLike, instance_types: Sequence[str], hardware: Catalog = BUILTIN) -> None:
    """The claim templates package's check: every CEL selector evaluated against the devices the driver
    publishes for each instance type, configs decoded, and an allocator simulation; raises
    TemplateCheckError unless the template fits at least one of `instance_types`. Its warnings (e.g. a
    FirstAvailable alternative no target can satisfy) go to `pulumi preview`'s output."""
    from neuron_dra.claim_templates import ClaimTemplate, TemplateCheckError, check

    report = check(template if isinstance(template, ClaimTemplate) else dict(template.to_manifest()),
                   list(instance_types), hardware)
    if not report.ok:
        raise TemplateCheckError(report)
    for issue in report.issues:
        if issue.severity == "warning":
            pulumi.log.warn(f"claim template {template_key(template)}: {issue.message}")


def module_templates(module_name: str) -> list[ClaimTemplateLike]:
    """The ClaimTemplates `module_name` defines at module level (also inside lists), in definition order."""
    from neuron_dra.claim_templates.loader import templates_in

    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SettingError("neuron-dra:claimTemplatesModule", module_name, f"an importable Python module ({e})"
                           ) from e
    return list(templates_in(vars(module)))


@keyword_hints
@dataclass(frozen=True, kw_only=True)
class ClaimTemplatesArgs:
    """Inputs of `ClaimTemplates`.

    templates: list[ClaimTemplateLike] -- neuron_dra.claim_templates.ClaimTemplate objects (or anything with
        name, namespace and to_manifest()).
    node_groups: list[TrainiumNodeGroup] -- the cluster's node groups: each template is checked against their
        instance types at their nodes' LNC (`trn2.48xlarge:lnc=1` for a group with lnc=1).
    node_pools: list[TrainiumNodePool] -- the cluster's Karpenter pools: checked against every instance type
        they may launch, at their nodes' LNC, like node groups.
    instance_types: list[str] -- instead of node_groups (an existing cluster): instance types, each optionally
        at an LNC (`trn2.48xlarge:lnc=1`).
    driver: NeuronDraDriver | None -- the templates take its driver and DeviceClass names, name only classes it
        (or the EFA driver) creates, wait for its DeviceClasses, and use its cluster's provider.
    check: callable | None -- raises when no node of the instance types can satisfy a template (default: the
        claim_templates package's own check).
    hardware: Catalog -- the instance types the default check knows (default: the built-in catalog).
    depends_on: list[pulumi.Resource] -- more resources the templates wait for.
    efa_driver: EfaDraDriver | "external" | None -- what publishes EFA devices.
    efa_targets: list[str] | None -- what templates requesting EFA devices must fit: the targets where the EFA
        DRA driver runs (None: the node groups and pools the EfaDraDriver names, or every target with
        "external" or an EfaDraDriver placed by instance type).
    allow_slow_scheduling: bool -- with a driver publishing NeuronCores on Kubernetes 1.36, deploy even where
        the predicted scheduler time per claim pod at the node groups' and pools' maximum passes 10 s.
    """

    templates: Sequence[ClaimTemplateLike]
    node_groups: Sequence[Any] = ()
    instance_types: Sequence[str] = ()
    driver: Any = None
    check: TemplateCheck | None = None  # None: `default_check` (neuron_dra.claim_templates)
    hardware: Catalog = BUILTIN  # the instance types `default_check` knows (e.g. extended by a catalog file)
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)  # e.g. the driver's DeviceClass
    efa_driver: EfaDriverRef | None = None  # what publishes EFA devices: EfaDraDriver, "external", or nothing
    node_pools: Sequence[Any] = ()
    efa_targets: Sequence[str] | None = None
    allow_slow_scheduling: bool = False
    scheduling_priced: bool = False  # the caller priced NeuronCores' scheduler cost already (the default stack)

    def __post_init__(self) -> None:
        if self.driver is not None and not hasattr(self.driver, "class_names"):
            raise SettingError("ClaimTemplatesArgs.driver", self.driver, "a NeuronDraDriver, or None")
        if self.efa_driver is not None and self.efa_driver != EXTERNAL and not isinstance(self.efa_driver,
                                                                                          EfaDraDriver):
            raise SettingError("ClaimTemplatesArgs.efa_driver", self.efa_driver,
                               f"an EfaDraDriver, '{EXTERNAL}' (the cluster runs one) or None")

    @property
    def check_targets(self) -> tuple[str, ...]:
        """What the templates are checked against: the node groups' nodes at their LNC, then instance_types."""
        groups = [g.args.check_target for g in self.node_groups]
        pools = [t for p in self.node_pools for t in p.check_targets]
        return tuple(dict.fromkeys([*groups, *pools, *self.instance_types]))

    @property
    def efa_check_targets(self) -> tuple[str, ...]:
        """Where templates that request EFA devices are checked: where the EFA DRA driver runs."""
        if self.efa_targets is not None:
            return tuple(self.efa_targets)
        efa = self.efa_driver
        if not isinstance(efa, EfaDraDriver) or efa.instance_types or not (self.node_groups or self.node_pools):
            return self.check_targets  # "external", placed by instance type, or nothing to tell groups apart
        groups = [g.args.check_target for g in self.node_groups if g.name in efa.node_groups]
        pools = [t for p in self.node_pools if p.name in efa.node_pools for t in p.check_targets]
        return tuple(dict.fromkeys([*groups, *pools]))


def device_class_refs(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(request, deviceClassName) of a ResourceClaimTemplate's requests and firstAvailable subrequests."""
    refs = []
    for request in ((manifest.get("spec") or {}).get("spec") or {}).get("devices", {}).get("requests") or []:
        if "deviceClassName" in (request.get("exactly") or {}):
            refs.append((request.get("name", ""), request["exactly"]["deviceClassName"]))
        for sub in request.get("firstAvailable") or []:
            refs.append((f"{request.get('name')}/{sub.get('name')}", sub.get("deviceClassName", "")))
    return refs


def _drivers_of(driver: Any, efa_driver: EfaDriverRef | None) -> Drivers:
    """The names templates deployed with `driver` (a NeuronDraDriver) and `efa_driver` use."""
    from neuron_dra.claim_templates import Drivers

    efa_class = efa_driver.device_class_name if isinstance(efa_driver, EfaDraDriver) else EFA_DEVICE_CLASS
    return Drivers.of(driver.class_names, efa_driver=EFA_DRIVER, efa_class=efa_class)


def _check_classes_exist(template: ClaimTemplateLike, manifest: Mapping[str, Any], created: Sequence[str],
                         driver: Any, efa_class: str) -> None:
    """Every DeviceClass the template names is one the stack creates: the error names the class, the request,
    the classes that exist and, for the NeuronCore class on a minor without it, the version rule."""
    for request, cls in device_class_refs(manifest):
        if cls in created or cls == efa_class:  # a missing EFA driver is reported with its own fix
            continue
        options = getattr(driver, "options", None)
        if cls == driver.class_names.core_device_class and options is not None and options.serves("core_device_class"):
            continue  # the minor has NeuronCores but core_partitions keeps them off: _check_cores says so
        why = ""
        if cls == driver.class_names.core_device_class and driver.core_device_class_name is None:
            why = (f"; NeuronCores (NeuronCores() requests) need Kubernetes 1.36 or newer, and the cluster runs "
                   f"{driver.kubernetes_version}: no NeuronCore DeviceClass is created there. Request whole devices "
                   f"(Neuron()) or upgrade the cluster")
        raise SettingError(f"claim template {template_key(template)} request {request} deviceClassName", cls,
                           f"a DeviceClass this stack creates ({', '.join(created)}){why}")


def _check_manifest_names(template: ClaimTemplateLike, manifest: Mapping[str, Any]) -> None:
    meta = manifest.get("metadata", {})
    if (manifest.get("apiVersion"), manifest.get("kind")) != ("resource.k8s.io/v1", "ResourceClaimTemplate"):
        raise SettingError(f"claim template {template_key(template)}", manifest.get("kind"),
                           "a resource.k8s.io/v1 ResourceClaimTemplate manifest")
    if (meta.get("namespace", "default"), meta.get("name")) != (template.namespace, template.name):
        raise SettingError(f"claim template {template_key(template)}", f"{meta.get('namespace')}/{meta.get('name')}",
                           "a manifest with the template's own namespace and name")


def _check_efa_fit(check: TemplateCheck, template: ClaimTemplateLike, targets: Sequence[str],
                   efa_targets: Sequence[str], requests: Sequence[str]) -> None:
    """A template requesting EFA devices must fit where the EFA DRA driver runs, not merely somewhere."""
    where = f"only on {', '.join(efa_targets)}" if efa_targets else "on none of them"
    try:
        if not efa_targets:
            raise ValueError("no node group or pool with EFA interfaces")
        check(template, list(efa_targets))
    except Exception as e:  # as above: a custom check's error type is not ours to know
        reason = str(e).removeprefix(f"claim template {template_key(template)}: ")
        raise ClaimTemplateCheckError(template_key(template), targets, (
            f"it requests EFA devices ({', '.join(requests)}), which the EFA DRA driver publishes {where} (the "
            f"node groups and Karpenter pools with EFA interfaces), and there it does not fit: {reason}")) from e


def _check_cores(args: ClaimTemplatesArgs, templates: Sequence[ClaimTemplateLike],
                 manifests: Sequence[Mapping[str, Any]], options: DriverDeployOptions, targets: Sequence[str]) -> None:
    """Templates requesting NeuronCores need a driver that publishes them; where it does on Kubernetes 1.36, the
    scheduler's cost at the node groups' and pools' maximum size is warned about, or refused (core_scale.py)."""
    asking = [template_key(t) for t, m in zip(templates, manifests, strict=True)
              if class_requests(m, options.core_device_class_name)]
    if asking and not options.publishes_cores:
        where = (f"on Kubernetes {options.kubernetes_version} only with DriverDeployOptions(core_partitions='on')"
                 if options.serves("core_device_class") else "from Kubernetes 1.36 (partitionable devices)")
        raise SettingError("NeuronDraDriverArgs.options.core_partitions", options.core_partitions,
                           f"on: claim template {asking[0]} requests NeuronCores (DeviceClass "
                           f"{options.core_device_class_name}), which the driver publishes {where} "
                           "(docs/neuron-cores.md §5)")
    if args.scheduling_priced:
        return
    nodes = (sum(g.args.maximum for g in args.node_groups) + sum(p.node_limit for p in args.node_pools)
             if args.node_groups or args.node_pools else None)
    core_scale.assess(options, ", ".join(f"claim template {a}" for a in asking) or "core_partitions on", nodes,
                      templates, targets, args.hardware, allowed=args.allow_slow_scheduling is True,
                      override=("ClaimTemplatesArgs.allow_slow_scheduling", args.allow_slow_scheduling),
                      instead="DriverDeployOptions(core_partitions='off')", warn=pulumi.log.warn)


class ClaimTemplates(pulumi.ComponentResource):
    """One `resource.k8s.io/v1` ResourceClaimTemplate per template object, after its check passed.

    `ClaimTemplates(name, args, opts)` or `ClaimTemplates(name, templates=..., node_groups=..., node_pools=...,
    driver=...)`.
    Outputs: names (`namespace/name`), templates (as deployed: with the driver's names), manifests, objects,
    checked_against (the instance types, at an LNC where
    one was set, that the templates were checked against).
    """

    names: list[str]
    manifests: list[dict[str, Any]]
    objects: dict[str, pulumi.CustomResource]

    def __init__(self, resource_name_: str, args: ClaimTemplatesArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> None:
        args = component_args("ClaimTemplates", ClaimTemplatesArgs, args, kwargs)
        driver = args.driver
        opts = on_cluster(getattr(driver, "cluster", None), opts)
        super().__init__("neuron-dra:index:ClaimTemplates", resource_name_, None, opts)
        targets = args.check_targets
        if not targets:
            raise SettingError("ClaimTemplatesArgs.node_groups", [],
                               "the cluster's node groups, or the instance types of an existing cluster's nodes "
                               "(instance_types)")
        depends = [*args.depends_on, *(driver.device_classes() if driver is not None else ())]
        from neuron_dra.claim_templates import ClaimTemplate

        drivers = _drivers_of(driver, args.efa_driver) if driver is not None else None
        templates = [t.for_drivers(drivers) if drivers is not None and isinstance(t, ClaimTemplate) else t
                     for t in args.templates]
        keys = [template_key(t) for t in templates]
        for key in keys:
            if keys.count(key) > 1:
                raise SettingError("ClaimTemplatesArgs.templates", key, "templates with distinct namespace/name")
        check = args.check or functools.partial(default_check, hardware=args.hardware)
        efa_class = drivers.efa_class if drivers is not None else EFA_DEVICE_CLASS
        created = [*driver.device_class_names, *([efa_class] if args.efa_driver is not None else [])] \
            if driver is not None else None
        # Each template rendered once: its checks and its object read the same dict.
        manifests = [template.to_manifest() for template in templates]
        for template, manifest in zip(templates, manifests, strict=True):
            _check_manifest_names(template, manifest)
            if created is not None:
                _check_classes_exist(template, manifest, created, driver, efa_class)
            try:
                check(template, list(targets))
            except Exception as e:  # a custom check's error type is not ours to know; its message is the point
                reason = str(e).removeprefix(f"claim template {template_key(template)}: ")
                raise ClaimTemplateCheckError(template_key(template), targets, reason) from e
        efa_targets = args.efa_check_targets
        installed = args.efa_driver.device_class_name if isinstance(args.efa_driver, EfaDraDriver) else None
        for template, manifest in zip(templates, manifests, strict=True):  # after the fit checks (they say more)
            requests = class_requests(manifest, efa_class)
            if requests and args.efa_driver is None:
                raise missing_efa_driver(template_key(template), requests, efa_class)
            if requests and set(efa_targets) != set(targets):
                _check_efa_fit(check, template, targets, efa_targets, requests)
            if requests and installed not in (None, efa_class):
                raise SettingError(f"claim template {template_key(template)}", efa_class,
                                   f"DeviceClass {installed}, the one the EfaDraDriver installs (or install it "
                                   f"with device_class_name={efa_class!r})")
        if driver is not None and getattr(driver, "options", None) is not None:
            _check_cores(args, templates, manifests, driver.options, targets)
        self.names = keys
        self.checked_against = targets
        self.templates = templates
        self.manifests = [dict(m) for m in manifests]
        self.objects = {}
        depends += [args.efa_driver.release] if isinstance(args.efa_driver, EfaDraDriver) else []
        for key, manifest in zip(keys, self.manifests, strict=True):
            self.objects[key] = create_object(resource_name(resource_name_, manifest), manifest,
                                              pulumi.ResourceOptions(parent=self, depends_on=depends))
        self.register_outputs({"names": self.names})
