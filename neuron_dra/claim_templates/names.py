"""Kubernetes name rules the templates check at construction (the API server's own rules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


def _check_pairs(field: str, pairs: Mapping[str, str] | None, what: str, value_ok: Callable[[object], bool],
                 value_rule: str) -> tuple[tuple[str, str], ...]:
    """Labels or annotations as a sorted tuple of pairs (frozen), every key and value checked."""
    if pairs is None:
        return ()
    if not isinstance(pairs, Mapping):
        raise TemplateError(field, pairs, what)
    for k, v in pairs.items():
        check_label_key(f"{field} key", k)
        if not value_ok(v):
            raise TemplateError(f"{field}[{k!r}]", v, value_rule)
    return tuple(sorted(pairs.items()))


def check_labels(field: str, labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return _check_pairs(field, labels, "a mapping of label keys to values", is_label_value, LABEL_VALUE_RULE)


def check_annotations(field: str, annotations: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return _check_pairs(field, annotations, "a mapping of annotation keys to string values",
                        lambda v: isinstance(v, str), "a string value")
