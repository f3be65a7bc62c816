"""The offline runner (components/mocks.py): a program's `pulumi.export()` values are the run's exports, and a
failed run leaves no unretrieved future behind (each was an asyncio "Future exception was never retrieved" with its
traceback when collected: 200,000+ lines over a passing test run, issue 39)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pulumi
import pytest

from neuron_dra.components import TrainiumCluster
from neuron_dra.components.mocks import run_offline
from neuron_dra.components.settings import SettingError


def test_pulumi_export_values_are_the_runs_exports() -> None:
    def program() -> None:
        pulumi.export("plain", 3)
        pulumi.export("output", pulumi.Output.from_input("x").apply(str.upper))

    assert run_offline(program).exports == {"plain": 3, "output": "X"}
    # What `exports` picks comes on top of the program's own.
    run = run_offline(program, exports=lambda _result: {"plain": 4, "more": [1]})
    assert run.exports == {"plain": 4, "output": "X", "more": [1]}


def test_a_failed_run_leaves_no_unretrieved_future(caplog: pytest.LogCaptureFixture) -> None:
    def failing() -> TrainiumCluster:
        # A bad value known only once its Output resolves: every resource that depends on it fails too.
        return TrainiumCluster("c", kubernetes_version="1.36", vpc_id=pulumi.Output.from_input("bad"),
                               private_subnet_ids=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"])

    caplog.set_level(logging.ERROR, logger="asyncio")
    for _ in range(2):
        with pytest.raises(Exception) as err:  # Pulumi wraps the SettingError
            run_offline(failing)
        cause: BaseException | None = err.value
        while cause is not None and not isinstance(cause, SettingError):
            cause = cause.__cause__ or cause.__context__
        assert cause is not None and "TrainiumClusterArgs.vpc_id" in str(cause)
        del err, cause  # their tracebacks hold the run's frames
    run_offline(lambda: None)  # a new run drops the failed runs' state
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_run_after_asyncio_run_still_has_an_event_loop() -> None:
    """asyncio.run() (as an asyncio server's test does) leaves the main thread without a current loop; the next
    offline run, in the same process, makes its own instead of failing with "no current event loop"."""
    async def nothing() -> None:
        return None

    asyncio.run(nothing())
    assert run_offline(lambda: pulumi.export("after", 1)).exports == {"after": 1}
