"""Kubernetes name rules the templates check at construction (the API server's own rules)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from neuron_dra.claim_templates.errors import TemplateError

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_dns_label(field: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > DNS_LABEL_MAX or not _DNS_LABEL.match(value):
        raise TemplateError(field, value, f"a DNS label: lowercase letters, digits and '-', starting and ending "
                                          f"with a letter or digit, at most {DNS_LABEL_MAX} characters")
    return value


def check_dns_subdomain(field: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(value):
        raise TemplateError(field, value, "a DNS subdomain: dot-separated DNS labels (lowercase letters, digits, '-'),"
                                          f" at most {DNS_SUBDOMAIN_MAX} characters")
    return value


def check_label_key(field: str, key: object) -> str:
    if not isinstance(key, str):
        raise TemplateError(field, key, "a label key string")
    prefix, _, name = key.rpartition("/")
    if prefix:
        check_dns_subdomain(f"{field} prefix", prefix)
    if len(name) > DNS_LABEL_MAX or not _LABEL_NAME.match(name):
        raise TemplateError(field, key, "a label key: an optional DNS subdomain prefix and '/', then a name of at most "
                                        "63 letters, digits, '-', '_' or '.', starting and ending alphanumeric")
    return key


def check_labels(field: str, labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Labels as a sorted tuple of pairs (frozen), every key and value checked."""
    if labels is None:
        return ()
    if not isinstance(labels, Mapping):
        raise TemplateError(field, labels, "a mapping of label keys to values")
    for k, v in labels.items():
        check_label_key(f"{field} key", k)
        if not isinstance(v, str) or len(v) > LABEL_VALUE_MAX or not _LABEL_VALUE.match(v):
            raise TemplateError(f"{field}[{k!r}]", v, "a label value: at most 63 letters, digits, '-', '_' or '.', "
                                                      "starting and ending alphanumeric (or empty)")
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


def check_qualified_name(field: str, value: object) -> str:
    """A fully qualified attribute name `domain/identifier` (what matchAttribute takes)."""
    if not isinstance(value, str) or "/" not in value:
        raise TemplateError(field, value, "a fully qualified attribute name 'domain/identifier'")
    domain, _, ident = value.partition("/")
    check_dns_subdomain(f"{field} domain", domain)
    if len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        raise TemplateError(field, value, "an identifier after the domain: a C identifier of at most 32 characters")
    return value
