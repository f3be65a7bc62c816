"""UltraServerJob: the shared group claim and the per-pod template, judged by the schema and by real CEL against the
group devices the controller's model renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.claim_templates import Drivers, TemplateError
from neuron_dra.claim_templates import ultraserver as us_job
from neuron_dra.claim_templates.cel_env import CelDevice, CelEnvironment
from neuron_dra.claim_templates.checks import check_job
from neuron_dra.claim_templates.ultraserver import UltraServerJob
from neuron_dra.cli import main
from neuron_dra.driver.model import k8s_names
from neuron_dra.driver.model import ultraserver as us
from neuron_dra.driver.model.emulate import EmulationOptions
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices
from tests.support import kubeschema

DRIVER = "neuron.aws.com"


def group_devices() -> dict[tuple[int, bool], dict[str, Any]]:
    """(nodes, is a half) -> the group device, for a 4-node and a 2-node trn2u UltraServer."""
    slices = []
    for name, host_id, pos, mode in (("a", "u4", 0, 4), ("b", "u4", 1, 4), ("c", "u4", 2, 4), ("d", "u4", 3, 4),
                                     ("e", "u2", 0, 2), ("f", "u2", 1, 2)):
        host = emulated_host("trn2u.48xlarge", EmulationOptions(host_id=host_id, ultraserver_node=pos,
                                                                ultraserver_mode=mode))
        slices += resource_slices(build_pool(host, NodeFacts(name)), generation=1)
    facts, problems = us.member_facts(slices, DRIVER)
    assert not problems
    out = {}
    for s in us.desired_slices(us.group_ultraservers(facts), DRIVER):
        (device,) = s["spec"]["devices"]
        key = (device["attributes"]["nodeCount"]["int"], device["name"] == us.HALF_DEVICE)
        out[key] = device
    return out


def matches(expression: str, device: dict[str, Any]) -> bool:
    return CelEnvironment().evaluate(expression, CelDevice.from_api(DRIVER, device))


def test_the_group_claim_selects_exactly_the_group_of_its_size() -> None:
    devices = group_devices()
    assert set(devices) == {(4, False), (2, True), (2, False)}
    four = UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge")
    assert [matches(four.group_selector(), d) for d in (devices[4, False], devices[2, True], devices[2, False])] == [
        True, False, False]
    two = UltraServerJob("small", nodes=2)
    assert matches(two.group_selector(), devices[2, False]) and not matches(two.group_selector(), devices[4, False])


def test_only_the_group_class_selects_group_devices() -> None:
    devices = group_devices()
    node_device = resource_slices(build_pool(emulated_host("trn2u.48xlarge"), NodeFacts("n")))[0]["spec"]["devices"][0]
    group_class = k8s_names.ultraserver_class_selector(DRIVER)
    whole_class = k8s_names.device_class_selector(DRIVER, cores=False)
    for d in devices.values():
        assert matches(group_class, d) and not matches(whole_class, d)
    assert matches(whole_class, node_device) and not matches(group_class, node_device)


def test_the_manifests_are_valid_and_the_pods_name_both_claims() -> None:
    job = UltraServerJob("train", nodes=4, instance_types=["trn2u.48xlarge"], namespace="ml", lnc=1)
    claim, template = job.manifests()
    for m in (claim, template):
        kubeschema.validate(m, "1.34", strict=True)
        assert m["metadata"]["namespace"] == "ml"
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "ultraserver.neuron.aws.com"
    assert request["exactly"]["count"] == 1
    devices = template["spec"]["spec"]["devices"]
    neurons, efa = devices["requests"]
    assert neurons["exactly"]["allocationMode"] == "All"
    assert efa["exactly"]["count"] == 16  # trn2u: one EFA per device, all of them
    assert {"requests": ["neurons", "efa"], "matchAttribute": "resource.aws.com/devicegroup16_id"} in \
        devices["constraints"]
    assert any(c["opaque"]["parameters"] == {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig",
                                             "logicalNeuronCore": 1} for c in devices["config"])
    assert job.pod_claims() == [{"name": "ultraserver", "resourceClaimName": "train"},
                                {"name": "node", "resourceClaimTemplateName": "train-node"}]


def test_the_group_class_follows_the_driver_name() -> None:
    job = UltraServerJob("train", nodes=2, drivers=Drivers(neuron_driver="neuron.example.com"))
    assert job.group_claim()["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == \
        "ultraserver.neuron.example.com"
    assert 'device.attributes["neuron.example.com"].nodeCount == 2' in job.group_selector()


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    ({"nodes": 8}, "UltraServerJob.nodes", "1 to 4: no UltraServer of the target types is larger"),
    ({"nodes": 3}, "UltraServerJob.nodes", "an UltraServer set size: 1, 2, 4"),
    ({"nodes": True}, "UltraServerJob.nodes", "1 to 4"),
    ({"nodes": 2, "instance_types": "trn2.48xlarge"}, "UltraServerJob.instance_types", "an UltraServer instance type"),
    ({"nodes": 4, "instance_types": "trn3p.48xlarge", "efa": True}, "UltraServerJob.efa", "publish no per-device EFA"),
    ({"nodes": 4, "lnc": 3}, "Neuron.lnc", ""),
    ({"nodes": 4, "namespace": "Not_A_Namespace"}, "UltraServerJob.namespace", ""),
])
def test_bad_jobs_are_refused_naming_the_field(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(TemplateError) as e:
        UltraServerJob("train", **kwargs)
    assert e.value.field == field and allowed in e.value.allowed


def test_a_misspelt_keyword_names_the_right_one() -> None:
    with pytest.raises(TypeError, match="nodes"):
        UltraServerJob("train", node=4)  # type: ignore[call-arg]


# --- placement: claims check on UltraServerJobs ----------------------------------------------------------------


def test_check_job_counts_jobs_per_cluster_of_ultraservers() -> None:
    cluster = us_job.parse_ultraservers("trn2u.48xlarge:4,trn2u.48xlarge:2x3")
    four = check_job(UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge"), cluster)
    assert four.ok and four.jobs == 1
    assert [(f.ultraserver.nodes, f.groups) for f in four.fits] == [(4, ("ultraserver",)), (2, ())]
    assert "2-node groups only" in str(four.fits[1].reason)
    assert [f.claims_per_node for f in four.node_template.fits] == [1]  # one job pod per node
    two = check_job(UltraServerJob("small", nodes=2, instance_types="trn2u.48xlarge"), cluster)
    # A 4-node set runs two 2-node jobs on its halves; each 2-node set one.
    assert two.ok and two.jobs == 2 + 3
    assert two.fits[0].groups == (us.HALF_DEVICE, us.HALF_DEVICE)


def test_check_job_refuses_a_job_larger_than_every_ultraserver_given() -> None:
    report = check_job(UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge"),
                       us_job.parse_ultraservers("trn2u.48xlarge:2x3"))
    assert not report.ok and report.jobs == 0
    (error,) = report.errors
    assert "needs a 4-node group of trn2u.48xlarge; the largest there is 2 nodes" in error.message


def test_check_job_without_a_cluster_says_which_set_sizes_fit() -> None:
    report = check_job(UltraServerJob("small", nodes=2, instance_types="trn2u.48xlarge"))
    assert report.ok
    assert {f.ultraserver.nodes: f.jobs_each for f in report.fits} == {1: 0, 2: 1, 4: 2}


def test_an_ultraserver_of_another_type_does_not_take_the_job() -> None:
    report = check_job(UltraServerJob("train", nodes=4, instance_types="trn2u.48xlarge"),
                       us_job.parse_ultraservers("trn3p.48xlarge:4"))
    assert not report.ok and "not a target type" in str(report.fits[0].reason)


@pytest.mark.parametrize(("text", "allowed"), [
    ("trn2.48xlarge:4", "an UltraServer type of the catalog"),
    ("trn2u.48xlarge:3", "sets of 1, 2, 4 nodes"),
    ("trn2u.48xlarge", "TYPE:NODES[xCOUNT]"),
    ("trn2u.48xlarge:4x0", "a COUNT of 1 to 100000"),
    ("trn2u.48xlarge:4x99999,trn2u.48xlarge:2x99999", "at most 100000 UltraServers"),
])
def test_bad_ultraserver_descriptions_name_the_item(text: str, allowed: str) -> None:
    with pytest.raises(TemplateError) as e:
        us_job.parse_ultraservers(text)
    assert e.value.field == "--ultraservers" and allowed in e.value.allowed


def test_claims_check_and_render_take_jobs_from_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    file = tmp_path / "jobs.py"
    file.write_text("from neuron_dra.claim_templates.ultraserver import UltraServerJob\n"
                    "train = UltraServerJob('train', nodes=4, instance_types='trn2u.48xlarge')\n")
    assert main(["claims", "check", str(file), "--ultraservers", "trn2u.48xlarge:4x2,trn2u.48xlarge:2"]) == 0
    out = capsys.readouterr().out
    assert "the 3 UltraServer sets hold 2 such jobs at once" in out
    assert main(["claims", "check", str(file), "--ultraservers", "trn2u.48xlarge:2", "--json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["job"] == "default/train" and entry["jobsAtOnce"] == 0 and not entry["ok"]
    assert main(["claims", "check", str(file), "--ultraservers", "trn2u.48xlarge:5"]) == 2
    assert "--ultraservers" in capsys.readouterr().err
    assert main(["claims", "render", str(file)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [("ResourceClaim", "train"),
                                                                        ("ResourceClaimTemplate", "train-node")]


# --- the pod side: labels and LeaderWorkerSet's exclusive-topology affinity --------------------------------------


def test_the_pods_affinity_is_lws_exclusive_topology_on_the_controllers_label_of_the_jobs_size() -> None:
    four = UltraServerJob("train", nodes=4, namespace="ml")
    two = UltraServerJob("small", nodes=2, namespace="ml")
    assert four.pod_labels() == {"neuron.aws.com/ultraserver-job": "train"}
    assert four.topology_key == "neuron.aws.com/ultraserver" and two.topology_key == "neuron.aws.com/ultraserver-pair"
    affinity = four.affinity()
    (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together == {"labelSelector": {"matchLabels": four.pod_labels()}, "topologyKey": four.topology_key}
    assert apart["topologyKey"] == four.topology_key
    assert apart["labelSelector"]["matchExpressions"] == [
        {"key": four.job_label, "operator": "Exists"},
        {"key": four.job_label, "operator": "NotIn", "values": ["train"]}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0", "namespace": "ml",
                                                           "labels": four.pod_labels()},
           "spec": {"affinity": affinity, "resourceClaims": four.pod_claims(),
                    "containers": [{"name": "c", "image": "i", "resources": {"claims": [
                        {"name": c["name"]} for c in four.pod_claims()]}}]}}
    kubeschema.validate(pod, "1.34", strict=True)


def test_the_pod_side_follows_the_driver_name_and_long_names_keep_distinct_keys() -> None:
    job = UltraServerJob("train", nodes=4, drivers=Drivers(neuron_driver="neuron.example.com"))
    assert job.pod_labels() == {"neuron.example.com/ultraserver-job": "train"}
    assert job.topology_key == k8s_names.ultraserver_label_keys("neuron.example.com")[0]
    long_a, long_b = (UltraServerJob("j" * 70 + suffix, nodes=2) for suffix in ("a", "b"))
    assert k8s_names.is_label_value(long_a.group_key) and long_a.group_key != long_b.group_key


def test_the_topology_value_is_shared_by_exactly_the_nodes_each_group_device_selects() -> None:
    """What the controller labels (its model) and what the job's affinity names agree: for every group device, the
    nodes its selector names share one value of the job's topology key, and no other node has it."""
    slices = []
    for name, host_id, pos, mode in (("a", "u4", 0, 4), ("b", "u4", 1, 4), ("c", "u4", 2, 4), ("d", "u4", 3, 4),
                                     ("e", "u2", 0, 2), ("f", "u2", 1, 2), ("g", "u1", 0, 1)):
        host = emulated_host("trn2u.48xlarge", EmulationOptions(host_id=host_id, ultraserver_node=pos,
                                                                ultraserver_mode=mode))
        slices += resource_slices(build_pool(host, NodeFacts(name)), generation=1)
    facts, _ = us.member_facts(slices, DRIVER)
    membership = us.group_ultraservers(facts)
    labels = us.node_labels(membership, DRIVER)
    for s in us.desired_slices(membership, DRIVER):
        (device,) = s["spec"]["devices"]
        job = UltraServerJob("j", nodes=device["attributes"]["nodeCount"]["int"])
        selected = set(us.selected_nodes(s["spec"]["nodeSelector"]))
        values = {labels[n][job.topology_key] for n in selected}
        assert len(values) == 1, s["metadata"]["name"]
        assert {n for n, v in labels.items() if v.get(job.topology_key) in values} == selected
