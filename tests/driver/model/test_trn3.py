"""Trainium3: the catalog entries, emulation and discovery of all-to-all hosts, the published slices, and AWS
driver 1.2's attributes (docs/trainium3.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.model import config as driver_config
from neuron_dra.driver.model.catalog import BUILTIN, TopologyKind, torus_neighbours
from neuron_dra.driver.model.discovery import DiscoveryError, discover
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import (
    STANDARD_NUMA_NODE,
    WORKLOAD_LABEL,
    NodeFacts,
    PoolDevice,
    build_pool,
    resource_slices,
)
from tests.support import kubeschema

HostTree = Callable[..., Path]
GRID = ("topology_x", "topology_y", "topology4_id", "topology8_id")
ALL_TO_ALL = [t for t, s in BUILTIN.types.items() if s.topology is TopologyKind.ALL_TO_ALL]


def attr(dev: PoolDevice, name: str) -> Any:
    (value,) = dev.attributes[name].values()
    return value


@pytest.mark.process
def test_the_judged_command_prints_16_devices_of_144gi_and_8_cores_without_grid_attributes() -> None:
    out = subprocess.run([sys.executable, "-m", "neuron_dra", "slices", "--instance-type", "trn3.48xlarge",
                          "--node-name", "n1"], capture_output=True, text=True, check=True)
    (obj,) = json.loads(out.stdout)
    devices = obj["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"neuron-device-{i}" for i in range(16)]
    for d in devices:
        assert d["capacity"] == {"cores": {"value": "8"}, "memory": {"value": "144Gi"}}
        assert not set(d["attributes"]) & set(GRID)
        assert not [a for a in d["attributes"] if a.startswith("topology") and a.endswith("_id")]  # any N connected
        assert d["attributes"]["topologyKind"] == {"string": "all-to-all"}
        assert d["attributes"]["family"] == {"string": "trn3"}
        assert not {"deviceName", "neighbors"} & set(d["attributes"])  # repeats of family and topologyKind


@pytest.mark.parametrize("instance_type", ALL_TO_ALL)
def test_all_to_all_slices_are_schema_valid(instance_type: str) -> None:
    facts = NodeFacts("ip-10-0-1-2.ec2.internal", ("nn-1", "nn-2", "nn-3"), "cr-0123456789abcdef0", "job-a")
    pool = build_pool(emulated_host(instance_type), facts)
    for obj in resource_slices(pool, node_uid="7f0e0c0a-1111-2222-3333-444455556666"):
        kubeschema.validate(obj, "1.34", strict=True)


def test_trn3_ultraserver_publishes_ultraserver_id_and_keeps_capacity_block_id() -> None:
    host = emulated_host("trn3p.48xlarge")
    assert host.ultraserver is not None
    with_block = {d.name: d for d in build_pool(host, NodeFacts("n", capacity_block_id="cr-0abc")).devices}
    assert len(with_block) == 17  # 16 devices and the UltraServer pseudo-device
    for dev in with_block.values():
        assert attr(dev, "ultraserverId") == "cr-0abc" and attr(dev, "capacityBlockId") == "cr-0abc"
    # Without a capacity block the id is the host's UltraServer id, equal on the 4 nodes of one UltraServer.
    without = {d.name: d for d in build_pool(host, NodeFacts("n")).devices}
    assert attr(without["neuron-node"], "ultraserverId") == host.ultraserver.server_id_4
    assert "capacityBlockId" not in without["neuron-node"].attributes
    assert "ultraserverId" not in build_pool(emulated_host("trn3.48xlarge"), NodeFacts("n", capacity_block_id="cr-0abc")
                                             ).devices[0].attributes


def test_workload_id_comes_from_the_node_label_and_numa_node_is_the_standard_attribute() -> None:
    facts = NodeFacts.from_labels("n", {WORKLOAD_LABEL: "job-a"})
    assert facts.workload_id == "job-a"
    for dev in build_pool(emulated_host("trn3.48xlarge"), facts).devices:
        assert attr(dev, "workloadId") == "job-a"
        assert "numaNode" not in dev.attributes
    numa = [attr(d, STANDARD_NUMA_NODE) for d in build_pool(emulated_host("trn3.48xlarge"), NodeFacts("n")).devices]
    assert numa == [0] * 8 + [1] * 8
    assert "workloadId" not in build_pool(emulated_host("trn3.48xlarge"), NodeFacts.from_labels("n", {})
                                          ).devices[0].attributes


def _write_neighbours(root: Path, lists: Callable[[int], tuple[int, ...]]) -> None:
    for i in range(16):
        (root / f"sys/devices/virtual/neuron_device/neuron{i}/connected_devices").write_text(
            ", ".join(map(str, lists(i))))


def test_discovery_accepts_what_the_kernel_driver_writes_on_trn3(host_tree: HostTree) -> None:
    root = host_tree("trn3.48xlarge", neuron_ls=False)
    host = discover(root)
    assert host.spec.instance_type == "trn3.48xlarge" and len(host.devices) == 16
    assert host.devices[0].connected == tuple(range(1, 16))
    _write_neighbours(root, torus_neighbours)  # fw_io_topology_v3 still reports the trn2 torus on Trn3
    assert discover(root).devices[5].connected == (1, 4, 9, 6)
    _write_neighbours(root, lambda i: ())
    assert discover(root).devices[0].connected == ()


def test_discovery_refuses_other_neighbours_and_another_generation(host_tree: HostTree) -> None:
    root = host_tree("trn3.48xlarge", neuron_ls=False)
    (root / "sys/devices/virtual/neuron_device/neuron2/connected_devices").write_text("1, 3")
    with pytest.raises(DiscoveryError) as err:
        discover(root)
    message = str(err.value)
    assert "neuron2/connected_devices" in message and "all-to-all" in message and "'1, 3'" in message
    root2 = host_tree("trn3p.48xlarge", neuron_ls=False)
    (root2 / "sys/devices/virtual/neuron_device/neuron0/info/architecture/arch_type").write_text("NDv3\n")
    with pytest.raises(DiscoveryError, match="NDv4"):
        discover(root2)


def test_ultraserver_config_modes_follow_the_shape() -> None:
    trn3p = BUILTIN.spec("trn3p.48xlarge")
    for mode in (1, 2, 4):
        driver_config.check_applies(driver_config.UltraServerConfig(mode), trn3p)
    with pytest.raises(driver_config.ConfigError) as err:
        driver_config.check_applies(driver_config.UltraServerConfig(4), BUILTIN.spec("trn3.48xlarge"))
    assert "trn3p.48xlarge" in str(err.value)
    driver_config.check_applies(driver_config.NeuronConfig(1), BUILTIN.spec("trn3.48xlarge"))  # LNC on Trainium3


def test_trn3_lnc_gives_4_or_8_logical_cores_and_global_core_ids() -> None:
    host = emulated_host("trn3.48xlarge")
    assert list(host.global_core_ids(2)) == [8, 9, 10, 11]  # LNC 2 default: 4 logical cores per device
    assert list(host.global_core_ids(2, lnc=1)) == list(range(16, 24))
