"""Issue 14 items 5, 6 and 9 (claims side): CEL cost limits as the API server applies them, deep nesting, and
templates files that would otherwise pass silently (duplicate names, sys.exit). Errors name the limit hit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_dra.claim_templates import cel_env
from neuron_dra.claim_templates.cel_cost import COST_LIMIT
from neuron_dra.claim_templates.cel_env import CelCompileError, CelDevice, CelEnvironment, CelEvaluationError
from neuron_dra.claim_templates.errors import TemplateError
from neuron_dra.claim_templates.requests import Neuron

DEVICE = CelDevice.from_api("neuron.aws.com", {"name": "neuron-device-0", "attributes": {
    "resourceType": {"string": "neuron_device"}, "instanceType": {"string": "trn2.48xlarge"}}})
L100 = "[" + ",".join(str(i) for i in range(100)) + "]"
TRIPLE_ALL = f"{L100}.all(a, {L100}.all(b, {L100}.all(c, a + b + c >= 0)))"  # ~0.9 KB, 10^6 iterations


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuron_dra", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_triple_nested_all_is_refused_at_once_naming_the_cost_limit() -> None:
    start = time.monotonic()
    with pytest.raises(CelCompileError) as e:
        CelEnvironment().compile(TRIPLE_ALL)
    assert time.monotonic() - start < 5
    assert "estimated cost" in e.value.message and f"{COST_LIMIT:,}" in e.value.message
    assert "exceeds cost limit" in e.value.message
    assert len(str(e.value)) < 800  # the expression is shown cut, not whole


def test_bounded_comprehensions_stay_under_the_limit_and_evaluate() -> None:
    env = CelEnvironment()
    l20 = "[" + ",".join(str(i) for i in range(20)) + "]"
    assert env.evaluate(f"{l20}.all(a, {l20}.exists(b, a == b))", DEVICE)
    split = 'device.attributes["neuron.aws.com"].instanceType.split(".").exists(p, p == "trn2")'
    assert env.evaluate(split, DEVICE)


def test_the_wall_clock_bound_ends_a_slow_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cel_env, "EVALUATION_SECONDS", 0.05)
    expr = f"{L100}.all(a, {L100}.all(b, a + b >= 0))"  # under the cost limit, ~10^4 steps: slower than 50 ms
    start = time.monotonic()
    with pytest.raises(CelEvaluationError) as e:
        CelEnvironment().evaluate(expr, DEVICE)
    assert time.monotonic() - start < 5
    assert "wall-clock limit" in e.value.message


@pytest.mark.slow  # 60 evaluations; under load one run grew past 10 GiB inside cel-python (see the report)
def test_an_interrupted_evaluation_always_reports_the_wall_clock_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The alarm lands at a different point of cel-python each time; its cleanup then sometimes raised its own error
    ("no matching overload for '_+_' applied to (int, list)") or returned a list, 5 times in 150 before the fix."""
    expr = f"{L100}.all(a, {L100}.all(b, a + b >= 0))"
    seen = set()
    for i in range(60):
        monkeypatch.setattr(cel_env, "EVALUATION_SECONDS", 0.005 + 0.001 * i)
        with pytest.raises(CelEvaluationError) as e:
            CelEnvironment().evaluate(expr, DEVICE)
        seen.add("wall-clock limit" in e.value.message or e.value.message)
    assert seen == {True}


def test_100_nested_parentheses_give_a_clear_error_not_a_recursion_traceback() -> None:
    expr = "(" * 100 + 'device.driver == "neuron.aws.com"' + ")" * 100
    try:
        assert CelEnvironment().evaluate(expr, DEVICE) is True  # correct evaluation is fine too
    except CelEvaluationError as e:
        assert "nested too deeply" in e.message
    deeper = "(" * 3000 + "true" + ")" * 3000
    try:
        CelEnvironment().evaluate(deeper, DEVICE)
    except (CelCompileError, CelEvaluationError) as e:
        assert "nested too deeply" in str(e) or "longer than" in str(e)


@pytest.mark.process
def test_claims_check_with_the_costly_selector_says_which_limit(tmp_path: Path) -> None:
    f = tmp_path / "costly.py"
    f.write_text("from neuron_dra.claim_templates import ClaimTemplate, Neuron\n"
                 f"t = ClaimTemplate('costly', Neuron(1, selectors={TRIPLE_ALL!r}))\n")
    start = time.monotonic()
    out = run_cli("claims", "check", str(f), "--instance-type", "trn2.48xlarge")
    assert time.monotonic() - start < 60
    assert out.returncode == 2, out
    assert "estimated cost" in out.stderr and "exceeds Kubernetes' per-expression cost limit" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
def test_claims_check_with_100_parentheses_does_not_crash(tmp_path: Path) -> None:
    expr = "(" * 100 + 'device.attributes["neuron.aws.com"].resourceType == "neuron_device"' + ")" * 100
    f = tmp_path / "parens.py"
    f.write_text("from neuron_dra.claim_templates import ClaimTemplate, Neuron\n"
                 f"t = ClaimTemplate('parens', Neuron(1, selectors={expr!r}))\n")
    out = run_cli("claims", "check", str(f), "--instance-type", "trn2.48xlarge")
    assert "RecursionError" not in out.stdout + out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.returncode in (0, 1, 2)
    assert out.returncode == 0 or "nested too deeply" in out.stdout + out.stderr


@pytest.mark.process
def test_two_templates_with_one_name_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "dupes.py"
    f.write_text("from neuron_dra.claim_templates import ClaimTemplate, Neuron\n"
                 "a = ClaimTemplate('same', Neuron(1))\nb = ClaimTemplate('same', Neuron(2))\n")
    out = run_cli("claims", "check", str(f), "--instance-type", "trn2.48xlarge")
    assert out.returncode == 2 and "defined more than once: 'same'" in out.stderr, out


@pytest.mark.process
def test_a_templates_file_calling_sys_exit_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "exits.py"
    f.write_text("import sys\nfrom neuron_dra.claim_templates import ClaimTemplate, Neuron\n"
                 "a = ClaimTemplate('a', Neuron(1))\nsys.exit(0)\n")
    out = run_cli("claims", "check", str(f))
    assert out.returncode == 2 and "called sys.exit(0)" in out.stderr, out


def test_errors_echo_huge_values_capped() -> None:
    with pytest.raises(TemplateError) as e:
        Neuron(1, selectors="x" * 1_000_000)
    assert len(str(e.value)) < 1000 and "characters)" in str(e.value)


def doubling_binds(levels: int, seed: str) -> str:
    """Each bind doubles the previous string: `seed` grows to len(seed) * 2**levels characters."""
    inner = f"a{levels - 1}.size() > 0"
    for i in reversed(range(levels)):
        init = f"'{seed}'" if i == 0 else f"a{i - 1} + a{i - 1}"
        inner = f"cel.bind(a{i}, {init}, {inner})"
    return inner


def test_binds_and_repeated_operands_are_counted_so_a_2gb_selector_is_refused_unevaluated() -> None:
    """25 doublings of 64 characters: 2 GiB if evaluated. cel-go sizes a bind's variable as its init and
    `a + b` as both sizes (checker/cost.go), so the estimate grows with the string; the selector is refused
    by the estimate at compile time, never run."""
    selector = doubling_binds(25, "x" * 64)
    assert len(selector) < 1700
    with pytest.raises(CelCompileError) as e:
        CelEnvironment().compile(selector)
    assert "estimated cost" in e.value.message and f"{COST_LIMIT:,}" in e.value.message
    small = doubling_binds(4, "x" * 8)  # 128 characters: fine, and evaluated right
    assert CelEnvironment().evaluate(small, DEVICE) is True


def test_a_bound_value_used_in_a_comprehension_counts_its_size() -> None:
    # 1,000 elements bound once, ranged over by a nested `all`: 1,000 * 1,000 steps at least.
    items = "[" + ", ".join(["1"] * 1000) + "]"
    with pytest.raises(CelCompileError, match="estimated cost"):
        CelEnvironment().compile(f"cel.bind(l, {items}, l.all(x, l.all(y, x == y)))")
    few = "[" + ", ".join(["1"] * 20) + "]"
    assert CelEnvironment().evaluate(f"cel.bind(l, {few}, l.all(x, l.all(y, x == y)))", DEVICE) is True


def test_binds_are_rewritten_in_one_pass_not_one_parse_per_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling re-parsed the whole expression once per bind (quadratic: 440 nested binds ran for minutes)."""
    env = CelEnvironment()
    parses = 0
    compile_text = env._env.compile

    def counted(text: str) -> object:
        nonlocal parses
        parses += 1
        return compile_text(text)

    monkeypatch.setattr(env._env, "compile", counted)
    nested = "true"
    for i in range(12):
        nested = f"cel.bind(v{i}, {i}, v{i} >= 0 && {nested})"
    assert env.evaluate(nested, DEVICE) is True
    assert parses == 2  # the selector, then its rewrite


@pytest.mark.slow
def test_440_nested_binds_end_in_a_clear_error_in_seconds() -> None:
    nested = "true"
    for i in range(440):
        nested = f"cel.bind(v{i}, {i}, {nested})"
    assert len(nested) < cel_env.MAX_EXPRESSION_BYTES
    start = time.monotonic()
    with pytest.raises(CelCompileError) as e:
        CelEnvironment().compile(nested)
    assert time.monotonic() - start < 60 and "nested too deeply" in e.value.message
