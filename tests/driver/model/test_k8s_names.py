"""One home for Kubernetes and EKS names (driver/model/k8s_names.py): the rules the API server applies, the defaults
every part shares, and the DeviceClass manifest built once."""

from __future__ import annotations

import ast
import contextlib
import tokenize
from pathlib import Path

import pytest

from neuron_dra.claim_templates import TemplateError
from neuron_dra.claim_templates.drivers import Drivers
from neuron_dra.claim_templates.names import check_dns_label, check_labels
from neuron_dra.driver import deploy
from neuron_dra.driver.daemon.options import parse_options
from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions
from neuron_dra.driver.model import k8s_names
from neuron_dra.driver.model.efa import efa_device_class_expression
from neuron_dra.driver.model.errors import NotAllowed
from neuron_dra.localcluster.nodes.efa_emulator import efa_device_class

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("value", "label", "subdomain"), [
    ("a", True, True), ("a-b", True, True), ("a.b", False, True), ("-a", False, False), ("a-", False, False),
    ("A", False, False), ("a_b", False, False), ("", False, False), ("a" * 63, True, True), ("a" * 64, False, True),
    (".".join(["a" * 63] * 4), False, False),  # 255 characters
    (".".join(["a" * 63] * 3 + ["a" * 61]), False, True),  # 253 characters
    (7, False, False),
])
def test_dns_rules_as_apimachinery_has_them(value: object, label: bool, subdomain: bool) -> None:
    assert k8s_names.is_dns_label(value) is label
    assert k8s_names.is_dns_subdomain(value) is subdomain


@pytest.mark.parametrize(("key", "ok"), [
    ("app", True), ("example.com/app", True), ("Example.com/app", False), ("app_1.x", True), ("/app", False),
    ("a/" + "b" * 63, True), ("a/" + "b" * 64, False), ("app-", False),
])
def test_label_keys(key: str, ok: bool) -> None:
    assert k8s_names.is_label_key(key) is ok


def test_every_part_applies_the_same_rule_with_its_own_error() -> None:
    bad = "Not_A_Label"
    with pytest.raises(TemplateError) as template:
        check_dns_label("ClaimTemplate.namespace", bad)
    with pytest.raises(DeployOptionError) as option:
        DriverDeployOptions(namespace=bad)
    for error in (template.value, option.value):
        assert isinstance(error, NotAllowed) and error.allowed == k8s_names.DNS_LABEL_RULE
    with pytest.raises(DeployOptionError, match="a DRA driver name"):
        DriverDeployOptions(driver_name="a" * 64)  # a valid subdomain, too long for ResourceSlice.spec.driver
    with pytest.raises(SystemExit):
        parse_options(["--node-name", "n1", "--driver-name", "a" * 64], {})
    with pytest.raises(TemplateError) as value:
        check_labels("labels", {"app": "-x"})
    assert value.value.allowed == k8s_names.LABEL_VALUE_RULE


def test_the_daemon_and_the_deployment_default_to_the_same_names() -> None:
    options = parse_options(["--node-name", "n1"], {})
    deployed = DriverDeployOptions()
    assert options.driver_name == deployed.driver_name == Drivers().neuron_driver == k8s_names.DEFAULT_DRIVER_NAME
    assert str(options.plugins_dir) == deployed.plugins_dir == k8s_names.DEFAULT_PLUGINS_DIR
    assert str(options.registry_dir) == deployed.registry_dir == k8s_names.DEFAULT_REGISTRY_DIR
    assert str(options.cdi_root) == deployed.cdi_root == k8s_names.DEFAULT_CDI_ROOT


def test_the_device_class_manifest_is_built_once() -> None:
    options = DriverDeployOptions(driver_name="neuron.example.com", device_class_name="neurons")
    by_deploy = deploy.device_class(options)
    assert by_deploy == k8s_names.device_class_manifest(
        "neurons", "neuron.example.com", expression=k8s_names.device_class_selector("neuron.example.com", False),
        extended_resource_name=options.extended_resource_name, labels=by_deploy["metadata"]["labels"])
    assert by_deploy["spec"]["extendedResourceName"] == k8s_names.NEURON_DEVICE_RESOURCE
    drivers = Drivers(neuron_driver="neuron.example.com", neuron_class="neurons")
    neuron_class, core_class, efa_class = drivers.device_classes()
    assert neuron_class["spec"]["selectors"] == by_deploy["spec"]["selectors"]
    assert core_class["spec"]["selectors"] == deploy.core_device_class(options)["spec"]["selectors"]
    assert efa_device_class() == k8s_names.device_class_manifest(
        drivers.efa_class, drivers.efa_driver, expression=efa_device_class_expression(drivers.efa_driver))
    assert efa_class == efa_device_class()


def test_the_daemonset_tolerates_the_taint_the_nodes_carry() -> None:
    taint = k8s_names.neuron_taint()
    toleration = k8s_names.neuron_toleration()
    assert (toleration["key"], toleration["effect"]) == (taint["key"], taint["effect"])
    assert toleration["operator"] == "Exists"
    daemonset = next(m for m in deploy.manifests(DriverDeployOptions()) if m["kind"] == "DaemonSet")
    assert toleration in daemonset["spec"]["template"]["spec"]["tolerations"]


# Values whose only definition is in driver/model/k8s_names.py: no other module spells them as a literal (prose in
# docstrings and comments may mention them).
ONE_HOME: set[object] = {k8s_names.DEFAULT_DRIVER_NAME, k8s_names.DEFAULT_PLUGINS_DIR, k8s_names.DEFAULT_REGISTRY_DIR,
                         k8s_names.DEFAULT_CDI_ROOT, k8s_names.LIVENESS_SERVICE, k8s_names.DEFAULT_HEALTHCHECK_PORT,
                         k8s_names.NEURON_TAINT_KEY}
# The CDI kind is another name that happens to be spelled like the taint key.
ALLOWED = {("neuron_dra/driver/daemon/claims/cdi.py", k8s_names.NEURON_TAINT_KEY)}


def _literals(path: Path) -> set[object]:
    found: set[object] = set()
    with path.open("rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type in (tokenize.STRING, tokenize.NUMBER):
                with contextlib.suppress(ValueError, SyntaxError):
                    found.add(ast.literal_eval(token.string))
    return found


def test_names_and_defaults_have_one_home() -> None:
    offenders = []
    for part in ("neuron_dra", "bench"):
        for path in sorted((ROOT / part).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "neuron_dra/driver/model/k8s_names.py" or "/_generated/" in rel:
                continue
            offenders += [f"{rel}: {value!r}" for value in _literals(path) & ONE_HOME if (rel, value) not in ALLOWED]
    assert offenders == [], f"import these from neuron_dra.driver.model.k8s_names: {offenders}"
