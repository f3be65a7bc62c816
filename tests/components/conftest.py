"""Fixtures of the components tests: the control plane, for the tests against a real API server, and one date for
the EKS version checks, so that a test's verdict does not change as EKS minors age (docs/kubernetes-versions.md §1)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

import pytest

from tests.support.plane import api, plane  # noqa: F401  (fixtures)

TODAY = date(2026, 12, 4)  # the day the EKS table was read


@pytest.fixture(autouse=True)
def eks_today(monkeypatch: pytest.MonkeyPatch) -> Iterator[date]:
    monkeypatch.setattr("neuron_dra.components.settings.today_utc", lambda: TODAY)
    yield TODAY
