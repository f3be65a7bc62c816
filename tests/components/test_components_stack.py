"""The default stack (Pulumi.yaml + __main__.py) under Pulumi mocks, its settings and their errors."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.runtime import rpc

from neuron_dra.components import plan
from neuron_dra.components.mocks import SECRET_SIG, SIG_KEY, OfflineRun, PlanMocks, run_offline
from neuron_dra.components.settings import SettingError, StackSettings
from neuron_dra.components.settings_schema import (
    NODE_GROUP_KEYS,
    SETTINGS_BY_KEY,
    decode_settings,
    pulumi_project_config,
    settings_table,
)
from neuron_dra.components.stack import StackResult, build_stack, kubeconfig_input, settings_from_pulumi_config
from tests.support import kubeschema

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})


def engine_config(values: dict[str, Any]) -> dict[str, str]:
    """Config as the engine hands it to a program: `project:key` -> string (JSON for lists and objects)."""
    out = {}
    for key, value in values.items():
        full = key if ":" in key else f"neuron-dra:{key}"
        out[full] = value if isinstance(value, str) else json.dumps(value)
    return out


def project_defaults() -> dict[str, Any]:
    """The defaults the engine adds from Pulumi.yaml to every stack's config."""
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    return {key: decl["default"] for key, decl in doc["config"].items() if "default" in decl}


def run_stack(values: dict[str, Any], mocks: PlanMocks | None = None) -> OfflineRun[StackResult]:
    config = engine_config(values)

    def program() -> StackResult:
        return build_stack(settings_from_pulumi_config("neuron-dra"), stack="dev")

    return run_offline(program, config=config, stack="dev", mocks=mocks, exports=lambda r: r.exports)


def test_default_stack_one_trn2_node_group_driver_templates_and_exports() -> None:
    run = run_stack(project_defaults())
    groups = run.of_type("aws:eks/nodeGroup:NodeGroup")
    assert [g.plain_inputs["nodeGroupName"] for g in groups] == ["trn2"]
    assert groups[0].plain_inputs["instanceTypes"] == ["trn2.48xlarge"]
    assert run.one("eks:index:Cluster").plain_inputs["version"] == "1.36"
    exports = run.exports
    assert exports["clusterName"] == "neuron-dra-dev"
    assert exports["nodeGroupNames"] == ["trn2"]
    assert exports["driverNamespace"] == "neuron-dra-driver"
    assert json.loads(exports["kubeconfig"])["clusters"][0]["name"] == "neuron-dra-dev"
    assert len(exports["claimTemplates"]) >= 8
    assert all(name.startswith("default/") for name in exports["claimTemplates"])
    manifests = plan.kubernetes_manifests(run)
    kinds = [m["kind"] for m in manifests]
    # The claim templates, and neuron-monitor's beside the driver (on by default: docs/utilisation.md §3).
    assert kinds.count("ResourceClaimTemplate") == len(exports["claimTemplates"]) + 1
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "DaemonSet"] == [
        "neuron-dra-driver-kubelet-plugin", "neuron-monitor"]
    for m in manifests:
        kubeschema.validate(m, "1.36", strict=True)
    ds = next(m for m in manifests if m["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == exports["driverImage"]
    # CoreDNS waits for the node group; the Kubernetes objects go to the new cluster.
    coredns = next(r for r in run.of_type("aws:eks/addon:Addon") if r.plain_inputs["addonName"] == "coredns")
    assert groups[0].urn in coredns.dependencies
    provider = run.one("pulumi:providers:kubernetes")
    assert all(r.provider.startswith(provider.urn) for r in run.resources if r.type.startswith("kubernetes:"))


def test_main_py_is_the_stack_program() -> None:
    run = run_offline(lambda: runpy.run_path(str(ROOT / "__main__.py")),
                      config=engine_config({**project_defaults(), "driverImage": "example.com/d:1"}))
    assert [r.plain_inputs["nodeGroupName"] for r in run.of_type("aws:eks/nodeGroup:NodeGroup")] == ["trn2"]
    assert len(run.of_type("kubernetes:apps/v1:DaemonSet")) == 2  # the driver and neuron-monitor


def test_existing_cluster_mode_installs_only_the_driver_and_templates() -> None:
    values = {**project_defaults(), "kubeconfig": KUBECONFIG, "clusterInstanceTypes": ["trn2.48xlarge"],
              "driverImage": "example.com/neuron-dra-driver:0.1.0", "efaDriver": "external"}
    run = run_stack(values)
    types = {r.type for r in run.resources}
    assert not {t for t in types if t.startswith(("aws:", "eks:", "awsx:", "docker-build:"))}
    assert run.one("pulumi:providers:kubernetes", "existing-cluster").plain_inputs["kubeconfig"] == KUBECONFIG
    assert run.exports["clusterName"] is None and run.exports["nodeGroupNames"] == []
    assert run.exports["kubeconfig"] == KUBECONFIG
    assert len(run.of_type("kubernetes:apps/v1:DaemonSet")) == 2  # the driver and neuron-monitor
    assert len(run.of_type("kubernetes:resource.k8s.io/v1:ResourceClaimTemplate")) == len(
        run.exports["claimTemplates"]) + 1  # and neuron-monitor's
    assert not run.invokes  # nothing asked of AWS


def test_kubeconfig_paths_are_expanded_and_contents_kept() -> None:
    assert kubeconfig_input("~/.kube/config") == str(Path.home() / ".kube" / "config")
    assert kubeconfig_input(KUBECONFIG) == KUBECONFIG
    assert kubeconfig_input("/etc/kube/admin.conf") == "/etc/kube/admin.conf"


def test_existing_cluster_mode_refuses_new_cluster_settings() -> None:
    with pytest.raises(SettingError) as err:
        decode_settings({**engine_config(project_defaults()), "neuron-dra:kubeconfig": KUBECONFIG,
                         "neuron-dra:vpcId": "vpc-0123456789abcdef0"})
    assert err.value.setting == "neuron-dra:vpcId" and "existing cluster" in str(err.value)


def test_node_groups_go_where_their_instance_type_is_offered() -> None:
    mocks = PlanMocks(offerings={"trn2.48xlarge": ["us-east-2c"], "inf2.48xlarge": ["us-east-2a", "us-east-2b",
                                                                                     "us-east-2c"]})
    run = run_stack({"driverImage": "example.com/d:1", "claimTemplatesModule": "", "nodeGroups": [
        {"name": "trn2", "instanceType": "trn2.48xlarge"}, {"name": "inf", "instanceType": "inf2.48xlarge"}]},
        mocks)
    vpc = run.one("awsx:ec2:Vpc").plain_inputs
    assert vpc["availabilityZoneNames"] == ["us-east-2c", "us-east-2a", "us-east-2b"]
    subnets = {g.plain_inputs["nodeGroupName"]: g.plain_inputs["subnetIds"]
               for g in run.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert [mocks.subnet_zones[s] for s in subnets["trn2"]] == ["us-east-2c"]
    assert sorted(mocks.subnet_zones[s] for s in subnets["inf"]) == ["us-east-2a", "us-east-2b", "us-east-2c"]


def test_an_instance_type_offered_nowhere_fails_naming_the_node_group() -> None:
    mocks = PlanMocks(offerings={"trn2.48xlarge": []})
    with pytest.raises(SettingError) as err:
        run_stack({"claimTemplatesModule": ""}, mocks)
    assert err.value.setting == "neuron-dra:nodeGroups[0].instanceType"


def test_all_node_groups_empty_defers_coredns() -> None:
    run = run_stack({"driverImage": "example.com/d:1", "claimTemplatesModule": "",
                     "nodeGroups": [{"name": "later", "instanceType": "trn1.32xlarge", "desiredSize": 0,
                                     "maxSize": 2}]})
    assert [r.plain_inputs["addonName"] for r in run.of_type("aws:eks/addon:Addon")] == ["eks-pod-identity-agent"]


def test_an_unsatisfiable_template_fails_the_program() -> None:
    from neuron_dra.components.claims import ClaimTemplateCheckError

    with pytest.raises(ClaimTemplateCheckError) as err:
        run_stack({"driverImage": "example.com/d:1", "claimTemplatesModule": "neuron_dra.claim_templates.examples"})
    assert "cannot be satisfied by the cluster's node groups (trn2.48xlarge)" in str(err.value)


BAD_CONFIGS = [
    ({"nodeGroups": [{"name": "a", "instanceType": "trn9.48xlarge"}]}, "neuron-dra:nodeGroups[0].instanceType",
     "trn2.48xlarge"),
    ({"kubernetesVersion": "1.33"}, "neuron-dra:kubernetesVersion", "1.34 to 1.36"),
    ({"kubernetesVersion": "1.38"}, "neuron-dra:kubernetesVersion", "1.34 to 1.36"),
    ({"vpcCniIdentity": "irsa"}, "neuron-dra:vpcCniIdentity", "podIdentity or nodeRole"),
    ({"imdsHopLimit": 0}, "neuron-dra:imdsHopLimit", "1 (only the node's own processes"),
    ({"driverRolloutTimeoutSeconds": -1}, "neuron-dra:driverRolloutTimeoutSeconds", "0 (do not wait"),
    ({"nodeGroups": [{"name": "a", "capacityType": "CAPACITY_BLOCK", "availabilityZone": "us-east-2a"}]},
     "neuron-dra:nodeGroups[0].capacityReservationId", "reservation id"),
    ({"nodeGroups": [{"name": "a", "capacityReservationId": "cr-0123456789abcdef0"}]},
     "neuron-dra:nodeGroups[0].availabilityZone", "Capacity Block's AZ"),
    ({"nodeGroups": [{"name": "a", "instanceType": "inf2.48xlarge", "capacityReservationId": "cr-0123456789abcdef0",
                      "availabilityZone": "us-east-2a"}]}, "neuron-dra:nodeGroups[0].instanceType",
     "sold as Capacity Blocks"),
    ({"nodeGroups": [{"name": "a", "capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-2a",
                      "minSize": 1}]}, "neuron-dra:nodeGroups[0].minSize", "0 on a Capacity Block"),
    ({"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0000000000000000a", "subnet-0000000000000000b"],
      "nodeGroups": [{"name": "a", "subnetIds": ["subnet-0000000000000000a", "subnet-0000000000000000b"]}]},
     "neuron-dra:nodeGroups[0].subnetIds", "exactly one subnet"),
    ({"nodeGroups": [{"name": "a", "subnetIds": ["subnet-0000000000000000a"]}]},
     "neuron-dra:nodeGroups[0].subnetIds", "unless vpcId"),
    ({"nodeGroup": []}, "neuron-dra:nodeGroup", "did you mean 'nodeGroups'"),
    ({"nodeGroups": [{"name": "a", "instancetype": "trn2.48xlarge"}]}, "neuron-dra:nodeGroups[0].instancetype",
     "did you mean 'instanceType'"),
    ({"nodeGroups": [{"name": "a", "desiredSize": 3, "maxSize": 2}]}, "neuron-dra:nodeGroups[0].desiredSize",
     "between minSize"),
    ({"nodeGroups": [{"name": "a"}, {"name": "a", "instanceType": "trn1.32xlarge"}]},
     "neuron-dra:nodeGroups[1].name", "no other node group"),
    ({"nodeGroups": []}, "neuron-dra:nodeGroups", "at least one node group"),
    ({"vpcCniVersion": "v1.18.3-eksbuild.1"}, "neuron-dra:vpcCniVersion", "v1.18.4 or newer"),
    ({"nodeGroups": [{"name": "a", "efaInterfaceType": "ena"}]}, "neuron-dra:nodeGroups[0].efaInterfaceType",
     "efa-only or efa"),
    ({"nodeGroups": [{"name": "a", "labels": {"bad key!": "x"}}]}, "neuron-dra:nodeGroups[0].labels", "label key"),
    ({"endpointPublicAccess": "yes"}, "neuron-dra:endpointPublicAccess", "true or false"),
    ({"driverMetricsPort": "many"}, "neuron-dra:driverMetricsPort", "whole number"),
    ({"claimTemplatesModule": "not a module"}, "neuron-dra:claimTemplatesModule", "dotted Python module"),
    ({"kubernetesVersion": "1.35", "nodeGroups": [{"name": "a", "version": "1.36"}]},
     "neuron-dra:nodeGroups[0].version", "control plane's version 1.35"),
    ({"driverNamespace": "Neuron_DRA"}, "neuron-dra:driverNamespace", "DNS label"),
    ({"kubeletPluginsDir": "var/lib/kubelet/plugins"}, "neuron-dra:kubeletPluginsDir", "absolute"),
    ({"driverHostPathsRoot": "run/neuron-dra-host/"}, "neuron-dra:driverHostPathsRoot", "absolute, normalised"),
    ({"driverImage": "my image"}, "neuron-dra:driverImage", "without spaces"),
    ({"driverMetricsPort": 51515}, "neuron-dra:driverMetricsPort", "other than healthcheck_port"),
    ({"driverMaxSurge": -1}, "neuron-dra:driverMaxSurge", "whole number of nodes from 0 to 10000"),
    ({"driverMaxSurge": 0}, "neuron-dra:driverMaxUnavailable", "at least 1 when max_surge is 0"),
    ({"driverMaxUnavailable": "some"}, "neuron-dra:driverMaxUnavailable", "whole number"),
]


@pytest.mark.parametrize(("values", "setting", "fragment"), BAD_CONFIGS, ids=[b[1] for b in BAD_CONFIGS])
def test_bad_config_names_the_setting(values: dict[str, Any], setting: str, fragment: str) -> None:
    with pytest.raises(SettingError) as err:
        decode_settings(engine_config({**project_defaults(), **values}))
    assert err.value.setting == setting
    assert fragment in str(err.value)
    assert str(err.value).startswith(f"{setting}: ")


def test_bad_config_fails_the_program_itself() -> None:
    with pytest.raises(SettingError, match=r"neuron-dra:nodeGroups\[0\].instanceType"):
        run_stack({"nodeGroups": [{"name": "a", "instanceType": "p5.48xlarge"}]})


def test_efa_only_is_fine_with_a_new_enough_cni_or_efa_interfaces() -> None:
    assert decode_settings(engine_config({"vpcCniVersion": "v1.18.4-eksbuild.1"})).vpc_cni_version
    settings = decode_settings(engine_config({"vpcCniVersion": "v1.16.0-eksbuild.1", "nodeGroups": [
        {"name": "a", "efaInterfaceType": "efa"}]}))
    assert not settings.uses_efa_only


def test_pulumi_yaml_declares_the_schema() -> None:
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert doc["name"] == "neuron-dra"
    assert doc["runtime"]["name"] == "python"
    assert doc["runtime"]["options"]["virtualenv"]
    assert doc["config"] == pulumi_project_config()
    # Pulumi's own project validation rules (sdk/go/common/workspace/project.go).
    simple = {"string": str, "integer": int, "boolean": bool}
    for key, decl in doc["config"].items():
        assert ":" not in key  # project keys are namespaced by the project implicitly
        assert set(decl) <= {"type", "items", "description", "default", "secret"}, key
        assert decl.get("description"), key
        if decl.get("type") == "array":
            assert decl["items"] == {"type": "string"}
            assert all(isinstance(v, str) for v in decl.get("default", []))
        elif "type" in decl and "default" in decl:
            assert isinstance(decl["default"], simple[decl["type"]]), key
    # The defaults the engine passes decode to the Python defaults: one source of truth.
    assert decode_settings(engine_config(project_defaults())) == decode_settings({})
    assert decode_settings({}) == StackSettings(node_groups=decode_settings({}).node_groups)


def test_the_docs_settings_table_is_the_generated_one() -> None:
    doc = (ROOT / "docs" / "components.md").read_text()
    start = doc.index("<!-- settings table: generated by settings_table() -->\n")
    table = doc[doc.index("\n", start) + 1:doc.index("<!-- end of settings table -->")]
    assert table == settings_table(), "docs/components.md: paste settings_schema.settings_table() between the markers"


def test_pulumi_example_yaml_shows_every_setting_and_plans() -> None:
    text = (ROOT / "Pulumi.example.yaml").read_text()
    for key in SETTINGS_BY_KEY:
        assert f"neuron-dra:{key}:" in text, key
    for key in NODE_GROUP_KEYS:
        assert f"{key}:" in text, key
    config = plan.load_config_file(ROOT / "Pulumi.example.yaml")
    settings = decode_settings(config)
    assert [g.name for g in settings.node_groups] == ["trn2", "trn2-block"]
    run = plan.plan(config)
    lts = {r.name: r.plain_inputs for r in run.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    assert lts["ng-trn2-block-lt"]["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert "capacityReservationSpecification" not in lts["ng-trn2-lt"]


def test_secret_marker_matches_pulumis_wire_format() -> None:
    assert (rpc._special_sig_key, rpc._special_secret_sig) == (SIG_KEY, SECRET_SIG)


def test_catalog_file_setting_adds_instance_types_for_node_groups_and_the_driver(tmp_path: Path) -> None:
    from tests.driver.model.test_catalog_file import ACME

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(ACME), encoding="utf-8")
    groups = [{"name": "acme", "instanceType": "acme1.24xlarge", "desiredSize": 1}]
    base = {"driverImage": "example.com/d:1", "claimTemplatesModule": "", "nodeGroups": groups}
    with pytest.raises(SettingError) as unknown:
        decode_settings(engine_config(base))
    assert unknown.value.setting == "neuron-dra:nodeGroups[0].instanceType" and "catalogFile" in str(unknown.value)

    run = run_stack({**base, "catalogFile": str(catalog)})
    assert run.one("aws:eks/nodeGroup:NodeGroup").plain_inputs["instanceTypes"] == ["acme1.24xlarge"]
    manifests = plan.kubernetes_manifests(run)
    config_map = next(m for m in manifests if m["kind"] == "ConfigMap")
    assert yaml.safe_load(config_map["data"]["catalog.yaml"]) == ACME  # the driver pods read the same file
    ds = next(m for m in manifests if m["kind"] == "DaemonSet")
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NEURON_DRA_CATALOG"] == "/etc/neuron-dra/catalog.yaml"
    for m in manifests:
        kubeschema.validate(m, "1.36", strict=True)


def test_catalog_file_setting_errors_name_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: neuron-dra/v1\nkind: NeuronCatalog\ninstanceTypes: {x.big: {devices: eight}}\n")
    for path in (bad, tmp_path / "absent.yaml"):
        with pytest.raises(SettingError) as err:
            decode_settings(engine_config({"catalogFile": str(path)}))
        assert err.value.setting == "neuron-dra:catalogFile" and path.name in str(err.value)


def test_node_group_lnc_reaches_the_nodes_and_the_template_checks() -> None:
    run = run_stack({"driverImage": "example.com/d:1", "nodeGroups": [
        {"name": "trn2", "instanceType": "trn2.48xlarge", "lnc": 1},
        {"name": "trn1", "instanceType": "trn1.32xlarge"}]})
    groups = {g.plain_inputs["nodeGroupName"]: g.plain_inputs for g in run.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert groups["trn2"]["labels"]["neuron-dra/lnc"] == "1" and "neuron-dra/lnc" not in groups["trn1"]["labels"]
    assert run.result.templates.checked_against == ("trn2.48xlarge:lnc=1", "trn1.32xlarge")
    with pytest.raises(SettingError) as err:
        decode_settings(engine_config({"nodeGroups": [{"name": "a", "instanceType": "trn1.32xlarge", "lnc": 2}]}))
    assert err.value.setting == "neuron-dra:nodeGroups[0].lnc" and "drop lnc" in str(err.value)


def test_the_stack_enforces_network_policies_unless_told_not_to() -> None:
    on = run_stack({"driverImage": "example.com/d:1", "claimTemplatesModule": ""})
    assert on.one("eks:index:Cluster").plain_inputs["vpcCniOptions"]["enableNetworkPolicy"] is True
    inf2 = [{"name": "inf", "instanceType": "inf2.xlarge"}]  # no EFA: only the NetworkPolicy rule applies
    with pytest.raises(SettingError) as err:
        decode_settings(engine_config({"vpcCniVersion": "v1.13.0-eksbuild.1", "nodeGroups": inf2}))
    assert err.value.setting == "neuron-dra:vpcCniVersion" and "vpcCniNetworkPolicy" in str(err.value)
    assert decode_settings(engine_config({"vpcCniVersion": "v1.13.0-eksbuild.1", "nodeGroups": inf2,
                                          "vpcCniNetworkPolicy": False})).vpc_cni_network_policy is False


def test_the_driver_rollout_settings_reach_the_daemonset() -> None:
    """driverMaxSurge / driverMaxUnavailable: the stack's DaemonSet rolls as set (docs/upgrades.md)."""
    manifests = plan.kubernetes_manifests(run_stack({"driverMaxSurge": 0, "driverMaxUnavailable": 2}))
    ds = next(m for m in manifests if m["kind"] == "DaemonSet")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 2}
    default = next(m for m in plan.kubernetes_manifests(run_stack({})) if m["kind"] == "DaemonSet")
    assert default["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    kubeschema.validate(ds, "1.36", strict=True)


def test_the_driver_host_paths_root_setting_moves_the_daemonsets_host_trees() -> None:
    """driverHostPathsRoot: the DaemonSet mounts sys, dev and opt/aws/neuron from there (a local cluster's nodes
    keep their emulated Neuron host tree at /run/neuron-dra-host); the default is the node's own root."""
    def host_paths(values: dict[str, Any]) -> dict[str, str]:
        manifests = plan.kubernetes_manifests(run_stack(values))
        ds = next(m for m in manifests if m["kind"] == "DaemonSet")
        return {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]
                if "hostPath" in v and v["name"].startswith("host-")}

    assert host_paths({}) == {"host-sys": "/sys", "host-dev": "/dev", "host-neuron-config": "/opt/aws/neuron"}
    assert host_paths({"driverHostPathsRoot": "/run/neuron-dra-host"}) == {
        "host-sys": "/run/neuron-dra-host/sys", "host-dev": "/run/neuron-dra-host/dev",
        "host-neuron-config": "/run/neuron-dra-host/opt/aws/neuron"}
