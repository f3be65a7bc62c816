"""The selector CEL environment: Kubernetes' device variable, libraries, errors and the evaluation memo."""

from __future__ import annotations

import pytest

from neuron_dra.claim_templates.cel_analysis import DeviceRef, RefKind
from neuron_dra.claim_templates.cel_env import CelCompileError, CelDevice, CelEnvironment, CelEvaluationError
from neuron_dra.claim_templates.cel_types import Quantity, Semver
from neuron_dra.claim_templates.node_model import NodeCatalog

D = "device.attributes['neuron.aws.com']"
C = "device.capacity['neuron.aws.com']"


def device(**attrs: object) -> CelDevice:
    typed: dict[str, dict[str, object]] = {}
    for k, v in attrs.items():
        kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "string"
        typed[k] = {kind: v}
    typed["draDriverVersion"] = {"version": "1.4.0-rc.1"}
    attributes: dict[str, dict[str, dict[str, object]]] = {"neuron.aws.com": typed,
                                                           "resource.aws.com": {"g": {"string": "x"}}}
    return CelDevice("test/dev", "neuron.aws.com", attributes, {"neuron.aws.com": {"memory": "96Gi", "cores": "8"}})


@pytest.fixture
def env() -> CelEnvironment:
    return CelEnvironment()


@pytest.mark.parametrize(("expression", "expected"), [
    (f"{D}.family == 'trn2'", True),
    (f"{D}.deviceId == 3 && device.driver == 'neuron.aws.com'", True),
    (f"{C}.memory.compareTo(quantity('96Gi')) == 0", True),
    (f"{C}.memory == quantity('103079215104')", True),  # semantic equality of quantities
    (f"{C}.memory.isGreaterThan(quantity('64Gi')) && !{C}.memory.isLessThan(quantity('96Gi'))", True),
    (f"{C}.memory.compareTo(quantity('97Gi')) < 0", True),
    (f"{C}.cores.asInteger() == 8 && {C}.cores.isInteger() && {C}.cores.sign() == 1", True),
    (f"{C}.memory.add(quantity('1Gi')).isGreaterThan(quantity('96Gi'))", True),
    (f"{C}.cores.sub(8).sign() == 0", True),
    ("quantity('1') == quantity('1000m') && isQuantity('5Mi') && !isQuantity('5MB')", True),
    (f"{D}.draDriverVersion.isLessThan(semver('1.4.0'))", True),  # a pre-release sorts before its release
    (f"{D}.draDriverVersion.compareTo(semver('1.3.9')) == 1", True),
    (f"{D}.draDriverVersion.major() == 1 && {D}.draDriverVersion.minor() == 4", True),
    ("semver('v1.2', true) == semver('1.2.0') && isSemver('1.2.3') && !isSemver('1.2')", True),
    (f"cel.bind(a, {D}, a.family == 'trn2' && a.deviceId > 2)", True),
    (f"cel.bind(a, {D}, cel.bind(b, a.deviceId, b * 2 == 6))", True),
    (f"'deviceId' in {D} && !('nope' in {D})", True),
    ("'anything' in device.attributes['no.such.domain']", False),  # an unknown domain is an empty map
    ("device.attributes['no.such.domain'].size() == 0", True),
    (f"has({D}.deviceId) && !has({D}.nope)", True),
    (f"{D}.instanceType.startsWith('trn2.') && {D}.instanceType.split('.')[1] == '48xlarge'", True),
    (f"{D}.instanceType.upperAscii() == 'TRN2.48XLARGE' && {D}.instanceType.indexOf('.') == 4", True),
    (f"{D}.instanceType.substring(0, 4) == 'trn2' && {D}.instanceType.charAt(3) == '2'", True),
    (f"{D}.instanceType.replace('48', '3') == 'trn2.3xlarge' && ' x '.trim() == 'x'", True),
    ("['a', 'b'].join('-') == 'a-b' && [3, 1, 2].max() == 3 && [1, 2].sum() == 3 && [1, 2].isSorted()", True),
    (f"{D}.instanceType.matches('^trn[12]') && {D}.instanceType.find('[0-9]+') == '2'", True),
    (f"[1, 2, 3].exists(x, x == {D}.deviceId) && [1, 2].all(x, x > 0)", True),
    (f"{D}.deviceId == 4", False),
])
def test_selectors_evaluate_as_in_kubernetes(env: CelEnvironment, expression: str, expected: bool) -> None:
    dev = device(family="trn2", deviceId=3, instanceType="trn2.48xlarge")
    assert env.evaluate(expression, dev) is expected


@pytest.mark.parametrize(("expression", "message"), [
    (f"{D}.instanceTyp == 'x'", "no such key: instanceTyp"),
    (f"{C}.hbm.isGreaterThan(quantity('1'))", "no such key: hbm"),
    (f"{D}.deviceId == 'three'", "no matching overload for '_==_' applied to (int, string)"),
    ("quantity('1') == 1", "no matching overload"),
    ("quantity('Gi').sign() == 1", "quantities must match"),
    ("quantity('12 Gi').sign() == 1", "unable to parse quantity's suffix"),
    ("semver('1.2').major() == 1", "could not parse semver"),
    (f"{D}.family", "could not be converted to bool"),
    (f"int({D}.family) == 1", ""),
])
def test_runtime_errors_name_the_problem(env: CelEnvironment, expression: str, message: str) -> None:
    with pytest.raises(CelEvaluationError) as err:
        env.evaluate(expression, device(family="trn2", deviceId=3))
    assert message in err.value.message
    assert err.value.expression == expression and err.value.device == "test/dev"


def test_errors_short_circuit_like_cel(env: CelEnvironment) -> None:
    dev = device(deviceId=3)
    assert env.evaluate(f"{D}.nope == 1 || true", dev) is True  # CEL's commutative ||
    assert env.evaluate(f"false && {D}.nope == 1", dev) is False
    with pytest.raises(CelEvaluationError):
        env.evaluate(f"{D}.nope == 1 || false", dev)


@pytest.mark.parametrize(("expression", "message"), [
    ("device.foo == 1", "undefined field 'foo'"),
    ("frobnicate(device.driver)", "undeclared reference to function 'frobnicate'"),
    ("device.driver.frobnicate()", "undeclared reference to method 'frobnicate'"),
    ("dev.driver == 'x'", "undeclared reference to 'dev'"),
    ("device.driver == 'x' &&", "syntax error"),
    ("x" * 10241, "longer than 10240 bytes"),
])
def test_compile_errors_name_the_expression(env: CelEnvironment, expression: str, message: str) -> None:
    with pytest.raises(CelCompileError) as err:
        env.compile(expression)
    assert message in err.value.message
    assert str(err.value).startswith("CEL compile error in `")


def test_analysis_lists_what_a_selector_reads(env: CelEnvironment) -> None:
    s = env.compile(f"cel.bind(a, {D}, a.family == 'x' && 'deviceId' in a) && {C}.memory.sign() == 1 "
                    "&& device.attributes['resource.aws.com']['g'] == 'x'")
    assert s.refs == {
        DeviceRef(RefKind.ATTRIBUTE, "neuron.aws.com", "family"),
        DeviceRef(RefKind.ATTRIBUTE, "neuron.aws.com", "deviceId", presence=True),
        DeviceRef(RefKind.CAPACITY, "neuron.aws.com", "memory"),
        DeviceRef(RefKind.ATTRIBUTE, "resource.aws.com", "g"),
    }
    assert not s.analysis.opaque and not s.analysis.reads_driver
    assert env.compile(f"{D}.exists(k, k == 'x')").analysis.opaque  # iterates the map: reads everything
    assert env.compile("device.attributes[device.driver].size() > 0").analysis.opaque


@pytest.mark.slow  # 5 selectors on every device of 3 node types, each also in a fresh environment
def test_the_memo_never_changes_an_answer() -> None:
    """Evaluating with the memo (one evaluation per distinct projection) gives what fresh evaluation gives."""
    catalog = NodeCatalog()
    devices = [d for n in catalog.nodes(["trn2u.48xlarge", "inf2.24xlarge", "trn1.32xlarge"]) for d in n.devices]
    selectors = [f"{D}.resourceType == 'neuron_device'", f"'deviceId' in {D} && {D}.deviceId % 4 == 1",
                 f"{D}.exists(k, k == 'topology_x')", "device.driver == 'dra.net'",
                 "device.attributes['resource.aws.com'].devicegroup4_id.startsWith('1')"]
    memo = CelEnvironment()
    for expr in selectors:
        for d in devices:
            fresh = CelEnvironment()
            try:
                want: object = fresh.evaluate(expr, d)
            except CelEvaluationError as e:
                want = e.message
            try:
                got: object = memo.evaluate(expr, d)
            except CelEvaluationError as e:
                got = e.message
            assert got == want, (expr, d.name)
    assert memo.evaluations < len(selectors) * len(devices) / 3


def test_version_attribute_that_is_not_semver_fails_every_selector(env: CelEnvironment) -> None:
    bad = CelDevice("x", "d", {"d": {"v": {"version": "1.02.3"}}}, {})
    with pytest.raises(CelEvaluationError, match="semver"):
        env.evaluate("device.driver == 'd'", bad)


def test_quantity_and_semver_values() -> None:
    assert Quantity.parse("1.5Gi").value == 3 * 2**29
    assert Quantity.parse("2e3") == Quantity.parse("2k")
    assert Quantity.parse("100m").compare(Quantity.parse("0.1")) == 0
    with pytest.raises(ValueError):
        Quantity.parse("1KB")
    assert Semver.parse("1.0.0-alpha").compare(Semver.parse("1.0.0-alpha.1")) < 0
    assert Semver.parse("1.0.0-alpha.beta").compare(Semver.parse("1.0.0-beta")) < 0
    assert Semver.parse("1.0.0-2").compare(Semver.parse("1.0.0-11")) < 0
    assert Semver.parse("1.0.0+build.1") == Semver.parse("1.0.0")
    for bad in ("01.0.0", "1.0", "1.0.0-01"):
        with pytest.raises(ValueError):
            Semver.parse(bad)
