"""The official samples' selectors (docs/neuron-hardware.md §5), evaluated with real CEL on the devices the driver
publishes.

The devices come straight from the driver's own model (emulated_host + build_pool), so this shows AWS's
samples select what they should on our driver: drop-in compatibility of the published attributes.
"""

from __future__ import annotations

import pytest

from neuron_dra.claim_templates.cel_env import CelDevice, CelEnvironment
from neuron_dra.driver.model.catalog import CATALOG
from neuron_dra.driver.model.emulate import EmulationOptions
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import NodeFacts, build_pool

A = 'device.attributes["neuron.aws.com"]'
CLASS = 'device.driver == "neuron.aws.com"'  # the official DeviceClass selector


def published(instance_type: str, options: EmulationOptions | None = None) -> list[CelDevice]:
    pool = build_pool(emulated_host(instance_type, options), NodeFacts("node-1"))
    return [CelDevice.from_api(pool.driver, d.to_api(), pool.name) for d in pool.devices]


@pytest.fixture(scope="module")
def devices() -> dict[str, list[CelDevice]]:
    return {t: published(t) for t in CATALOG}


def matching(env: CelEnvironment, expression: str, devices: list[CelDevice]) -> list[str]:
    return [d.name.rsplit("/", 1)[1] for d in devices if env.evaluate(CLASS, d) and env.evaluate(expression, d)]


def test_instance_type_selector_matches_the_16_trn2_devices(devices: dict[str, list[CelDevice]]) -> None:
    env = CelEnvironment()
    expr = f'{A}.instanceType == "trn2.48xlarge"'
    assert matching(env, expr, devices["trn2.48xlarge"]) == [f"neuron-device-{i}" for i in range(16)]
    assert {t for t, devs in devices.items() if matching(env, expr, devs)} == {"trn2.48xlarge"}


def test_kernel_driver_selector_matches_the_emulated_default_only(devices: dict[str, list[CelDevice]]) -> None:
    env = CelEnvironment()
    expr = f'{A}.neuronDriverVersion == "2.25.4.0"'
    for t, devs in devices.items():
        assert matching(env, expr, devs) == [d.name.rsplit("/", 1)[1] for d in devs], t  # every device, pseudo too
    other = published("trn2.48xlarge", EmulationOptions(kernel_driver_version="2.26.0.0"))
    assert matching(env, expr, other) == []


def test_resource_type_node_matches_exactly_the_ultraserver_pseudo_device(devices: dict[str, list[CelDevice]]
                                                                          ) -> None:
    env = CelEnvironment()
    expr = f'{A}.resourceType == "neuron_node"'
    assert {t: matching(env, expr, devs) for t, devs in devices.items() if matching(env, expr, devs)} == \
        {"trn2u.48xlarge": ["neuron-node"], "trn3p.48xlarge": ["neuron-node"]}
    device_expr = f'{A}.resourceType == "neuron_device"'
    assert len(matching(env, device_expr, devices["trn2u.48xlarge"])) == 16


@pytest.mark.parametrize(("size", "groups"), [(4, 4), (8, 2), (16, 1)])
def test_devicegroup_ids_partition_trn2_into_connected_groups(devices: dict[str, list[CelDevice]], size: int,
                                                               groups: int) -> None:
    """matchAttribute on devicegroup{N}_id (samples 1, 2, 8): N devices per value, rows of the torus."""
    by_value: dict[str, list[int]] = {}
    for d in devices["trn2.48xlarge"]:
        value = d.attributes["resource.aws.com"][f"devicegroup{size}_id"]["string"]
        by_value.setdefault(value, []).append(d.attributes["neuron.aws.com"]["deviceId"]["int"])
    assert sorted(by_value.values()) == [list(range(g * size, g * size + size)) for g in range(groups)]
    env = CelEnvironment()
    expr = f'"devicegroup{size}_id" in device.attributes["resource.aws.com"]'
    assert {t for t, devs in devices.items() if matching(env, expr, devs)} == \
        {"trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"}


def test_selectors_for_attributes_a_type_lacks_error_as_in_kubernetes(devices: dict[str, list[CelDevice]]) -> None:
    """Single-device and inf2 types publish no devicegroup ids: an unguarded read is an evaluation error."""
    from neuron_dra.claim_templates.cel_env import CelEvaluationError

    env = CelEnvironment()
    with pytest.raises(CelEvaluationError, match="devicegroup4_id"):
        env.evaluate('device.attributes["resource.aws.com"].devicegroup4_id == "x"', devices["inf2.48xlarge"][0])
