"""Waiting on a local cluster's Prometheus (`cluster up --prometheus`): a query's series once it has any, a
query gone empty, every panel of the emitted dashboard answered. The local-cluster utilisation test and the e2e
metrics test ask the same way."""

from __future__ import annotations

from typing import Any

from neuron_dra.driver.deploy.dashboard import PANELS, dashboard_json, panel_exprs
from neuron_dra.localcluster.controlplane.prometheus import query
from tests.support.e2e import eventually

Series = list[dict[str, Any]]
# What Grafana puts for $__rate_interval at a 15 s scrape; the tests' Prometheus scrapes every 2 s.
RATE_INTERVAL = "1m"


def series(url: str, expr: str, timeout: float, what: str = "") -> Series:
    """The series `expr` answers with, once it answers with any (AssertionError after `timeout` s)."""
    found: Series = eventually(lambda: query(url, expr) or None, timeout, what=what or expr)
    return found


def gone(url: str, expr: str, timeout: float, what: str = "") -> None:
    """Wait until `expr` answers with no series."""
    eventually(lambda: not query(url, expr) or None, timeout, what=what or f"no series for {expr}")


def dashboard_answers(url: str, timeout: float) -> dict[str, Series]:
    """Each query of the emitted dashboard (its expression, as the dashboard has it) -> the series it answers with,
    waiting up to `timeout` s for each to answer with data."""
    exprs = panel_exprs(dashboard_json())
    assert len(exprs) == sum(len(p.queries) for p in PANELS)
    answers: dict[str, Series] = {}
    for title, expr in exprs:
        concrete = expr.replace("$__rate_interval", RATE_INTERVAL)
        answers[expr] = series(url, concrete, timeout, what=f"data for panel {title!r}: {concrete}")
    return answers


def values(answer: Series, *labels: str) -> dict[tuple[str, ...], float]:
    """A query's answer as {(its `labels`' values): the sample's value}."""
    return {tuple(s["metric"][k] for k in labels): float(s["value"][1]) for s in answer}
