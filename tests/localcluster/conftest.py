"""Fixtures of the localcluster tests: the control plane, for the tests against a real API server."""

from __future__ import annotations

from tests.support.plane import api, plane  # noqa: F401  (fixtures)
