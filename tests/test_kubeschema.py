"""tests.support.kubeschema: kubernetes_validate's check with its schema files parsed once."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_validate import utils

from tests.support import kubeschema


def config_map(**data: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, **data}


def test_each_schema_file_is_parsed_once() -> None:
    kubeschema.validate(config_map(data={"a": "b"}), "1.36", strict=True)
    parsed = utils.schema_contents.cache_info().misses
    for _ in range(3):
        assert kubeschema.validate(config_map(data={"a": "b"}), "1.36", strict=True) == "1.36"
    assert utils.schema_contents.cache_info().misses == parsed


def test_the_kept_schemas_still_refuse_what_is_invalid() -> None:
    kubeschema.validate(config_map(), "1.36", strict=True)
    with pytest.raises(kubeschema.ValidationError, match="dta"):
        kubeschema.validate(config_map(dta={"a": "b"}), "1.36", strict=True)  # strict: no unknown fields
    with pytest.raises(kubeschema.ValidationError):
        kubeschema.validate(config_map(data={"a": 1}), "1.36", strict=True)  # data values are strings
