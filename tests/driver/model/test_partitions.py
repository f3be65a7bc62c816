"""NeuronCore partitions: the counters and core devices in the slices (API limits, no overlap by construction),
the node's LNC, and prepare exposing exactly the allocated cores."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon.claims.allocation import Reason
from neuron_dra.driver.daemon.claims.cdi import CdiStore
from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint
from neuron_dra.driver.daemon.claims.state import DriverState
from neuron_dra.driver.kubeletplugin._claimref import ClaimFailed, ClaimRef
from neuron_dra.driver.model.catalog import CATALOG, get_instance_spec
from neuron_dra.driver.model.devices import NeuronHost
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.partitions import (
    LNC_FILE,
    CoreLayout,
    PartitionError,
    parse_core_device,
    read_node_lnc,
)
from neuron_dra.driver.model.slices import NodeFacts, PublishOptions, build_pool, resource_slices
from tests.support.driver import DRIVER, NEURON_CONFIG, NODE, FakeLookup, Served, claim, opaque, result, uid

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@functools.cache
def _host(instance_type: str) -> NeuronHost:
    return emulated_host(instance_type)


def _slices(instance_type: str, lnc: int | None = None) -> list[dict[str, Any]]:
    host = _host(instance_type)
    layout = CoreLayout.for_spec(host.spec, lnc)
    facts = NodeFacts(NODE, ("nn-1", "nn-2", "nn-3"), "cb-1")
    return resource_slices(build_pool(host, facts, PublishOptions(cores=layout)), generation=3)


def _quantity(text: str) -> int:
    units = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
    m = re.match(r"^(\d+)(Ki|Mi|Gi|Ti|)$", text)
    assert m, text
    return int(m.group(1)) * units[m.group(2)]


@pytest.mark.parametrize("instance_type", sorted(CATALOG))
@pytest.mark.parametrize("lnc", [1, 2])
def test_slices_respect_the_api_limits_and_counters_cover_every_allocation(instance_type: str, lnc: int) -> None:
    slices = _slices(instance_type, lnc)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    device_slices = [s for s in slices if "devices" in s["spec"]]
    assert len(counter_slices) + len(device_slices) == len(slices)  # never both in one slice
    for s in slices:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": len(slices)}
        assert s["spec"]["nodeName"] == NODE
    sets: dict[str, Mapping[str, Any]] = {}
    for s in counter_slices:
        assert 1 <= len(s["spec"]["sharedCounters"]) <= 8
        for cs in s["spec"]["sharedCounters"]:
            assert DNS_LABEL.match(cs["name"]) and cs["name"] not in sets
            assert 1 <= len(cs["counters"]) <= 32 and all(DNS_LABEL.match(n) for n in cs["counters"])
            sets[cs["name"]] = cs["counters"]
    devices = [d for s in device_slices for d in s["spec"]["devices"]]
    for s in device_slices:
        assert len(s["spec"]["devices"]) <= 64
    names = [d["name"] for d in devices]
    assert len(set(names)) == len(names) and all(DNS_LABEL.match(n) for n in names)
    spec = get_instance_spec(instance_type)
    layout = CoreLayout.for_spec(spec, lnc)
    cores = [d for d in devices if parse_core_device(d["name"])]
    whole = [d for d in devices if d["attributes"]["resourceType"]["string"] == "neuron_device"]
    assert len(whole) == spec.device_count and len(sets) == spec.device_count
    assert len(cores) == spec.device_count * layout.logical_per_device
    for d in devices:
        assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32
        assert len(d.get("consumesCounters", [])) <= 2
        for c in d.get("consumesCounters", []):
            available = sets[c["counterSet"]]
            assert set(c["counters"]) <= set(available)  # references resolve: the pool is valid
    # By construction: the whole device uses up its set; the cores of a device exactly add up to it, and no
    # physical-core counter is consumed by two cores.
    for w in whole:
        (consumption,) = w["consumesCounters"]
        assert consumption["counters"] == sets[consumption["counterSet"]]
        mine = [c for c in cores if c["attributes"]["deviceId"] == w["attributes"]["deviceId"]]
        used: dict[str, int] = {}
        for c in mine:
            (cc,) = c["consumesCounters"]
            assert cc["counterSet"] == consumption["counterSet"]
            for name, v in cc["counters"].items():
                used[name] = used.get(name, 0) + _quantity(v["value"])
        assert used == {n: _quantity(v["value"]) for n, v in consumption["counters"].items()}
    # Each core's NEURON_RT_VISIBLE_CORES id and its groups: aligned, contiguous ranges inside one device.
    for c in cores:
        index, logical = parse_core_device(c["name"]) or (-1, -1)
        a = c["attributes"]
        assert a["neuronCoreId"]["int"] == index * layout.logical_per_device + logical
        assert a["coreIndex"]["int"] == logical and a["lnc"]["int"] == layout.lnc
        for n in layout.group_sizes():
            members = [x for x in cores if x["attributes"][f"coreGroup{n}_id"] == a[f"coreGroup{n}_id"]]
            ids = sorted(x["attributes"]["neuronCoreId"]["int"] for x in members)
            assert len(ids) == n and ids == list(range(ids[0], ids[0] + n)) and ids[0] % n == 0
            assert {x["attributes"]["deviceId"]["int"] for x in members} == {index}


def test_trn2_48xlarge_publishes_64_cores_at_lnc2_and_128_at_lnc1() -> None:
    for lnc, count, sizes in ((2, 64, (1, 2, 4)), (1, 128, (1, 2, 4, 8))):
        slices = _slices("trn2.48xlarge", lnc)
        cores = [d for s in slices for d in s["spec"].get("devices", []) if parse_core_device(d["name"])]
        assert len(cores) == count
        assert CoreLayout.for_spec(get_instance_spec("trn2.48xlarge"), lnc).claim_sizes() == sizes
        first = next(d for d in cores if d["name"] == "neuron-device-0-core-1")
        assert first["capacity"] == {"cores": {"value": str(lnc)}, "memory": {"value": f"{12 * lnc}Gi"}}
        assert first["consumesCounters"][0]["counters"] == {
            **{f"core{p}": {"value": "1"} for p in range(lnc, 2 * lnc)}, "memory": {"value": f"{12 * lnc}Gi"}}


def test_without_core_layout_the_slices_are_as_before() -> None:
    host = _host("trn2.48xlarge")
    slices = resource_slices(build_pool(host, NodeFacts(NODE), PublishOptions()))
    assert len(slices) == 1 and "sharedCounters" not in slices[0]["spec"]
    assert all("consumesCounters" not in d for d in slices[0]["spec"]["devices"])


def test_node_lnc_from_flag_file_and_family(tmp_path: Path) -> None:
    trn2, trn1 = get_instance_spec("trn2.48xlarge"), get_instance_spec("trn1.32xlarge")
    assert read_node_lnc(tmp_path, trn2) == 2  # no file: the family's default
    (tmp_path / LNC_FILE).parent.mkdir(parents=True)
    (tmp_path / LNC_FILE).write_text("NEURON_LOGICAL_NC_CONFIG=1")  # as the EKS launch template writes it
    assert read_node_lnc(tmp_path, trn2) == 1
    assert read_node_lnc(tmp_path, trn2, override=2) == 2
    assert read_node_lnc(tmp_path, trn1) == 1
    (tmp_path / LNC_FILE).write_text("NEURON_LOGICAL_NC_CONFIG=4\n")
    with pytest.raises(PartitionError, match=r"NEURON_LOGICAL_NC_CONFIG='4' is not allowed; allowed: 1 or 2"):
        read_node_lnc(tmp_path, trn2)
    with pytest.raises(PartitionError, match="has no Logical NeuronCores"):
        read_node_lnc(tmp_path, trn1, override=2)


# --- prepare ------------------------------------------------------------------------------------------------


def _state(tmp_path: Path, lookup: FakeLookup, lnc: int = 2) -> Served:
    root = emulate("trn2.48xlarge", tmp_path / "host")
    host = discover(root)
    (tmp_path / "plugin").mkdir(exist_ok=True)
    s = DriverState(host=host, host_root=root, driver_name=DRIVER, pool_name=NODE,
                    cdi=CdiStore(tmp_path / "cdi", DRIVER), checkpoint=Checkpoint(tmp_path / "plugin" / "cp.json"),
                    lookup=lookup, cores=CoreLayout.for_spec(host.spec, lnc))
    s.load()
    s.reconcile_local()
    return Served(s, lookup)


def _container_edits(tmp_path: Path, claim_uid: str) -> tuple[list[str], list[str]]:
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_{claim_uid}.json").read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    return env, nodes


def test_prepare_exposes_exactly_the_allocated_cores(tmp_path: Path) -> None:
    lookup = FakeLookup()
    state = _state(tmp_path, lookup)
    lookup.put(claim("a", uid(1), [result(f"neuron-device-3-core-{c}", "cores") for c in (0, 1)]))
    lookup.put(claim("b", uid(2), [result("neuron-device-3-core-2", "cores")]))
    answers = state.prepare([_ref("a", 1), _ref("b", 2)])
    assert not any(isinstance(v, ClaimFailed) for v in answers.values()), answers
    env, nodes = _container_edits(tmp_path, uid(1))
    assert "NEURON_RT_VISIBLE_CORES=12-13" in env and "NEURON_LOGICAL_NC_CONFIG=2" in env and nodes == ["/dev/neuron3"]
    env, nodes = _container_edits(tmp_path, uid(2))
    assert "NEURON_RT_VISIBLE_CORES=14" in env and nodes == ["/dev/neuron3"]
    ids = [d.cdi_device_ids for d in answers[uid(1)]]
    assert len(ids[0]) == 2 and len(ids[1]) == 1 and ids[1][0] == ids[0][1]  # /dev/neuron3 named once
    held = state.prepared()
    assert held[uid(1)].neuron_cores == (24, 25, 26, 27) and held[uid(2)].neuron_cores == (28, 29)
    # The whole device overlaps both core claims; another core of the device does not.
    lookup.put(claim("c", uid(3), [result("neuron-device-3")]))
    err = state.prepare([_ref("c", 3)])[uid(3)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.DEVICE_BUSY
    assert "Neuron device(s) 3 (physical cores 3: 0-5)" in err.message
    lookup.put(claim("d", uid(4), [result("neuron-device-3-core-3", "cores")]))
    assert not isinstance(state.prepare([_ref("d", 4)])[uid(4)], ClaimFailed)


def test_prepare_at_lnc1_and_a_claim_lnc_that_contradicts_the_node(tmp_path: Path) -> None:
    lookup = FakeLookup()
    state = _state(tmp_path, lookup, lnc=1)
    lookup.put(claim("a", uid(1), [result("neuron-device-1-core-7", "cores")]))
    assert not isinstance(state.prepare([_ref("a", 1)])[uid(1)], ClaimFailed)
    env, _ = _container_edits(tmp_path, uid(1))
    assert "NEURON_RT_VISIBLE_CORES=15" in env and "NEURON_LOGICAL_NC_CONFIG=1" in env
    lookup.put(claim("b", uid(2), [result("neuron-device-2-core-0", "cores")],
                     configs=[opaque({**NEURON_CONFIG, "logicalNeuronCore": 2})]))
    err = state.prepare([_ref("b", 2)])[uid(2)]
    assert isinstance(err, ClaimFailed) and err.reason == Reason.BAD_CONFIG
    assert "published at the node's LNC 1" in err.message
    # Whole devices follow the node's LNC too: 8 logical cores per device at LNC=1.
    lookup.put(claim("c", uid(3), [result("neuron-device-2")]))
    assert not isinstance(state.prepare([_ref("c", 3)])[uid(3)], ClaimFailed)
    env, _ = _container_edits(tmp_path, uid(3))
    assert "NEURON_RT_VISIBLE_CORES=16-23" in env


def _ref(name: str, n: int) -> ClaimRef:
    return ClaimRef("default", name, uid(n))


@pytest.mark.process
def test_cli_slices_with_cores() -> None:
    run = [sys.executable, "-m", "neuron_dra", "slices", "--node-name", "n1", "--instance-type"]
    out = subprocess.run([*run, "trn2.48xlarge", "--cores"], capture_output=True, text=True, check=True)
    slices = json.loads(out.stdout)
    assert [len(s["spec"].get("devices") or s["spec"]["sharedCounters"]) for s in slices] == [8, 8, 64, 16]
    bad = subprocess.run([*run, "inf2.xlarge", "--cores", "--lnc", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "inf2.xlarge (Inferentia2) has no Logical NeuronCores" in bad.stderr
