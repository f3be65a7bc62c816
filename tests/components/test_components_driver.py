"""NeuronDraDriver under Pulumi mocks: it applies exactly driver/deploy/manifests.py's dicts, in a safe order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from neuron_dra import __version__
from neuron_dra.components import driver_image
from neuron_dra.components.driver import NeuronDraDriver, NeuronDraDriverArgs
from neuron_dra.components.mocks import OfflineRun, run_offline
from neuron_dra.components.settings import SettingError
from neuron_dra.driver import deploy
from neuron_dra.driver.deploy import DriverDeployOptions
from tests.support import kubeschema

IMAGE = "registry.example.com/neuron-dra-driver:0.1.0"
OPTIONS = DriverDeployOptions(namespace="accel", metrics_port=9400)


def run_driver(args: NeuronDraDriverArgs) -> OfflineRun[NeuronDraDriver]:
    def program() -> NeuronDraDriver:
        provider = k8s.Provider("target", kubeconfig="{}")
        return NeuronDraDriver("drv", args, opts=pulumi.ResourceOptions(provider=provider))

    return run_offline(program, exports=lambda d: {"image": d.image})


def k8s_objects(run: OfflineRun[Any]) -> dict[str, Any]:
    found = {}
    for r in run.resources:
        if r.type.startswith("kubernetes:"):
            found[deploy.object_key(r.plain_inputs)] = r
    return found


def test_applies_exactly_the_deploy_manifests() -> None:
    run = run_driver(NeuronDraDriverArgs(options=OPTIONS, image=IMAGE))
    objects = k8s_objects(run)
    expected = {deploy.object_key(m): m for m in deploy.manifests(OPTIONS.replace(image=IMAGE))}
    assert set(objects) == set(expected) and len(expected) == 13  # with the metrics port: its Service
    for key, manifest in expected.items():
        sent = objects[key].plain_inputs
        assert sent == manifest, key
        kubeschema.validate(sent, "1.34", strict=True)
    assert run.exports["image"] == IMAGE
    # No AWS resources when the image is given.
    assert not [r for r in run.resources if r.type.startswith(("aws:", "docker-build:"))]


def test_every_object_goes_through_the_given_provider_and_waits_for_what_it_needs() -> None:
    run = run_driver(NeuronDraDriverArgs(options=OPTIONS, image=IMAGE))
    provider = run.one("pulumi:providers:kubernetes", "target")
    objects = k8s_objects(run)
    assert all(r.provider.startswith(provider.urn + "::") for r in objects.values())
    urns: dict[str, list[str]] = {}
    for key, r in objects.items():
        urns.setdefault(key.split("/")[0], []).append(r.urn)
    urn = {kind: found[-1] for kind, found in urns.items()}
    ds = objects["DaemonSet/accel/neuron-dra-driver-kubelet-plugin"]
    # The policy, the RBAC and the service account exist before the driver's pods write ResourceSlices;
    # every DeviceClass (whole devices and, on 1.36+, NeuronCores) exists before the driver publishes.
    assert len(urns["DeviceClass"]) == 2
    for kind in ("Namespace", "ServiceAccount", "ClusterRoleBinding", "ValidatingAdmissionPolicyBinding",
                 "NetworkPolicy", "DeviceClass"):
        for one in urns[kind]:
            assert one in ds.dependencies, (kind, one)
    assert urn["ClusterRole"] in objects[f"ClusterRoleBinding/{OPTIONS.cluster_role_name}"].dependencies
    assert urn["Namespace"] in objects["ServiceAccount/accel/neuron-dra-driver-sa"].dependencies


def test_neuron_monitors_daemonset_comes_after_the_drivers_and_its_claim_template() -> None:
    options = OPTIONS.replace(kubernetes_version="1.36")
    assert options.runs_neuron_monitor
    objects = k8s_objects(run_driver(NeuronDraDriverArgs(options=options, image=IMAGE)))
    monitor = objects["DaemonSet/accel/neuron-monitor"]
    driver = objects["DaemonSet/accel/neuron-dra-driver-kubelet-plugin"]
    assert objects["ResourceClaimTemplate/accel/neuron-monitor"].urn in monitor.dependencies
    assert objects["Namespace/accel"].urn in objects["ResourceClaimTemplate/accel/neuron-monitor"].dependencies
    # Destroyed before the driver (whose pods unprepare the monitor's claims), and awaited as the driver's.
    assert driver.urn in monitor.dependencies and monitor.urn not in driver.dependencies
    assert "annotations" not in monitor.plain_inputs["metadata"]
    skipped = k8s_objects(run_driver(NeuronDraDriverArgs(options=options, image=IMAGE, rollout_timeout_seconds=0)))
    for name in ("neuron-monitor", "neuron-dra-driver-kubelet-plugin"):
        annotations = skipped[f"DaemonSet/accel/{name}"].plain_inputs["metadata"]["annotations"]
        assert annotations == {"pulumi.com/skipAwait": "true"}, name


def build_context(root: Path) -> Path:
    """A minimal build context: the files driver_image.CONTEXT_FILES names and a driver tree."""
    for rel in (*driver_image.CONTEXT_FILES, driver_image.CONTEXT_TREE / "model" / "x.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    return root


def test_without_an_image_it_builds_and_pushes_to_an_ecr_repository_it_owns(tmp_path: Path) -> None:
    context = build_context(tmp_path)
    run = run_driver(NeuronDraDriverArgs(options=OPTIONS, source_dir=context))
    repo = run.one("aws:ecr/repository:Repository")
    assert repo.plain_inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repo.plain_inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.plain_inputs["encryptionConfigurations"] == [{"encryptionType": "AES256"}]
    assert repo.plain_inputs["forceDelete"] is False  # destroy keeps a repository holding images unless asked
    policy = run.one("aws:ecr/lifecyclePolicy:LifecyclePolicy").plain_inputs
    (rule,) = json.loads(policy["policy"])["rules"]
    assert rule["selection"]["countType"] == "imageCountMoreThan" and rule["action"] == {"type": "expire"}
    assert rule["selection"]["countNumber"] == driver_image.KEEP_IMAGES and rule["selection"]["tagStatus"] == "tagged"
    image = run.one("docker-build:index:Image").plain_inputs
    assert image["push"] is True and image["buildOnPreview"] is False
    staged = f".neuron-dra/driver-image/{driver_image.context_tag(context)}"  # relative: no path of this machine
    assert image["context"] == {"location": staged}
    assert image["dockerfile"] == {"location": f"{staged}/neuron_dra/driver/Dockerfile"}
    assert image["platforms"] == ["linux/amd64"]
    (tag,) = image["tags"]
    registry = image["registries"][0]
    assert tag == f"{registry['address']}:{driver_image.context_tag(context)}"
    assert tag.split(":")[-1].startswith(f"{__version__}-")
    assert registry["username"] == "AWS" and registry["password"]
    # The DaemonSet runs the pushed build, pinned by digest.
    ds = k8s_objects(run)["DaemonSet/accel/neuron-dra-driver-kubelet-plugin"].plain_inputs
    ref = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert ref == run.exports["image"] and ref.startswith(tag + "@sha256:") and driver_image.is_pinned(ref)
    assert ds["spec"] == deploy.daemonset(OPTIONS.replace(image=ref))["spec"]
    assert [i.token for i in run.invokes] == ["aws:ecr/getAuthorizationToken:getAuthorizationToken"]
    forced = run_driver(NeuronDraDriverArgs(options=OPTIONS, source_dir=context, force_delete_repository=True))
    assert forced.one("aws:ecr/repository:Repository").plain_inputs["forceDelete"] is True


def test_the_tag_follows_the_build_context_and_only_it(tmp_path: Path) -> None:
    context = build_context(tmp_path)
    first = driver_image.context_tag(context)
    (context / "neuron_dra" / "driver" / "__pycache__").mkdir()
    (context / "neuron_dra" / "driver" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert driver_image.context_tag(context) == first  # what the dockerignore leaves out does not count
    (context / "neuron_dra" / "driver" / "model" / "x.py").write_text("changed = True\n")
    assert driver_image.context_tag(context) != first  # immutable tags: a changed driver is a new tag


def test_without_a_build_context_the_error_names_what_is_missing_and_the_way_out(tmp_path: Path) -> None:
    (tmp_path / "neuron_dra" / "driver").mkdir(parents=True)
    (tmp_path / "neuron_dra" / "driver" / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(SettingError) as err:
        run_driver(NeuronDraDriverArgs(options=OPTIONS, source_dir=tmp_path))
    assert err.value.setting == "NeuronDraDriverArgs.source_dir" and err.value.value == str(tmp_path)
    assert "neuron_dra/driver/image-requirements.txt" in err.value.allowed
    assert "neuron_dra/driver/Dockerfile.dockerignore" in err.value.allowed
    assert "neuron-dra:driverImage" in err.value.allowed


@pytest.mark.parametrize("image", [
    "registry.example.com/neuron-dra-driver@sha256:" + "a" * 64,
    "registry.example.com:5000/team/neuron-dra-driver:0.1.0@sha256:" + "0" * 64,
])
def test_a_given_digest_is_used_as_given_and_pinned(image: str, caplog: pytest.LogCaptureFixture) -> None:
    run = run_driver(NeuronDraDriverArgs(options=OPTIONS, image=image))
    assert run.exports["image"] == image
    assert not [r for r in run.resources if r.type.startswith(("aws:", "docker-build:"))]
    assert "names a tag" not in caplog.text


def test_a_tag_only_image_floats_and_preview_says_so(caplog: pytest.LogCaptureFixture) -> None:
    run = run_driver(NeuronDraDriverArgs(options=OPTIONS, image=IMAGE))
    assert run.exports["image"] == IMAGE
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(IMAGE in w and "names a tag, not a digest" in w and "@sha256:" in w for w in warning), warning


@pytest.mark.parametrize("image", ["", "has space:1", "Registry/UPPER:1", "repo@sha256:short",
                                   "repo@md5:" + "a" * 32])
def test_a_bad_image_reference_names_the_setting(image: str) -> None:
    with pytest.raises(SettingError) as err:
        NeuronDraDriverArgs(image=image)
    assert "neuron-dra:driverImage" in err.value.setting and err.value.value == image
    assert "@sha256:" in err.value.allowed


def test_the_package_directory_is_a_complete_build_context() -> None:
    # This checkout, as the default context: the Dockerfile and everything it copies, admitted by its ignore file.
    root = Path(__file__).resolve().parents[2]
    assert NeuronDraDriverArgs().build_context() == root
    ignore = (root / driver_image.DOCKERIGNORE).read_text()
    dockerfile = (root / driver_image.DOCKERFILE).read_text()
    copied = {line.split()[i] for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line
              for i in range(1, len(line.split()) - 1)}
    assert copied == {"neuron_dra/driver/image-requirements.txt", "neuron_dra/__init__.py", "neuron_dra/py.typed",
                      "neuron_dra/driver/"}
    admitted = [line[1:] for line in ignore.splitlines() if line.startswith("!")]
    assert "*" in ignore.splitlines()  # everything else stays out of the context
    for path in copied:
        assert (root / path).exists(), path
        assert any(path.rstrip("/") == a or path.startswith(a + "/") for a in admitted), (path, admitted)


@pytest.mark.parametrize(("version", "cores", "classes", "mapped", "taint_env"), [
    ("1.34", "auto", ["neuron.aws.com"], False, False),
    ("1.35", "on", ["neuron.aws.com"], False, False),  # no partitionable devices: on changes nothing
    # 1.36: NeuronCores (and their class) only when asked for: the scheduler's counter cost (docs/scale.md §2)
    ("1.36", "auto", ["neuron.aws.com"], True, True),
    ("1.36", "on", ["neuron.aws.com", "neuroncore.aws.com"], True, True),
    ("1.37", "auto", ["neuron.aws.com", "neuroncore.aws.com"], True, True),
    ("1.37", "off", ["neuron.aws.com"], True, True),
])
def test_renders_what_the_clusters_minor_serves(version: str, cores: str, classes: list[str], mapped: bool,
                                                taint_env: bool) -> None:
    run = run_driver(NeuronDraDriverArgs(image=IMAGE, kubernetes_version=version,
                                         options=DriverDeployOptions(core_partitions=cores)))
    objects = k8s_objects(run)
    found = sorted(k.split("/", 1)[1] for k in objects if k.startswith("DeviceClass/"))
    assert found == classes
    for key in (k for k in objects if k.startswith("DeviceClass/")):
        assert ("extendedResourceName" in objects[key].plain_inputs["spec"]) is mapped
    ds = objects["DaemonSet/neuron-dra-driver/neuron-dra-driver-kubelet-plugin"].plain_inputs
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert ("UNHEALTHY_TAINT_EFFECT" in env) is taint_env
    for obj in objects.values():
        kubeschema.validate(obj.plain_inputs, version, strict=True)
    assert run.result.core_device_class_name == (classes[1] if len(classes) == 2 else None)
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    # the daemon publishes NeuronCores exactly where their class exists (auto on 1.37: its own rule, the same)
    expected = [] if (version, cores) == ("1.37", "auto") else ["--core-partitions",
                                                                 "on" if len(classes) == 2 else "off"]
    assert [a for a in args if a == "--core-partitions"] + [
        args[i + 1] for i, a in enumerate(args) if a == "--core-partitions"] == expected


def test_the_version_rule_lives_in_deploy() -> None:
    """The component and `deploy.manifests` render the same objects for a minor (one rule)."""

    def rendered(**options: Any) -> list[dict[str, Any]]:  # without neuron-monitor (its own rule: test_exporter.py)
        return deploy.manifests(DriverDeployOptions(neuron_monitor=False, **options))

    old = rendered(kubernetes_version="1.34")
    assert [m["kind"] for m in old].count("DeviceClass") == 1
    assert len(rendered(kubernetes_version="1.36")) == len(old)
    assert len(rendered(kubernetes_version="1.36", core_partitions="on")) == len(old) + 1
    assert len(rendered(kubernetes_version="1.37")) == len(old) + 1
    with pytest.raises(deploy.DeployOptionError) as bad:
        DriverDeployOptions(core_partitions="yes")
    assert bad.value.option == "core_partitions" and bad.value.allowed == "auto, on, off"
    with pytest.raises(deploy.DeployOptionError) as err:
        DriverDeployOptions(kubernetes_version="1.33")
    assert err.value.option == "kubernetes_version" and "at least 1.34" in str(err.value)


def test_a_bad_image_is_refused_known_or_as_an_output() -> None:
    with pytest.raises(SettingError) as known:
        NeuronDraDriverArgs(image="registry.example.com/dra driver:1")
    assert known.value.setting.startswith("NeuronDraDriverArgs.image")
    def program() -> NeuronDraDriver:
        provider = k8s.Provider("target", kubeconfig="{}")
        return NeuronDraDriver("drv", NeuronDraDriverArgs(image=pulumi.Output.from_input(
            "registry.example.com/dra driver:1")), opts=pulumi.ResourceOptions(provider=provider))

    with pytest.raises(Exception) as late:  # no exports: run_offline would wait on the failed image Output
        run_offline(program)
    ours: BaseException | None = late.value
    seen: set[int] = set()  # the chain may loop (an exception re-raised from its own handler)
    while ours is not None and not isinstance(ours, SettingError) and id(ours) not in seen:
        seen.add(id(ours))
        ours = ours.__cause__ or ours.__context__
    # The same message, as the SettingError itself or inside the error Pulumi wraps it in for the input.
    assert str(known.value) in str(ours if isinstance(ours, SettingError) else late.value), repr(late.value)


def test_keyword_arguments_and_args_are_exclusive() -> None:
    with pytest.raises(TypeError, match="either args or keyword"):
        run_offline(lambda: NeuronDraDriver("d", NeuronDraDriverArgs(image=IMAGE), image=IMAGE))


def test_the_pod_monitor_and_the_dashboard_are_applied_as_rendered() -> None:
    options = OPTIONS.replace(pod_monitor=True, grafana_dashboard=True, neuron_monitor=True, image=IMAGE)
    objects = k8s_objects(run_driver(NeuronDraDriverArgs(options=options, image=IMAGE)))
    expected = {deploy.object_key(m): m for m in deploy.manifests(options)}
    assert set(objects) == set(expected)
    for kind in ("PodMonitor", "ConfigMap", "Service"):  # the driver's (the exporter has a PodMonitor too)
        (key,) = [k for k in expected if k.startswith(f"{kind}/") and "neuron-monitor" not in k]
        assert objects[key].plain_inputs == expected[key], key
    (monitor,) = [r for k, r in objects.items() if k.startswith("PodMonitor/") and "neuron-monitor" not in k]
    assert monitor.type == "kubernetes:monitoring.coreos.com/v1:PodMonitor"


def test_the_neuron_monitor_setting_adds_the_exporter_and_only_then() -> None:
    from neuron_dra.components.settings_schema import decode_settings

    on = decode_settings({}).driver_options()  # on by default: an opt-out
    off = decode_settings({"neuron-dra:neuronMonitor": "false"}).driver_options()
    assert (off.neuron_monitor, on.neuron_monitor) == (False, True)
    exporter = {k for k in map(deploy.object_key, deploy.manifests(on)) if "neuron-monitor" in k}
    assert exporter and not {k for k in map(deploy.object_key, deploy.manifests(off)) if "neuron-monitor" in k}
