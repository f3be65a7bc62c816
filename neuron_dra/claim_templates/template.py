"""`ClaimTemplate`: a named set of typed requests that renders to a resource.k8s.io/v1 ResourceClaimTemplate."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.keywords import keyword_hints
from neuron_dra.claim_templates.names import check_annotations, check_dns_label, check_dns_subdomain, check_labels
from neuron_dra.claim_templates.requests import (
    MAX_COUNT,
    Efa,
    FirstAvailable,
    Neuron,
    NeuronCores,
    Request,
    UltraServerNode,
    check_distinct,
    default_group,
    opaque_config,
)
from neuron_dra.driver.model import config as driver_config
from neuron_dra.driver.model.catalog import BUILTIN, Catalog
from neuron_dra.driver.model.slices import AWS_DOMAIN

API_VERSION = "resource.k8s.io/v1"
MAX_REQUESTS = 32
MAX_CONFIGS = 32
MAX_OPAQUE_PARAMETERS_BYTES = 10 * 1024


@keyword_hints
@dataclass(frozen=True)
class OpaqueConfig:
    """A raw opaque config (escape hatch); for this driver it is decoded by the driver's own code."""

    parameters: Mapping[str, Any]
    requests: tuple[str, ...] = ()  # empty: every request
    driver: str | None = None  # None: the Neuron driver

    def __hash__(self) -> int:
        return hash((repr(sorted(self.parameters.items())), self.requests, self.driver))


@keyword_hints
@dataclass(frozen=True, init=False)
class ClaimTemplate:
    """A ResourceClaimTemplate: `ClaimTemplate("name", Neuron(4, topology=Connected()), namespace="ml")`."""

    name: str
    requests: tuple[Request, ...]
    namespace: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    claim_labels: tuple[tuple[str, str], ...]  # labels of the ResourceClaims made from the template
    configs: tuple[OpaqueConfig, ...]
    drivers: Drivers
    # No Drivers given: the names of the driver it is deployed with (ClaimTemplates renders it `for_drivers` of
    # that driver); until then DEFAULT_DRIVERS.
    follows_driver: bool

    def __init__(self, name: str, *items: Request, requests: Sequence[Request] = (), namespace: str = "default",
                 labels: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
                 annotations: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
                 claim_labels: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
                 configs: Sequence[OpaqueConfig] = (), drivers: Drivers | None = None) -> None:
        check_dns_subdomain("ClaimTemplate.name", name)
        check_dns_label("ClaimTemplate.namespace", namespace)
        all_requests = (*items, *requests)
        if not 1 <= len(all_requests) <= MAX_REQUESTS:
            raise TemplateError("ClaimTemplate.requests", len(all_requests), f"1 to {MAX_REQUESTS} requests")
        for r in all_requests:
            if not isinstance(r, Neuron | UltraServerNode | Efa | FirstAvailable | NeuronCores):
                raise TemplateError("ClaimTemplate.requests", r,
                                    "Neuron, NeuronCores, UltraServerNode, Efa or FirstAvailable")
        check_distinct("ClaimTemplate.requests", [r.name for r in all_requests], "distinct request names (name=...)")
        if drivers is not None and not isinstance(drivers, Drivers):
            raise TemplateError("ClaimTemplate.drivers", drivers, "a Drivers(...) value, or None (the driver's)")
        values = {"name": name, "requests": all_requests, "namespace": namespace,
                  "labels": check_labels("ClaimTemplate.labels", _mapping(labels)),
                  "annotations": check_annotations("ClaimTemplate.annotations", _mapping(annotations)),
                  "claim_labels": check_labels("ClaimTemplate.claim_labels", _mapping(claim_labels)),
                  "configs": tuple(configs), "drivers": drivers or DEFAULT_DRIVERS, "follows_driver": drivers is None}
        for key, value in values.items():
            object.__setattr__(self, key, value)
        self._check_alignment()
        self._check_efa_counts()
        self._check_configs()
        self._check_total(all_requests)

    def _check_total(self, requests: Sequence[Request]) -> None:
        """The API allocates at most MAX_COUNT devices to one claim (its results list): name the template, what
        each request adds and the fix."""
        total = sum(r.max_devices() for r in requests)
        if total <= MAX_COUNT:
            return
        parts = ", ".join(f"{r.name} {r.max_devices()}" for r in requests)
        raise TemplateError(f"ClaimTemplate {self.name!r} requests", f"{total} devices ({parts})",
                            f"at most {MAX_COUNT} devices per claim (the API's limit on a claim's results); split "
                            "the requests over two templates and give the pod both claims, e.g. the EFAs in one "
                            "and the Neuron devices in the other")

    def for_drivers(self, drivers: Drivers) -> ClaimTemplate:
        """This template as deployed with `drivers` (the names of the driver a ClaimTemplates component is
        given): rendered with their driver and DeviceClass names when it was given no Drivers of its own, else
        itself (its own names stand, and are checked against the classes that exist)."""
        if not self.follows_driver or drivers == self.drivers:
            return self
        return self._with(drivers=drivers)

    def in_namespace(self, namespace: str) -> ClaimTemplate:
        """This template in another namespace, still following the driver if it did."""
        return self._with(namespace=namespace)

    def _with(self, **changes: Any) -> ClaimTemplate:
        """A copy built by the constructor (so it is checked again) with `changes` to its keywords; a template
        that follows its driver keeps doing so (`dataclasses.replace` would pass the derived field)."""
        keywords: dict[str, Any] = {
            "requests": self.requests, "namespace": self.namespace, "labels": self.labels,
            "annotations": self.annotations, "claim_labels": self.claim_labels, "configs": self.configs,
            "drivers": None if self.follows_driver else self.drivers, **changes}
        return ClaimTemplate(self.name, **keywords)

    def _neuron_requests(self) -> dict[str, Neuron | FirstAvailable]:
        return {r.name: r for r in self.requests if isinstance(r, Neuron | FirstAvailable)}

    def _check_alignment(self) -> None:
        neurons = self._neuron_requests()
        for r in self.requests:
            if isinstance(r, Efa) and r.aligned_to is not None and r.aligned_to not in neurons:
                raise TemplateError("Efa.aligned_to", r.aligned_to,
                                    f"the name of a Neuron request of this template ({', '.join(neurons) or 'none'}),"
                                    " or None for an unaligned EFA request")

    def _pinned_types(self) -> tuple[tuple[str, ...], Catalog] | None:
        """The instance types the claim can land on when its requests name them (every request that names types
        must be satisfied on the same node), with the catalog they come from; None when none names any."""
        pinned: tuple[str, ...] | None = None
        catalog = BUILTIN
        for r in self.requests:
            options = r.options if isinstance(r, FirstAvailable) else (r,)
            named = [o for o in options if isinstance(o, Neuron | NeuronCores) and (o.instance_types or o.families)]
            if not named or len(named) != len(options):
                continue  # an alternative without instance types may land anywhere
            catalog = named[0].catalog
            targets = tuple(dict.fromkeys(t for o in named for t in o.target_types))
            pinned = targets if pinned is None else tuple(t for t in pinned if t in targets)
        return None if pinned is None else (pinned, catalog)

    def _check_efa_counts(self) -> None:
        """EFA requests above what every instance type the claim may land on has are refused here, naming the
        count (the EFA driver publishes one device per EFA wired to Neuron devices, node_model.py)."""
        efas = [r for r in self.requests if isinstance(r, Efa)]
        found = self._pinned_types() if efas else None
        if found is None:
            return
        types, catalog = found
        counts = {t: len(set(catalog.types[t].device_efa_bdfs)) for t in types}
        most = max(counts.values(), default=0)
        have = ", ".join(f"{t} has {n}" for t, n in counts.items())
        if most == 0:
            raise TemplateError("Efa.count", efas[0].count, f"no Efa request: the instance types this claim may land "
                                f"on have no EFA devices of their own ({', '.join(types)})")
        for r in efas:
            if r.count > most:
                raise TemplateError("Efa.count", r.count, f"1 to {most} ({have} EFA devices)")
        total = sum(r.count for r in efas)
        if total > most:
            raise TemplateError("ClaimTemplate.requests", f"{total} EFA devices",
                                f"at most {most} EFA devices in all ({have} EFA devices)")

    def _check_configs(self) -> None:
        if len(self.configs) > MAX_CONFIGS:
            raise TemplateError("ClaimTemplate.configs", len(self.configs), f"at most {MAX_CONFIGS} configs")
        known = set(self._request_refs())
        for cfg in self.configs:
            if not isinstance(cfg, OpaqueConfig):
                raise TemplateError("ClaimTemplate.configs", cfg, "OpaqueConfig(parameters, requests=...)")
            for ref in cfg.requests:
                if ref not in known:
                    raise TemplateError("OpaqueConfig.requests", ref, ", ".join(sorted(known)))
            if cfg.driver in (None, self.drivers.neuron_driver):
                try:
                    driver_config.decode(dict(cfg.parameters))
                except driver_config.ConfigError as e:
                    raise e.restated(TemplateError, f"OpaqueConfig.parameters.{e.field}") from e
            if len(yaml.safe_dump(dict(cfg.parameters)).encode()) > MAX_OPAQUE_PARAMETERS_BYTES:
                raise TemplateError("OpaqueConfig.parameters", "...", f"at most {MAX_OPAQUE_PARAMETERS_BYTES} bytes")

    def _request_refs(self) -> list[str]:
        refs = []
        for r in self.requests:
            refs.append(r.name)
            if isinstance(r, FirstAvailable):
                refs += [f"{r.name}/{o.name}" for o in r.options]
        return refs

    def claim_spec(self) -> dict[str, Any]:
        """The ResourceClaimSpec."""
        requests, constraints, configs = [], [], []
        neurons = self._neuron_requests()
        merged: set[str] = set()  # Neuron requests whose own group constraint an EFA alignment covers
        alignments = []
        for r in self.requests:
            if isinstance(r, Efa) and r.aligned_to is not None:
                target = neurons[r.aligned_to]
                attribute = f"{AWS_DOMAIN}/devicegroup{_alignment_group(r, target)}_id"
                if isinstance(target, Neuron) and target.group_attribute(self.drivers) == attribute:
                    merged.add(target.name)
                alignments.append({"requests": [r.aligned_to, r.name], "matchAttribute": attribute})
        for r in self.requests:
            rendered = r.render(self.drivers)
            requests.append(rendered.request)
            if r.name not in merged:
                constraints += rendered.constraints
            configs += rendered.configs
        constraints += alignments
        for cfg in self.configs:
            configs.append(opaque_config(cfg.driver or self.drivers.neuron_driver, cfg.requests, dict(cfg.parameters)))
        devices: dict[str, Any] = {"requests": requests}
        if constraints:
            devices["constraints"] = constraints
        if configs:
            devices["config"] = configs
        return {"devices": devices}

    def to_manifest(self) -> dict[str, Any]:
        """The exact resource.k8s.io/v1 ResourceClaimTemplate: rendered once per template object (the checks,
        the stack's NeuronCore choice and the deployed object read the same rendering), a fresh copy each call."""
        rendered = self.__dict__.get("_rendered")
        if rendered is None:
            rendered = self._render()
            object.__setattr__(self, "_rendered", rendered)
        return copy.deepcopy(rendered)

    def _render(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        spec: dict[str, Any] = {}
        if self.claim_labels:
            spec["metadata"] = {"labels": dict(self.claim_labels)}
        spec["spec"] = self.claim_spec()
        return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata, "spec": spec}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_manifest(), sort_keys=False)


def _mapping(value: Mapping[str, str] | Sequence[tuple[str, str]] | None) -> Mapping[str, str] | None:
    if value is None or isinstance(value, Mapping):
        return value
    return dict(value)


def _alignment_group(efa: Efa, target: Neuron | FirstAvailable) -> int:
    if efa.group is not None:
        return efa.group
    if isinstance(target, FirstAvailable):
        first = target.options[0]
        if isinstance(first, NeuronCores):
            return 1  # cores sit on one device: its own EFA
        target = first
    size = target.group_size
    return default_group(size if size is not None else (target.count if isinstance(target.count, int) else 16))


def to_yaml_documents(templates: Sequence[ClaimTemplate]) -> str:
    """Multi-document YAML of the templates, in order."""
    return yaml.safe_dump_all([t.to_manifest() for t in templates], sort_keys=False)
