"""driver/deploy/manifests.py: the driver's Kubernetes objects (pure dicts), checked against the real schemas and the
real daemon's command line."""

from __future__ import annotations

import copy
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from neuron_dra.driver import deploy
from neuron_dra.driver.daemon.options import parse_options
from neuron_dra.driver.deploy import DeployOptionError, DriverDeployOptions, Resources, admission
from neuron_dra.driver.model.catalog import CATALOG
from tests.support import kubeschema

OPTION_SETS = {
    "default": DriverDeployOptions(),
    "custom": DriverDeployOptions(
        image="registry.example.com/neuron/driver@sha256:" + "a" * 64, driver_name="neuron.example.com",
        namespace="accel", plugins_dir="/data/kubelet/plugins", registry_dir="/data/kubelet/plugins_registry",
        cdi_root="/etc/cdi", metrics_port=9400, instance_types=("trn1.32xlarge", "inf2.48xlarge"),
        resources=Resources(cpu_limit="500m"), labels={"team": "ml"}, kube_api_qps=20, kube_api_burst=40,
        kube_api_timeout=4.5,
    ),
    "no-health": DriverDeployOptions(healthcheck_port=0),
}


def by_kind(options: DriverDeployOptions) -> dict[str, dict[str, Any]]:
    """One object per kind: the claim-config policy and binding left out (tests/driver/deploy/test_admission.py)."""
    claim_policy = admission.policy_name(options.namespace, options.driver_name)
    # The neuron-monitor exporter's objects left out too (tests/driver/deploy/test_exporter.py).
    items = [m for m in deploy.manifests(options.replace(neuron_monitor=False))
             if m["metadata"]["name"] != claim_policy]
    kinds = [m["kind"] for m in items if m["kind"] != "DeviceClass"]
    # The metrics port adds its Service (tests/driver/deploy/test_monitoring.py).
    assert len(set(kinds)) == len(kinds) == (9 if options.metrics_port else 8)
    classes = [m for m in items if m["kind"] == "DeviceClass"]
    assert len(classes) == 2  # whole devices, then NeuronCores
    return {**{m["kind"]: m for m in items}, "DeviceClass": classes[0], "CoreDeviceClass": classes[1]}


@pytest.mark.parametrize("name", sorted(OPTION_SETS))
def test_every_manifest_passes_strict_schema_validation(name: str) -> None:
    items = deploy.manifests(OPTION_SETS[name])
    for manifest in items:
        kubeschema.validate(manifest, "1.34", strict=True)
    assert [m["kind"] for m in items] == [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy", "DeviceClass", "DeviceClass",
        *(["Service"] if OPTION_SETS[name].metrics_port else []),
        "DaemonSet", *(["ServiceAccount", "NetworkPolicy", "ResourceClaimTemplate", "DaemonSet"]
                       if OPTION_SETS[name].runs_neuron_monitor else []),
    ]


def test_strict_validation_catches_a_misspelt_field() -> None:
    # Proof that the validation above can fail: the typed SDKs would accept this typo silently.
    ds = copy.deepcopy(by_kind(DriverDeployOptions())["DaemonSet"])
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubeschema.ValidationError):
        kubeschema.validate(ds, "1.34", strict=True)


def test_rbac_is_exactly_what_the_daemon_calls() -> None:
    objs = by_kind(DriverDeployOptions())
    granted = {
        (group, resource, verb)
        for rule in objs["ClusterRole"]["rules"]
        for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]
    }
    # What publisher.py calls (tests/driver/deploy/test_rbac.py records it against the API server): no get, no patch.
    slice_verbs = ("list", "watch", "create", "update", "delete")
    assert granted == {
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "nodes", "get"),
        ("", "events", "create"),  # device health events on the Node
        *{("resource.k8s.io", "resourceslices", v) for v in slice_verbs},
    }
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in objs["ClusterRole"]["rules"])
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": objs["ClusterRole"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "neuron-dra-driver-sa",
                                    "namespace": "neuron-dra-driver"}]


def test_admission_policy_restricts_the_driver_to_its_own_node() -> None:
    objs = by_kind(DriverDeployOptions())
    spec = objs["ValidatingAdmissionPolicy"]["spec"]
    assert spec["failurePolicy"] == "Fail"
    rule = spec["matchConstraints"]["resourceRules"][0]
    assert (rule["apiGroups"], rule["resources"], sorted(rule["operations"])) == (
        ["resource.k8s.io"], ["resourceslices"], ["CREATE", "DELETE", "UPDATE"])
    assert spec["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:neuron-dra-driver:neuron-dra-driver-sa"')
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["userNodeName"] == (
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')")
    assert variables["objectNodeName"] == (
        '(request.operation == "DELETE" ? oldObject : object).spec.?nodeName.orValue("")')
    assert variables["objectDriver"] == '(request.operation == "DELETE" ? oldObject : object).spec.driver'
    assert [v["expression"] for v in spec["validations"]] == [
        'variables.userNodeName != ""',
        "variables.userNodeName == variables.objectNodeName && variables.userNodeName == variables.oldNodeName",
        'variables.objectDriver == "neuron.aws.com" && variables.oldDriver == "neuron.aws.com"']
    binding = objs["ValidatingAdmissionPolicyBinding"]["spec"]
    assert binding == {"policyName": objs["ValidatingAdmissionPolicy"]["metadata"]["name"],
                       "validationActions": ["Deny"]}


def test_network_policy_admits_only_metrics_scrapers() -> None:
    """Default (no metrics): no ingress at all (kubelet's probe from the pod's own node cannot be blocked)."""
    default = by_kind(DriverDeployOptions())
    policy = default["NetworkPolicy"]
    assert policy["metadata"]["namespace"] == "neuron-dra-driver"
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []
    pod_labels = default["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    custom = by_kind(OPTION_SETS["custom"])["NetworkPolicy"]["spec"]["ingress"]
    assert custom == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                       "ports": [{"protocol": "TCP", "port": 9400}]}]
    with pytest.raises(DeployOptionError, match="metrics_scrape_namespaces"):
        DriverDeployOptions(metrics_scrape_namespaces=("Not A Namespace",))


def test_device_classes_split_the_driver_into_devices_and_cores_with_the_device_plugins_resource_names() -> None:
    objs = by_kind(OPTION_SETS["custom"])
    dc, core = objs["DeviceClass"], objs["CoreDeviceClass"]
    # Both classes follow the driver name (two installations never share one).
    assert dc["metadata"]["name"] == "neuron.example.com" and core["metadata"]["name"] == "cores.neuron.example.com"
    assert dc["spec"] == {"extendedResourceName": "aws.amazon.com/neuron", "selectors": [{"cel": {"expression": (
        'device.driver == "neuron.example.com" && '
        'device.attributes["neuron.example.com"].resourceType != "neuron_core" && '
        'device.attributes["neuron.example.com"].resourceType != "ultraserver"')}}]}
    assert core["spec"] == {"extendedResourceName": "aws.amazon.com/neuroncore", "selectors": [{"cel": {
        "expression": ('device.driver == "neuron.example.com" && '
                       'device.attributes["neuron.example.com"].resourceType == "neuron_core"')}}]}
    # Left out (clusters before 1.36 lack the field) and renamed.
    plain = by_kind(DriverDeployOptions(extended_resource_name=None, core_extended_resource_name="example.com/nc",
                                        core_device_class_name="cores.example.com"))
    assert "extendedResourceName" not in plain["DeviceClass"]["spec"]
    assert plain["CoreDeviceClass"]["spec"]["extendedResourceName"] == "example.com/nc"
    assert plain["CoreDeviceClass"]["metadata"]["name"] == "cores.example.com"


@pytest.mark.parametrize(("option", "value", "allowed"), [
    ("extended_resource_name", "neuron", "an extended resource name"),
    ("core_extended_resource_name", "kubernetes.io/neuroncore", "an extended resource name"),
    ("core_extended_resource_name", "aws.amazon.com/neuron", "a name other than extended_resource_name"),
    ("core_device_class_name", "neuron.aws.com", "a name other than the device class neuron.aws.com"),
])
def test_device_class_options_are_checked(option: str, value: str, allowed: str) -> None:
    with pytest.raises(DeployOptionError, match=allowed) as e:
        DriverDeployOptions(**{option: value})
    assert option in str(e.value) and repr(value) in str(e.value)


def _container(options: DriverDeployOptions) -> dict[str, Any]:
    pod = by_kind(options)["DaemonSet"]["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    container: dict[str, Any] = pod["containers"][0]
    return container


def _resolved_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as kubelet would set it on node `node-7` for pod uid `uid-1`."""
    field_values = {"spec.nodeName": "node-7", "metadata.uid": "uid-1", "status.podIP": "10.0.0.7",
                    "status.hostIP": "10.0.0.1"}
    env = {}
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else field_values[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("name", ["default", "custom"])
def test_the_daemon_parses_the_daemonset_and_every_path_it_writes_is_mounted_at_its_host_path(name: str) -> None:
    options = OPTION_SETS[name]
    ds = by_kind(options)["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = _resolved_env(container)
    assert container["command"] == ["neuron-dra-driver"]
    # The real daemon's own parser reads the flags and the env exactly as the pod passes them.
    daemon = parse_options(container["args"], env)
    assert daemon.node_name == "node-7"
    assert daemon.driver_name == options.driver_name
    assert daemon.healthcheck_port == options.healthcheck_port == 51515
    assert daemon.metrics_port == options.metrics_port
    assert daemon.host_root == Path(options.host_root)
    assert (daemon.kube_api_qps, daemon.kube_api_burst, daemon.kube_api_timeout) == (
        options.kube_api_qps, options.kube_api_burst, options.kube_api_timeout)
    assert env["POD_UID"] == "uid-1"
    # Health and metrics listen on the pod IP only (where kubelet's probe connects), not on every address.
    assert daemon.bind_address == "10.0.0.7"
    # kubelet's probe comes from the node's address: the health port's lane of its own for it.
    assert daemon.node_addresses == ("10.0.0.1",)

    volumes = {v["name"]: v for v in pod["volumes"]}
    writable: dict[str, str] = {}
    read_only: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" not in volume:
            continue
        (read_only if mount.get("readOnly") else writable)[mount["mountPath"]] = volume["hostPath"]["path"]
    # Sockets, checkpoint and CDI specs: kubelet and the runtime resolve these on the host.
    assert all(host == inside for inside, host in writable.items())
    for written in (daemon.sockets.dra, daemon.sockets.registration, daemon.checkpoint_path, daemon.cdi_root / "x"):
        assert any(PurePosixPath(written).is_relative_to(m) for m in writable), written
    # The driver's own plugin subdirectory, not all of kubelet's plugins dir.
    assert f"{options.plugins_dir}/{options.driver_name}" in writable
    assert options.plugins_dir not in writable
    # Discovery reads <host root>/sys and <host root>/dev: the host's, read-only.
    # The node's LNC file below /opt/aws/neuron (docs/neuron-cores.md §2).
    assert read_only == {f"{options.host_root}/sys": "/sys", f"{options.host_root}/dev": "/dev",
                         f"{options.host_root}/opt/aws/neuron": "/opt/aws/neuron"}
    assert {v["name"]: v.get("emptyDir") for v in pod["volumes"] if "emptyDir" in v} == {
        "tmp": {"medium": "Memory", "sizeLimit": "16Mi"}}


def test_daemonset_env_matches_awss_chart() -> None:
    env = _resolved_env(_container(DriverDeployOptions()))
    assert env == {
        "NODE_NAME": "node-7", "POD_UID": "uid-1", "POD_IP": "10.0.0.7", "HOST_IP": "10.0.0.1",
        "KUBELET_PLUGINS_DIRECTORY_PATH": "/var/lib/kubelet/plugins",
        "KUBELET_REGISTRAR_DIRECTORY_PATH": "/var/lib/kubelet/plugins_registry",
        "CDI_ROOT": "/var/run/cdi", "HEALTHCHECK_PORT": "51515", "UNHEALTHY_TAINT_EFFECT": "NoSchedule",
    }
    noexec = _resolved_env(_container(DriverDeployOptions(unhealthy_taint_effect="NoExecute")))
    assert noexec["UNHEALTHY_TAINT_EFFECT"] == "NoExecute"
    with pytest.raises(DeployOptionError, match=r"unhealthy_taint_effect.*NoSchedule, NoExecute, None"):
        DriverDeployOptions(unhealthy_taint_effect="PreferNoSchedule")


def test_daemonset_rolls_with_a_surge_pod_and_no_node_without_the_driver() -> None:
    """A new pod starts beside the old one (kubelet 1.33+ registers both, docs/upgrades.md); settable."""
    strategy = by_kind(DriverDeployOptions())["DaemonSet"]["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    stop_first = by_kind(DriverDeployOptions(max_surge=0, max_unavailable=2))["DaemonSet"]["spec"]["updateStrategy"]
    assert stop_first["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 2}
    with pytest.raises(DeployOptionError, match=r"max_unavailable.*0.*at least 1 when max_surge is 0"):
        DriverDeployOptions(max_surge=0, max_unavailable=0)
    with pytest.raises(DeployOptionError, match=r"max_surge.*True.*whole number of nodes from 0 to 10000"):
        DriverDeployOptions(max_surge=True)
    with pytest.raises(DeployOptionError, match=r"max_unavailable.*'10%'.*whole number of nodes"):
        DriverDeployOptions(max_unavailable="10%")


def test_daemonset_scheduling_security_and_probe() -> None:
    options = DriverDeployOptions()
    ds = by_kind(options)["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == "neuron-dra-driver-sa"
    assert {(t["key"], t.get("effect")) for t in pod["tolerations"]} == {
        ("CriticalAddonsOnly", None), ("aws.amazon.com/neuron", "NoSchedule")}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1
    exprs = {e["key"]: e for e in terms[0]["matchExpressions"]}
    assert exprs["node.kubernetes.io/instance-type"] == {
        "key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(CATALOG)}
    assert exprs["eks.amazonaws.com/compute-type"] == {
        "key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "hybrid", "auto"]}
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod
    assert c["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
    # Selector labels are on the pod template (the API server would reject the DaemonSet otherwise).
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_affinity_follows_configured_instance_types_and_no_probe_without_health_port() -> None:
    c = _container(OPTION_SETS["no-health"])
    assert "livenessProbe" not in c and "ports" not in c
    pod = by_kind(OPTION_SETS["custom"])["DaemonSet"]["spec"]["template"]["spec"]
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr["values"] == ["trn1.32xlarge", "inf2.48xlarge"]
    assert {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]} == {"healthz": 51515,
                                                                                      "metrics": 9400}


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"namespace": "Neuron_DRA"}, "namespace"),
    ({"plugins_dir": "var/lib/kubelet/plugins"}, "plugins_dir"),
    ({"cdi_root": "/"}, "cdi_root"),
    ({"healthcheck_port": 70000}, "healthcheck_port"),
    ({"metrics_port": 51515}, "metrics_port"),
    ({"instance_types": ("p5.48xlarge",)}, "instance_types"),
    ({"instance_types": ()}, "instance_types"),
    ({"image": "has space:1"}, "image"),
    ({"image_pull_policy": "Sometimes"}, "image_pull_policy"),
    ({"resources": Resources(memory_limit="lots")}, "resources.memory_limit"),
    ({"driver_name": "x" * 64}, "driver_name"),
    ({"kube_api_qps": 0}, "kube_api_qps"),
    ({"kube_api_burst": 2.5}, "kube_api_burst"),
    ({"kube_api_timeout": 45}, "kube_api_timeout"),
])
def test_bad_options_name_the_option_the_value_and_what_is_allowed(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(DeployOptionError) as err:
        DriverDeployOptions(**kwargs)
    assert err.value.option == option
    assert f"driver option {option}:" in str(err.value) and "allowed:" in str(err.value)
