"""The published ResourceSlice model: schema-valid, AWS-compatible attributes and exact topology ids."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.model.catalog import CATALOG
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import (
    NodeFacts,
    PoolDevice,
    PublishOptions,
    build_pool,
    devicegroup_id,
    resource_slices,
)
from tests.support import kubeschema

HostTree = Callable[..., Path]
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED = re.compile(rf"^(?:{DNS_SUBDOMAIN}/)?[A-Za-z_][A-Za-z0-9_]*$")


def pool_of(instance_type: str, **facts: Any) -> dict[str, PoolDevice]:
    pool = build_pool(emulated_host(instance_type), NodeFacts("node-a", **facts))
    return {d.name: d for d in pool.devices}


def attr(dev: PoolDevice, name: str) -> Any:
    (value,) = dev.attributes[name].values()
    return value


@pytest.mark.parametrize("instance_type", sorted(CATALOG))
def test_slices_pass_kubernetes_validate_strict_1_34(instance_type: str) -> None:
    facts = NodeFacts("ip-10-0-1-2.ec2.internal", ("nn-1", "nn-2", "nn-3"), "cr-0123456789abcdef0")
    pool = build_pool(emulated_host(instance_type), facts)
    objs = resource_slices(pool, generation=3, node_uid="7f0e0c0a-1111-2222-3333-444455556666")
    assert len(objs) == 1
    for obj in objs:
        kubeschema.validate(obj, "1.34", strict=True)
        assert obj["spec"]["pool"] == {"name": facts.node_name, "generation": 3, "resourceSliceCount": 1}
        assert obj["metadata"]["generateName"] == f"{facts.node_name}-neuron.aws.com-"
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"


@pytest.mark.parametrize("instance_type", sorted(CATALOG))
def test_api_limits(instance_type: str) -> None:
    # Every optional attribute set: the 32 attributes + capacities per device must hold for every type.
    facts = NodeFacts("n", ("nn-1", "nn-2", "nn-3"), "cr-0123456789abcdef0", workload_id="job-a")
    for dev in build_pool(emulated_host(instance_type), facts).devices:
        assert len(dev.attributes) + len(dev.capacity) <= 32
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", dev.name) and len(dev.name) <= 63
        for name, value in dev.attributes.items():
            assert QUALIFIED.match(name), name
            assert len(name.rsplit("/", 1)[-1]) <= 32
            assert len(value) == 1 and next(iter(value)) in ("int", "bool", "string", "version")
            if "string" in value:
                assert len(value["string"]) <= 64


def test_aws_attributes_and_types_on_trn2() -> None:
    devs = pool_of("trn2.48xlarge")
    assert list(devs) == [f"neuron-device-{i}" for i in range(16)]
    d5 = devs["neuron-device-5"]
    assert d5.attributes["deviceId"] == {"int": 5}
    assert d5.attributes["instanceType"] == {"string": "trn2.48xlarge"}
    assert d5.attributes["neuronDriverVersion"] == {"string": "2.25.4.0"}
    assert d5.attributes["draDriverVersion"] == {"version": "0.1.0"}
    assert d5.attributes["resourceType"] == {"string": "neuron_device"}
    assert d5.attributes["topology_x"] == {"int": 1}
    assert d5.attributes["topology_y"] == {"int": 1}
    assert d5.attributes["topology4_id"] == {"int": 1}
    assert d5.attributes["topology8_id"] == {"int": 0}
    assert d5.attributes["family"] == {"string": "trn2"}
    assert d5.capacity == {"cores": "8", "memory": "96Gi"}
    # Nothing twice (the scheduler copies every attribute per CEL evaluation): `cores` is the capacity, the NUMA node
    # the standard attribute, the group of one the deviceId, the device name a function of the family, the
    # neighbours the catalog's for the topology kind and deviceId.
    assert not {"coreCount", "numaNode", "topology1_id", "deviceName", "neighbors"} & set(d5.attributes)
    assert "capacityBlockId" not in d5.attributes  # only on UltraServers


def test_torus_coordinates_pinned() -> None:
    devs = pool_of("trn1.32xlarge")
    coords = {i: (attr(devs[f"neuron-device-{i}"], "topology_x"), attr(devs[f"neuron-device-{i}"], "topology_y"))
              for i in range(16)}
    assert coords[0] == (0, 0) and coords[3] == (0, 3) and coords[4] == (1, 0) and coords[14] == (3, 2)
    assert [attr(devs[f"neuron-device-{i}"], "topology4_id") for i in range(16)] == [i // 4 for i in range(16)]
    assert [attr(devs[f"neuron-device-{i}"], "topology8_id") for i in range(16)] == [0] * 8 + [1] * 8


# devicegroup ids pinned as literal values: SHA-256 of the sorted, de-duplicated EFA BDFs of each group.
PINNED_GROUPS = {
    "trn2.48xlarge": (
        ["13713e551cd37c19", "671622785349fddf", "237e3ef7b968b4d3", "b3d6ce1919d29f8f"],
        ["3593812b8066a078", "614e16dab9ba2f1f"], "821d14afaf11327d"),
    "trn1.32xlarge": (
        ["88a3c6ad1661fe1d", "69b2225fd72a59dd", "e3c29faa0cd11323", "178a9e264a26793e"],
        ["86c451036f622685", "aa86c05423d6e8cd"], "fb838249c99a6341"),
    "trn1n.32xlarge": (
        ["f9415ac86580cd2a", "81d377c56bbb18dd", "e367b751fc858d72", "6b9b077320083e11"],
        ["25ab6fa8d56db17d", "feac12f490fb3cba"], "9ea13cbe1ff23763"),
}


@pytest.mark.parametrize("instance_type", sorted(PINNED_GROUPS))
def test_devicegroup_ids_pinned(instance_type: str) -> None:
    g4, g8, g16 = PINNED_GROUPS[instance_type]
    devs = pool_of(instance_type)
    for i in range(16):
        d = devs[f"neuron-device-{i}"]
        assert attr(d, "resource.aws.com/devicegroup4_id") == g4[i // 4]
        assert attr(d, "resource.aws.com/devicegroup8_id") == g8[i // 8]
        assert attr(d, "resource.aws.com/devicegroup16_id") == g16


def test_devicegroup_algorithm_on_the_trn2_first_row() -> None:
    row = ["0000:c9:00.0", "0000:b4:00.0", "0000:b3:00.0", "0000:ca:00.0"]
    expected = hashlib.sha256(b"0000:b3:00.0,0000:b4:00.0,0000:c9:00.0,0000:ca:00.0").hexdigest()[:16]
    assert devicegroup_id(row) == expected == "13713e551cd37c19"
    assert devicegroup_id(row + row) == expected  # de-duplicated (trn1 shares one EFA between 2 devices)


@pytest.mark.parametrize(
    ("instance_type", "device", "efa"),
    [
        ("trn1.32xlarge", 3, "0000:a0:1a.0"),
        ("trn1n.32xlarge", 9, "0000:20:1a.0"),
        ("trn2.48xlarge", 12, "0000:f5:00.0"),
    ],
)
def test_devicegroup1_is_the_efa_bdf(instance_type: str, device: int, efa: str) -> None:
    assert attr(pool_of(instance_type)[f"neuron-device-{device}"], "resource.aws.com/devicegroup1_id") == efa


@pytest.mark.parametrize("instance_type", ["trn1.2xlarge", "trn2.3xlarge", "inf2.xlarge", "inf2.48xlarge"])
def test_no_aws_topology_where_aws_publishes_none(instance_type: str) -> None:
    for dev in pool_of(instance_type).values():
        assert not any(k.startswith("resource.aws.com/") for k in dev.attributes)
        assert "topology_x" not in dev.attributes


def test_inf2_ring_segments() -> None:
    devs = pool_of("inf2.48xlarge")
    d7 = devs["neuron-device-7"]
    assert attr(d7, "topologyKind") == "ring"
    assert {k: attr(d7, k) for k in d7.attributes if k.startswith("topology") and k.endswith("_id")} == {
        "topology2_id": 3, "topology3_id": 2, "topology4_id": 1, "topology6_id": 1,
        "topology12_id": 0}
    assert d7.capacity == {"cores": "2", "memory": "32Gi"}


def test_single_device_host_has_no_group_id() -> None:
    (dev,) = pool_of("trn2.3xlarge").values()
    assert attr(dev, "topologyKind") == "single" and attr(dev, "deviceId") == 0
    assert not any(k.startswith("topology") and k.endswith("_id") for k in dev.attributes)


def test_ultraserver_pseudo_device_and_capacity_block() -> None:
    devs = pool_of("trn2u.48xlarge", capacity_block_id="cr-0123456789abcdef0")
    node = devs["neuron-node"]
    assert attr(node, "resourceType") == "neuron_node"
    assert attr(node, "deviceCount") == 16
    assert {attr(devs[f"neuron-device-{i}"], "resourceType") for i in range(16)} == {"neuron_device"}
    assert attr(devs["neuron-device-0"], "capacityBlockId") == "cr-0123456789abcdef0"


def test_network_node_layers_from_node_labels() -> None:
    labels = {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3)}
    facts = NodeFacts.from_labels("n", labels)
    pool = build_pool(emulated_host("trn2.48xlarge"), facts)
    assert [attr(pool.devices[0], f"networkNodeLayer{i}") for i in (1, 2, 3)] == ["nn-1", "nn-2", "nn-3"]


def test_driver_name_is_configurable() -> None:
    pool = build_pool(emulated_host("inf2.xlarge"), NodeFacts("n"), PublishOptions(driver_name="neuron.example.com"))
    (obj,) = resource_slices(pool)
    assert obj["spec"]["driver"] == "neuron.example.com"
    assert obj["metadata"]["generateName"] == "n-neuron.example.com-"


@pytest.mark.process
def test_cli_slices_emulated_equals_host_root(host_tree: HostTree) -> None:
    run = [sys.executable, "-m", "neuron_dra", "slices", "--node-name", "n1"]
    emulated = subprocess.run([*run, "--instance-type", "trn1n.32xlarge"], capture_output=True, text=True, check=True)
    on_disk = subprocess.run([*run, "--host-root", str(host_tree("trn1n.32xlarge"))], capture_output=True, text=True,
                             check=True)
    assert json.loads(emulated.stdout) == json.loads(on_disk.stdout)
    assert json.loads(emulated.stdout)[0]["spec"]["devices"][15]["name"] == "neuron-device-15"


@pytest.mark.process
def test_cli_errors_are_clear(host_tree: HostTree) -> None:
    bad = subprocess.run([sys.executable, "-m", "neuron_dra", "slices", "--node-name", "n", "--instance-type", "p5"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown Neuron instance type 'p5'" in bad.stderr and "trn2.48xlarge" in bad.stderr
    root = host_tree("inf2.24xlarge")
    (root / "sys/devices/virtual/neuron_device/neuron1/core_count").write_text("x")
    bad = subprocess.run([sys.executable, "-m", "neuron_dra", "slices", "--node-name", "n", "--host-root", str(root)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "neuron1/core_count" in bad.stderr and "'x'" in bad.stderr


@pytest.mark.process
def test_cli_emulate_writes_a_discoverable_tree(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "neuron_dra", "emulate", "trn2u.48xlarge", str(tmp_path / "h"),
                          "--ultraserver-node", "2"], capture_output=True, text=True, check=True)
    host = discover(Path(out.stdout.strip()))
    assert host.ultraserver is not None and host.ultraserver.node_id_4 == 2
    refused = subprocess.run([sys.executable, "-m", "neuron_dra", "emulate", "trn2u.48xlarge", str(tmp_path / "h")],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "non-empty" in refused.stderr


def test_capacity_block_id_from_the_node_groups_label() -> None:
    facts = NodeFacts.from_labels("n", {"neuron-dra/capacity-block-id": "cr-0123456789abcdef0"})
    assert facts.capacity_block_id == "cr-0123456789abcdef0"
    node = build_pool(emulated_host("trn2u.48xlarge"), facts).devices[-1]
    assert attr(node, "capacityBlockId") == "cr-0123456789abcdef0"
