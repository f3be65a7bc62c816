"""Run generated allocator cases through both allocators and compare the answers.

The Python side is `neuron_dra.claim_templates.allocator.simulate` in this process; the Go side is
kube-scheduler's allocator through `tests.support.allocsim.run_cases` (one process per batch).
An answer is (satisfiable, count, error or not); a Go answer whose error is the filter timeout is its own
verdict, neither agreement nor disagreement.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.claim_templates.allocator import Mode, Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.node_model import NodeCatalog
from tests.support.allocator_cases import MODES, Case, node_labels
from tests.support.allocsim import run_cases


@dataclass(frozen=True)
class Answer:
    satisfiable: bool
    count: int
    error: str  # empty: none
    seconds: float  # Python: time in simulate; Go: the allocator's own time (`nanos`)

    @property
    def timeout(self) -> bool:
        return self.error.startswith("timeout:")

    def key(self) -> tuple[bool, int, bool]:
        return (self.satisfiable, self.count, bool(self.error))

    def brief(self) -> str:
        error = f", error: {self.error[:160]}" if self.error else ""
        return f"satisfiable={self.satisfiable} count={self.count}{error}"


@dataclass(frozen=True)
class Verdict:
    case: Case
    mode: Mode
    python: Answer
    go: Answer

    @property
    def kind(self) -> str:
        if self.go.timeout:
            return "go-timeout"
        return "agree" if self.python.key() == self.go.key() else "disagree"

    def describe(self) -> str:
        return (f"{self.case.describe()}\n  mode {self.mode}: python {self.python.brief()}\n"
                f"  {' ' * len(self.mode)}       go     {self.go.brief()}")


def runs(cases: Sequence[Case]) -> list[tuple[Case, Mode]]:
    """Every case in both modes, in the order the answers come back."""
    return [(case, mode) for case in cases for mode in MODES]


def python_answers(cases: Sequence[Case], catalog: NodeCatalog, cel: CelEnvironment,
                   *, reuse_simulators: bool = True) -> list[Answer]:
    """simulate() on every run. With reuse_simulators one Simulator per node serves all its cases (as the
    claim checks use it); otherwise every run builds its own (pools, selection cache)."""
    simulators: dict[str, Simulator] = {}
    out = []
    for case, mode in runs(cases):
        node = catalog.node(case.instance_type)
        slices = case.node_slices(node)
        labels = node_labels(node)
        started = time.perf_counter()
        simulator = None
        if case.slices is None and reuse_simulators:
            simulator = simulators.get(case.instance_type)
            if simulator is None:
                simulator = simulators[case.instance_type] = Simulator(
                    slices, node.device_classes, node.node_name, labels, cel)
        result = simulate(slices, node.device_classes, list(case.claims), node_name=node.node_name,
                          node_labels=labels, allocated=case.allocated, mode=mode, cel=cel, simulator=simulator)
        out.append(Answer(result.satisfiable, result.count, result.error or "", time.perf_counter() - started))
    return out


@dataclass(frozen=True)
class GoRun:
    answers: list[Answer]
    wall_seconds: float  # all batches, process start and JSON included
    batches: int


def go_answers(cases: Sequence[Case], catalog: NodeCatalog, *, batches: int = 2) -> GoRun:
    """run_cases on every run, split into `batches` allocsim processes that run at the same time."""
    inputs = [case.go_input(catalog.node(case.instance_type), mode) for case, mode in runs(cases)]
    size = -(-len(inputs) // batches)
    chunks = [inputs[i:i + size] for i in range(0, len(inputs), size)]
    results: list[list[dict[str, Any]] | BaseException] = [[] for _ in chunks]

    def run(i: int) -> None:
        try:
            results[i] = run_cases(chunks[i])
        except BaseException as e:  # handed to the caller below
            results[i] = e

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    answers = []
    for chunk, got in zip(chunks, results, strict=True):
        if isinstance(got, BaseException):
            raise got
        for sent, r in zip(chunk, got, strict=True):
            if r["id"] != sent["id"]:
                raise AssertionError(f"allocsim answered {r['id']} for {sent['id']}")
            answers.append(Answer(r["satisfiable"], r["count"], r["error"], r["nanos"] / 1e9))
    return GoRun(answers, wall, len(chunks))


def compare(cases: Sequence[Case], python: Sequence[Answer], go: Sequence[Answer]) -> list[Verdict]:
    return [Verdict(case, mode, p, g) for (case, mode), p, g in zip(runs(cases), python, go, strict=True)]


def summary(verdicts: Sequence[Verdict]) -> str:
    """Runs per category: verdicts and what the answers were."""
    rows: dict[str, Counter[str]] = {}
    for v in verdicts:
        row = rows.setdefault(v.case.category, Counter())
        row[v.kind] += 1
        if v.kind != "go-timeout":
            row["satisfiable" if v.go.satisfiable else "unsatisfiable"] += 1
            row["error"] += bool(v.go.error)
    columns = ["agree", "disagree", "go-timeout", "satisfiable", "unsatisfiable", "error"]
    lines = [f"{'category':<16}{'runs':>6}" + "".join(f"{c:>15}" for c in columns)]
    total: Counter[str] = Counter()
    for category in sorted(rows):
        row = rows[category]
        total.update(row)
        lines.append(f"{category:<16}{sum(row[k] for k in columns[:3]):>6}" + "".join(f"{row[c]:>15}" for c in columns))
    lines.append(f"{'total':<16}{sum(total[k] for k in columns[:3]):>6}" + "".join(f"{total[c]:>15}" for c in columns))
    return "\n".join(lines)
