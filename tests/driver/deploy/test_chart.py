"""The Helm chart generated from deploy.manifests() (driver/deploy/chart.py, docs/helm.md).

The schema tests run without Helm; those marked gobuild build the real Helm (helm.sh/helm/v4, from the Go module
proxy) and check that `helm template` gives manifests()' objects for the same option values, that the schema
refuses bad values naming the field, and that `helm lint` and `helm package` pass.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from neuron_dra.driver.deploy import DriverDeployOptions, Manifest, manifests, object_key
from neuron_dra.driver.deploy.chart import (
    DEFAULT_GENERATION,
    default_values,
    options_from_values,
    values_schema,
    write_chart,
)


def _schema_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(values_schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]


def test_values_are_the_options_defaults() -> None:
    assert options_from_values(default_values()) == DriverDeployOptions(**DEFAULT_GENERATION)
    assert _schema_errors(default_values()) == []


def test_chart_minor_is_the_default_stacks() -> None:
    from neuron_dra.components.settings import DEFAULT_KUBERNETES_VERSION

    assert DEFAULT_GENERATION["kubernetes_version"] == DEFAULT_KUBERNETES_VERSION


@pytest.mark.parametrize(("values", "named"), [
    ({"metricsPort": "x"}, "metricsPort"),
    ({"metricsPort": 70000}, "metricsPort"),
    ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
    ({"pluginsDir": "/var/lib/kubelet/plugins/"}, "pluginsDir"),
    ({"instanceTypes": ["m5.large"]}, "instanceTypes"),
    ({"metricPort": 9400}, "metricPort"),
    ({"driverName": "Neuron.example.com"}, "driverName"),
    ({"resources": {"cpuRequest": "lots"}}, "cpuRequest"),
    ({"resources": {"cpuRequests": "1"}}, "cpuRequests"),
    ({"kubeApiQps": 0}, "kubeApiQps"),
    ({"namespace": "a.b"}, "namespace"),
    ({"podMonitor": True, "metricsPort": 0}, "metricsPort"),
    ({"ultraserverGroups": "yes"}, "ultraserverGroups"),
    ({"ultraserverSharedCounters": "on"}, "ultraserverSharedCounters"),
    ({"ultraserverGroups": True, "serviceAccount": "neuron-dra-ultraserver"}, "serviceAccount"),
])
def test_schema_refuses_a_bad_value_naming_it(values: dict[str, Any], named: str) -> None:
    errors = _schema_errors({**default_values(), **values})
    assert errors and any(named in e for e in errors), errors


def _without_labels(node: Any) -> Any:
    """`node` without any `labels` mapping (the stack adds its own to every object)."""
    if isinstance(node, dict):
        return {k: _without_labels(v) for k, v in node.items() if k != "labels"}
    if isinstance(node, list):
        return [_without_labels(x) for x in node]
    return node


def _by_key(objects: list[Manifest]) -> dict[str, Manifest]:
    return {object_key(o): o for o in objects}


# Option values the chart must render exactly as manifests() does (each changes names, shapes or both).
VALUE_SETS: list[dict[str, Any]] = [
    {},
    {"metricsPort": 9400},
    {"metricsPort": 9400, "healthcheckPort": 0, "podMonitor": True, "podMonitorLabels": {"release": "prom"},
     "metricsService": False},
    {"healthcheckPort": 0},
    {"neuronMonitor": False},  # opt-out: no monitor objects, no admin-access label on the namespace
    {"neuronMonitor": False, "labels": {"team": "ml"}, "driverName": "m.example.com"},
    {"driverName": "neuron.example.com", "image": "registry.example/neuron-dra:1", "imagePullPolicy": "Always"},
    {"driverName": "a-long-driver-name-making-the-namespace-long.example.com"},
    {"driverName": "x.example.com", "namespace": "ns1", "deviceClassName": "devs", "coreDeviceClassName": "cores",
     "serviceAccount": "sa", "daemonsetName": "ds"},
    {"extendedResourceName": None, "coreExtendedResourceName": None},
    {"labels": {"team": "ml", "app.kubernetes.io/part-of": "platform"}, "instanceTypes": ["trn2.48xlarge"]},
    {"labels": {"pod-security.kubernetes.io/enforce": "baseline", "team": ""}, "metricsPort": 9400,
     "podMonitor": True, "podMonitorLabels": {"team": "ml"}},
    {"hostPathsRoot": "/emulated/node-1", "pluginsDir": "/k/plugins", "registryDir": "/k/reg", "cdiRoot": "/cdi",
     "hostRoot": "/h"},
    {"maxSurge": 0, "maxUnavailable": 2, "priorityClassName": "high", "unhealthyTaintEffect": "NoExecute"},
    {"resources": {"cpuRequest": "100m", "memoryRequest": "64Mi", "memoryLimit": None, "cpuLimit": "1"}},
    {"resources": {"cpuRequest": "1", "memoryRequest": "1Gi", "memoryLimit": None, "cpuLimit": None}},
    {"kubeApiQps": 12.5, "kubeApiBurst": 200, "kubeApiTimeout": 33.3333333},
    {"kubeApiQps": 50, "kubeApiBurst": 1000, "kubeApiTimeout": 0.5},
    # The UltraServer group controller (deploy/ultraserver.py) beside the driver: its objects follow the driver's
    # name, namespace, image and labels.
    {"ultraserverGroups": True},
    {"ultraserverGroups": True, "ultraserverSharedCounters": "auto", "driverName": "u.example.com",
     "namespace": "ultra", "image": "registry.example/neuron-dra:2", "labels": {"team": "ml"}},
]


@pytest.fixture(scope="module")
def helm() -> Path:
    from tests.support.helm import build_helm

    return build_helm()


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chart(tmp_path_factory.mktemp("chart"))


def _run(helm: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *map(str, args)], capture_output=True, text=True, check=False)


def _template(helm: Path, chart: Path, values: dict[str, Any], tmp_path: Path) -> list[Manifest]:
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    proc = _run(helm, "template", "neuron-dra", chart, "--values", values_file)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.gobuild
@pytest.mark.process
def test_helm_lint_passes(helm: Path, chart: Path) -> None:
    proc = _run(helm, "lint", "--strict", chart)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.gobuild
@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: ",".join(v) or "defaults")
@pytest.mark.process
def test_helm_template_is_manifests(helm: Path, chart: Path, values: dict[str, Any], tmp_path: Path) -> None:
    rendered = _by_key(_template(helm, chart, values, tmp_path))
    expected = _by_key(manifests(options_from_values({**default_values(), **values})))
    assert rendered.keys() == expected.keys()  # Helm orders objects by kind (its install order)
    for key, obj in expected.items():
        assert rendered[key] == obj, key


@pytest.mark.gobuild
@pytest.mark.parametrize("fixed", [{"kubernetes_version": "1.37", "core_partitions": "auto"},
                                   {"kubernetes_version": "1.34", "core_partitions": "auto"},
                                   {"kubernetes_version": "1.36", "core_partitions": "on"}],
                         ids=lambda f: f"{f['kubernetes_version']}-{f['core_partitions']}")
@pytest.mark.parametrize("values", [{}, {"coreExtendedResourceName": None, "metricsPort": 9400},
                                    {"driverName": "x.example.com", "coreDeviceClassName": "cores"}],
                         ids=lambda v: ",".join(v) or "defaults")
@pytest.mark.process
def test_a_chart_for_another_minor_is_manifests(helm: Path, fixed: dict[str, Any], values: dict[str, Any],
                                                tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", fixed)
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["kubeVersion"] == \
        f">={fixed['kubernetes_version']}.0-0"
    rendered = _by_key(_template(helm, chart, values, tmp_path))
    expected = _by_key(manifests(options_from_values({**default_values(), **values}, fixed)))
    assert rendered.keys() == expected.keys()
    for key, obj in expected.items():
        assert rendered[key] == obj, key


@pytest.mark.gobuild
@pytest.mark.process
def test_helm_template_defaults_are_the_default_stacks_driver(helm: Path, chart: Path, tmp_path: Path) -> None:
    """`neuron-dra plan -o yaml` (the default stack under Pulumi mocks) prints the driver's objects beside the
    claim templates; with the image it is given, the chart's defaults give the same objects, labels aside."""
    import sys

    # -o yaml prints only images that exist: the default stack with a given, pinned image.
    config = tmp_path / "Pulumi.dev.yaml"
    config.write_text(f"config:\n  neuron-dra:driverImage: registry.example/neuron-dra-driver@sha256:{'ab' * 32}\n")
    plan = subprocess.run([sys.executable, "-c", "import sys; from neuron_dra.cli import main; "
                           f"sys.exit(main(['plan', '--config', {str(config)!r}, '-o', 'yaml']))"],
                          capture_output=True, text=True, check=False)
    assert plan.returncode == 0, plan.stderr
    # Without the claim templates (neuron-monitor's is the driver's: the chart renders it).
    stack = _by_key([d for d in yaml.safe_load_all(plan.stdout) if d and (
        d["kind"] != "ResourceClaimTemplate" or d["metadata"]["name"] == "neuron-monitor")])
    image = stack[next(k for k in stack if k.startswith("DaemonSet/"))]["spec"]["template"]["spec"][
        "containers"][0]["image"]
    rendered = _by_key(_template(helm, chart, {"image": image}, tmp_path))
    assert rendered.keys() == stack.keys()
    for key, obj in stack.items():
        assert _without_labels(rendered[key]) == _without_labels(obj), key


@pytest.mark.gobuild
@pytest.mark.parametrize(("values", "named"), [
    ({"metricsPort": "x"}, "metricsPort"),
    ({"metricPort": 9400}, "metricPort"),
    ({"instanceTypes": ["m5.large"]}, "instanceTypes"),
])
@pytest.mark.process
def test_helm_refuses_a_bad_value_naming_it(helm: Path, chart: Path, values: dict[str, Any], named: str,
                                            tmp_path: Path) -> None:
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    proc = _run(helm, "template", "neuron-dra", chart, "--values", values_file)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert named in proc.stderr, proc.stderr


@pytest.mark.gobuild
@pytest.mark.process
def test_helm_package_makes_the_archive(helm: Path, chart: Path, tmp_path: Path) -> None:
    proc = _run(helm, "package", chart, "--destination", tmp_path)
    assert proc.returncode == 0, proc.stderr
    archive = tmp_path / f"neuron-dra-driver-{yaml.safe_load((chart / 'Chart.yaml').read_text())['version']}.tgz"
    assert archive.is_file()
    listing = subprocess.run(["tar", "tzf", str(archive)], capture_output=True, text=True, check=True).stdout
    assert "neuron-dra-driver/values.schema.json" in listing.split()


def _live(api_client: Any, obj: Manifest) -> Manifest | None:
    """The object as the API server has it, or None."""
    from kubernetes import dynamic
    from kubernetes.dynamic.exceptions import NotFoundError

    resource = dynamic.DynamicClient(api_client).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    meta = obj["metadata"]
    try:
        got: Manifest = resource.get(name=meta["name"], namespace=meta.get("namespace")).to_dict()
    except NotFoundError:
        return None
    return got


@pytest.mark.gobuild
@pytest.mark.cluster
@pytest.mark.process
def test_helm_install_upgrade_uninstall_on_a_control_plane(helm: Path, chart: Path, plane: Any, api: Any,
                                                           tmp_path: Path) -> None:
    """The real Helm installs the chart on a real API server (every object created as rendered, the admission
    policy and DeviceClass included), upgrades it to a metrics port (the Service appears, the DaemonSet's flags
    change), and uninstalls it leaving none of its objects."""
    kube = ("--kubeconfig", plane.kubeconfig, "--namespace", "default")
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps({}))
    proc = _run(helm, "install", "neuron-dra", chart, *kube, "--values", values_file)
    assert proc.returncode == 0, proc.stderr
    installed = manifests(options_from_values(default_values()))
    for obj in installed:
        live = _live(api, obj)
        assert live is not None, object_key(obj)
        # Helm's install adds app.kubernetes.io/managed-by (the API server kubernetes.io/metadata.name).
        assert live["metadata"]["labels"].items() >= obj["metadata"]["labels"].items(), object_key(obj)
        assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    driver = _driver_daemonset(installed)
    daemonset = _live(api, driver)
    assert daemonset is not None
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["args"] == \
        driver["spec"]["template"]["spec"]["containers"][0]["args"]

    values_file.write_text(json.dumps({"metricsPort": 9400}))
    proc = _run(helm, "upgrade", "neuron-dra", chart, *kube, "--values", values_file)
    assert proc.returncode == 0, proc.stderr
    upgraded = manifests(options_from_values({**default_values(), "metricsPort": 9400}))
    service = next(o for o in upgraded if o["kind"] == "Service")
    assert _live(api, service) is not None
    daemonset = _live(api, _driver_daemonset(upgraded))
    assert daemonset is not None
    assert "--metrics-port" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]

    proc = _run(helm, "uninstall", "neuron-dra", *kube, "--wait")
    assert proc.returncode == 0, proc.stderr
    assert [object_key(o) for o in upgraded if _live(api, o) is not None] == []


def _driver_daemonset(objs: list[Manifest]) -> Manifest:
    """The driver's DaemonSet (neuron-monitor's comes after it)."""
    return next(o for o in objs if o["kind"] == "DaemonSet")


def test_release_workflow_pushes_the_chart_with_the_pinned_helm() -> None:
    from tests.support.helm import helm_version

    workflow = Path(__file__).resolve().parents[3] / ".github" / "workflows" / "release-image.yml"
    job = yaml.safe_load(workflow.read_text())["jobs"]["chart"]
    assert job["needs"] == "image"
    steps = job["steps"]
    setup = next(s for s in steps if str(s.get("uses", "")).startswith("azure/setup-helm@"))
    assert setup["with"]["version"] == helm_version()
    script = "\n".join(str(s.get("run", "")) for s in steps)
    assert "neuron-dra chart dist" in script
    assert "helm push dist/neuron-dra-driver-*.tgz oci://ghcr.io/neuron-dra/charts" in script


def test_chart_command_writes_the_chart_and_names_a_bad_option(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_dra.cli import main

    assert main(["chart", str(tmp_path), "--kubernetes-version", "1.37"]) == 0
    root = tmp_path / "neuron-dra-driver"
    assert {p.name for p in root.iterdir()} == {"Chart.yaml", "values.yaml", "values.schema.json", "templates"}
    assert yaml.safe_load((root / "Chart.yaml").read_text())["kubeVersion"] == ">=1.37.0-0"
    assert yaml.safe_load((root / "values.yaml").read_text()) == default_values()
    capsys.readouterr()
    assert main(["chart", str(tmp_path), "--core-partitions", "sometimes"]) == 1
    assert "core_partitions" in capsys.readouterr().err
