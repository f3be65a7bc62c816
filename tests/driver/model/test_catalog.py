from __future__ import annotations

import dataclasses

import pytest

from neuron_dra.driver.model.catalog import (
    BUILTIN,
    CATALOG,
    TopologyKind,
    UnknownInstanceTypeError,
    expected_neighbours,
    get_instance_spec,
    ring_neighbours,
    torus_neighbours,
)

GIB = 1024**3

# instance type -> (devices, physical cores/device, HBM GiB, topology, EFA count, LNC supported)
# (docs/neuron-hardware.md §1, docs/trainium3.md)
EXPECTED = {
    "trn1.2xlarge": (1, 2, 32, TopologyKind.SINGLE, 0, False),
    "trn1.32xlarge": (16, 2, 32, TopologyKind.TORUS_4X4, 8, False),
    "trn1n.32xlarge": (16, 2, 32, TopologyKind.TORUS_4X4, 16, False),
    "trn2.3xlarge": (1, 8, 96, TopologyKind.SINGLE, 1, True),
    "trn2.48xlarge": (16, 8, 96, TopologyKind.TORUS_4X4, 16, True),
    "trn2u.48xlarge": (16, 8, 96, TopologyKind.TORUS_4X4, 16, True),
    "inf2.xlarge": (1, 2, 32, TopologyKind.SINGLE, 0, False),
    "inf2.8xlarge": (1, 2, 32, TopologyKind.SINGLE, 0, False),
    "inf2.24xlarge": (6, 2, 32, TopologyKind.RING, 0, False),
    "inf2.48xlarge": (12, 2, 32, TopologyKind.RING, 0, False),
    # Trainium3 (docs/trainium3.md): EFA count unpublished, we launch with one interface.
    "trn3.48xlarge": (16, 8, 144, TopologyKind.ALL_TO_ALL, 1, True),
    "trn3p.48xlarge": (16, 8, 144, TopologyKind.ALL_TO_ALL, 1, True),
}


def test_catalog_covers_exactly_the_facts_sheet() -> None:
    assert set(CATALOG) == set(EXPECTED)


@pytest.mark.parametrize("instance_type", sorted(EXPECTED))
def test_catalog_entry(instance_type: str) -> None:
    devices, cores, hbm, topology, efa, lnc = EXPECTED[instance_type]
    spec = get_instance_spec(instance_type)
    assert spec.device_count == devices
    assert spec.physical_cores_per_device == cores
    assert spec.hbm_bytes_per_device == hbm * GIB
    assert spec.topology is topology
    assert spec.efa_count == efa
    assert spec.lnc_supported is lnc
    if spec.device_efa_bdfs:
        assert len(spec.device_efa_bdfs) == devices
        assert len(set(spec.device_efa_bdfs)) == efa


def test_unknown_instance_type_lists_known_ones_and_how_to_add_one() -> None:
    with pytest.raises(UnknownInstanceTypeError) as exc:
        get_instance_spec("trn9.48xlarge")
    message = str(exc.value)
    assert "'trn9.48xlarge'" in message
    for known in EXPECTED:
        assert known in message
    assert "catalog file" in message and "--catalog FILE" in message and "NEURON_DRA_CATALOG" in message


def test_trainium3_is_all_to_all_with_lnc_2_by_default() -> None:
    spec = get_instance_spec("trn3.48xlarge")
    assert spec.family.device_name == "Trainium3" and spec.family.core_generation == "NeuronCore-v4"
    assert spec.logical_cores_per_device() == 4 and spec.logical_cores_per_device(1) == 8
    assert spec.group_sizes() == tuple(range(1, 17))  # any N devices are connected
    assert not spec.grid and spec.all_to_all and spec.ultraserver is None
    assert expected_neighbours(spec, 3) == tuple(i for i in range(16) if i != 3)
    us = get_instance_spec("trn3p.48xlarge")
    assert us.ultraserver is not None and us.ultraserver.servers == 4 and us.ultraserver.modes == (1, 2, 4)


def test_catalog_is_a_value_extended_without_touching_the_builtin() -> None:
    trn3 = BUILTIN.spec("trn3.48xlarge")
    mine = dataclasses.replace(trn3, instance_type="acme.16xlarge", device_count=8, source="test")
    extended = BUILTIN.extended([mine], [], "test")
    assert "acme.16xlarge" in extended and "acme.16xlarge" not in BUILTIN and "acme.16xlarge" not in CATALOG
    assert extended.spec("acme.16xlarge").device_count == 8
    assert extended.names[: len(BUILTIN)] == BUILTIN.names  # built-in order kept, additions last
    assert hash(extended) != hash(BUILTIN) and extended == BUILTIN.extended([mine], [], "test")
    with pytest.raises(UnknownInstanceTypeError, match=r"acme\.16xlarge"):
        extended.spec("nope.xlarge")


def test_logical_cores_follow_lnc() -> None:
    trn2 = get_instance_spec("trn2.48xlarge")
    assert trn2.logical_cores_per_device() == 4  # LNC=2 default
    assert trn2.logical_cores_per_device(1) == 8
    assert get_instance_spec("trn1.32xlarge").logical_cores_per_device() == 2


def test_torus_neighbours_match_sysfs_examples() -> None:
    assert torus_neighbours(0) == (12, 3, 4, 1)
    assert torus_neighbours(5) == (1, 4, 9, 6)
    assert torus_neighbours(15) == (11, 14, 3, 12)
    for d in range(16):  # links are symmetric, 4 each
        for n in torus_neighbours(d):
            assert d in torus_neighbours(n)


def test_ring_neighbours_wrap() -> None:
    assert ring_neighbours(0, 12) == (11, 1)
    assert ring_neighbours(11, 12) == (10, 0)
    assert ring_neighbours(0, 1) == ()


def test_group_sizes_per_topology() -> None:
    assert get_instance_spec("trn2.48xlarge").group_sizes() == (1, 4, 8, 16)
    assert get_instance_spec("inf2.48xlarge").group_sizes() == (1, 2, 3, 4, 6, 12)
    assert get_instance_spec("inf2.24xlarge").group_sizes() == (1, 2, 3, 6)
    assert get_instance_spec("trn2.3xlarge").group_sizes() == (1,)


def test_families() -> None:
    assert BUILTIN.of_family("trn2") == ("trn2.3xlarge", "trn2.48xlarge")
    with pytest.raises(ValueError, match="known families: trn1, trn1n, trn2, trn2u, inf2"):
        BUILTIN.of_family("p5")
