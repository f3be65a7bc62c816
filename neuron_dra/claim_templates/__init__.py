"""Typed claim templates: Python classes that emit resource.k8s.io/v1 ResourceClaimTemplates, checked
against the devices the driver publishes (real CEL, the driver's config decoder, an allocator simulation)."""

from neuron_dra.claim_templates.checks import (
    Checker,
    CheckReport,
    Fit,
    Issue,
    TemplateCheckError,
    check,
    check_against,
    checked_manifest,
)
from neuron_dra.claim_templates.drivers import DEFAULT_DRIVERS, Drivers
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.node_types import NodeType, NodeTypeInput
from neuron_dra.claim_templates.requests import (
    ALL,
    AnyTopology,
    AtLeast,
    Connected,
    Efa,
    FirstAvailable,
    GroupAttribute,
    Neuron,
    NeuronCores,
    RingSegment,
    TolerateUnhealthy,
    Toleration,
    UltraServerNode,
)
from neuron_dra.claim_templates.template import ClaimTemplate, OpaqueConfig, to_yaml_documents

__all__ = [
    "ALL", "DEFAULT_DRIVERS", "AnyTopology", "AtLeast", "CheckReport", "Checker", "ClaimTemplate", "Connected",
    "Drivers", "Efa", "FirstAvailable", "Fit", "GroupAttribute", "Issue", "Neuron", "NeuronCores", "NodeType",
    "NodeTypeInput", "OpaqueConfig", "RingSegment", "TemplateCheckError", "TemplateError", "TolerateUnhealthy",
    "Toleration", "UltraServerNode", "check", "check_against", "checked_manifest", "to_yaml_documents",
]
