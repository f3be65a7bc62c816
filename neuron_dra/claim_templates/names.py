"""Kubernetes name rules the templates check at construction (the API server's own rules)."""

from __future__ import annotations

from collections.abc import Mapping

from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.driver.model import k8s_names
from neuron_dra.driver.model.k8s_names import LABEL_KEY_RULE, LABEL_VALUE_RULE, is_label_key, is_label_value


def check_dns_label(field: str, value: object) -> str:
    return k8s_names.check_dns_label(field, value, TemplateError)


def check_dns_subdomain(field: str, value: object) -> str:
    return k8s_names.check_dns_subdomain(field, value, TemplateError)


def check_label_key(field: str, key: object) -> str:
    if not isinstance(key, str):
        raise TemplateError(field, key, "a label key string")
    prefix, _, _name = key.rpartition("/")
    if prefix:
        check_dns_subdomain(f"{field} prefix", prefix)  # names the prefix when it is the wrong part
    if not is_label_key(key):
        raise TemplateError(field, key, LABEL_KEY_RULE)
    return key


def check_labels(field: str, labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Labels as a sorted tuple of pairs (frozen), every key and value checked."""
    if labels is None:
        return ()
    if not isinstance(labels, Mapping):
        raise TemplateError(field, labels, "a mapping of label keys to values")
    for k, v in labels.items():
        check_label_key(f"{field} key", k)
        if not is_label_value(v):
            raise TemplateError(f"{field}[{k!r}]", v, LABEL_VALUE_RULE)
    return tuple(sorted(labels.items()))


def check_annotations(field: str, annotations: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    if annotations is None:
        return ()
    if not isinstance(annotations, Mapping):
        raise TemplateError(field, annotations, "a mapping of annotation keys to string values")
    for k, v in annotations.items():
        check_label_key(f"{field} key", k)
        if not isinstance(v, str):
            raise TemplateError(f"{field}[{k!r}]", v, "a string value")
    return tuple(sorted(annotations.items()))
