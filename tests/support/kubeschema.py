"""kubernetes_validate's strict schema check, with each schema file parsed once per test process.

`kubernetes_validate.validate` parses the kind's schema and its version's 1.6 MB `_definitions.json` again on every
call (json.load, about 20 ms); the tests validate over a thousand manifests. The library's own loader is kept and
only memoised: the parsed schemas are read, never changed, by jsonschema.
"""

from __future__ import annotations

import functools

import kubernetes_validate
from kubernetes_validate import utils

SCHEMA_FILES_KEPT = 128  # a few versions x (definitions + the kinds the tests validate)

if not hasattr(utils.schema_contents, "cache_info"):
    utils.schema_contents = functools.lru_cache(maxsize=SCHEMA_FILES_KEPT)(utils.schema_contents)

validate = kubernetes_validate.validate
ValidationError = kubernetes_validate.ValidationError
