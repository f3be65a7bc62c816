"""The allocator simulation: the semantics of Kubernetes' structured allocator on hand-made and modelled nodes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from neuron_dra.claim_templates.allocator import COUNT_CAP, DeviceId, Simulator, simulate
from neuron_dra.claim_templates.cel_env import CelEnvironment
from neuron_dra.claim_templates.node_model import NodeCatalog

DRIVER = "d.example.com"


def dev(name: str, **attrs: object) -> dict[str, Any]:
    typed = {k: {"int" if isinstance(v, int) else "string": v} for k, v in attrs.items()}
    return {"name": name, "attributes": typed}


def slice_(devices: list[dict[str, Any]], node: str = "n1", driver: str = DRIVER, pool: str | None = None,
           generation: int = 0, count: int = 1, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"driver": driver, "pool": {"name": pool or node, "generation": generation,
                                                    "resourceSliceCount": count}, "devices": devices}
    if not spec:
        s["nodeName"] = node
    s.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": s}


def cls(name: str = "c", driver: str = DRIVER) -> dict[str, Any]:
    selector = {"cel": {"expression": f"device.driver == '{driver}'"}}
    return {"metadata": {"name": name}, "spec": {"selectors": [selector]}}


def req(name: str = "r", count: int | None = 1, selectors: tuple[str, ...] = (), klass: str = "c",
        admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": klass, "selectors": [{"cel": {"expression": s}} for s in selectors]}
    if count is None:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c1", "namespace": "ns"}, "spec": {"devices": devices}}


def names(result: Any, index: int = 0) -> list[str]:
    return [f"{d.request}:{d.device}" for d in result.allocation[index]]


def run(slices: list[dict[str, Any]], *claims: dict[str, Any], classes: list[dict[str, Any]] | None = None,
        **kw: Any) -> Any:
    return simulate(slices, classes or [cls()], list(claims), node_name="n1", **kw)


def test_first_solution_in_slice_order() -> None:
    r = run([slice_([dev("a"), dev("b"), dev("c")])], claim(req(count=2)))
    assert r.satisfiable and names(r) == ["r:a", "r:b"]


def test_match_attribute_backtracks_and_skips_devices_without_it() -> None:
    devices = [dev("a", g=1), dev("x"), dev("b", g=2), dev("c", g=2)]
    r = run([slice_(devices)], claim(req(count=2), constraints=[{"matchAttribute": f"{DRIVER}/g"}]))
    assert names(r) == ["r:b", "r:c"]
    r = run([slice_(devices)], claim(req(count=3), constraints=[{"matchAttribute": f"{DRIVER}/g"}]))
    assert not r.satisfiable and r.error is None


def test_match_attribute_compares_type_and_value_across_named_requests() -> None:
    devices = [dev("a", g=1), dev("b", g="1"), dev("c", g=1)]
    c = claim(req("p"), req("q"), constraints=[{"requests": ["p", "q"], "matchAttribute": f"{DRIVER}/g"}])
    assert names(run([slice_(devices)], c)) == ["p:a", "q:c"]  # string "1" is not int 1
    unconstrained = claim(req("p"), req("q"), constraints=[{"requests": ["p"], "matchAttribute": f"{DRIVER}/g"}])
    assert names(run([slice_(devices)], unconstrained)) == ["p:a", "q:b"]


def test_class_selectors_run_before_request_selectors() -> None:
    """The request selector reads an attribute only the class's devices have; other drivers' devices never error."""
    slices = [slice_([dev("e")], driver="other.example.com"), slice_([dev("a", k=1)])]
    r = run(slices, claim(req(selectors=(f"device.attributes['{DRIVER}'].k == 1",))))
    assert r.satisfiable and r.error is None and names(r) == ["r:a"]


def test_a_cel_runtime_error_aborts_allocation() -> None:
    r = run([slice_([dev("a"), dev("b", k=1)])], claim(req(selectors=(f"device.attributes['{DRIVER}'].k == 1",))))
    assert not r.satisfiable
    assert r.error is not None and "CEL runtime error" in r.error and "no such key: k" in r.error
    assert f"{DRIVER}/n1/a" in r.error


def test_all_mode() -> None:
    s = [slice_([dev("a", k=1), dev("b", k=2), dev("c", k=1)])]
    only_ones = claim(req(count=None, selectors=(f"device.attributes['{DRIVER}'].k == 1",)))
    assert names(run(s, only_ones)) == ["r:a", "r:c"]
    # ALL needs every matching device free, and at least one.
    assert not run(s, only_ones, allocated=[DeviceId(DRIVER, "n1", "c")]).satisfiable
    none = claim(req(count=None, selectors=(f"device.attributes['{DRIVER}'].k == 3",)))
    assert not run(s, none).satisfiable
    # A constraint one of the devices breaks is an error, not just "does not fit".
    broken = claim(req(count=None), constraints=[{"matchAttribute": f"{DRIVER}/k"}])
    assert "cannot add device" in (run(s, broken).error or "")


def test_first_available_takes_the_first_alternative_that_fits() -> None:
    s = [slice_([dev("a", k=1), dev("b", k=2)])]
    fa = {"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "c", "count": 3},
        {"name": "twos", "deviceClassName": "c", "count": 1,
         "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].k == 2"}}]},
        {"name": "any", "deviceClassName": "c", "count": 1}]}
    r = run(s, claim(fa, constraints=[{"requests": ["r/twos"], "matchAttribute": f"{DRIVER}/k"}]))
    assert names(r) == ["r/twos:b"]


def test_claim_limit_of_32_devices() -> None:
    s = [slice_([dev(f"d{i}") for i in range(40)])]
    assert "exceeds the claim limit of 32" in (run(s, claim(req(count=33))).error or "")
    # An alternative that would pass 32 devices is skipped for one that does not.
    fa = {"name": "f", "firstAvailable": [{"name": "many", "deviceClassName": "c", "count": 20},
                                          {"name": "few", "deviceClassName": "c", "count": 2}]}
    r = run(s, claim(req("first", count=20), fa))
    assert r.satisfiable and [d.request for d in r.allocation[0]][-2:] == ["f/few", "f/few"]


def test_pools_newest_generation_complete_and_for_this_node() -> None:
    old = slice_([dev("old")], generation=1)
    new = slice_([dev("new")], generation=2)
    assert names(run([old, new], claim(req()))) == ["r:new"]
    incomplete = slice_([dev("a")], count=2)
    # 1.36: an incomplete pool gives no devices (1.34 still allocated ExactCount requests from its slices).
    assert not run([incomplete], claim(req())).satisfiable
    assert "currently being updated" in (run([incomplete], claim(req(count=None))).error or "")
    other_node = slice_([dev("x")], node="n2")
    assert not run([other_node], claim(req())).satisfiable
    everywhere = slice_([dev("net")], pool="net", allNodes=True)
    assert names(run([other_node, everywhere], claim(req()))) == ["r:net"]
    selected = slice_([dev("z")], pool="z", nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}]})
    assert run([selected], claim(req()), node_labels={"zone": "a"}).satisfiable
    assert not run([selected], claim(req()), node_labels={"zone": "b"}).satisfiable
    duplicate = slice_([dev("a"), dev("a")])
    assert "invalid resource pools" in (run([duplicate], claim(req())).error or "")


def test_unknown_class_is_an_error() -> None:
    assert "could not retrieve device class nope" in (run([slice_([dev("a")])], claim(req(klass="nope"))).error or "")


def test_count_mode_and_admin_access() -> None:
    s = [slice_([dev(f"d{i}") for i in range(5)])]
    r = run(s, claim(req(count=2)), mode="count")
    assert r.count == 2 and [names(r, i) for i in range(2)] == [["r:d0", "r:d1"], ["r:d2", "r:d3"]]
    r = run(s, claim(req(count=2)), mode="count", allocated=[DeviceId(DRIVER, "n1", "d0")])
    assert r.count == 2 and names(r, 0) == ["r:d1", "r:d2"]
    # Admin access does not take devices away, so copies keep fitting up to the cap.
    assert run(s, claim(req(count=5, admin=True)), mode="count").count == COUNT_CAP


def test_packing_on_modelled_nodes() -> None:
    """A 4-connected trn2 claim fits 4 per trn2.48xlarge, each a torus row."""
    node = NodeCatalog().node("trn2.48xlarge")
    c = claim(req(count=4, klass="neuron.aws.com"),
              constraints=[{"matchAttribute": "resource.aws.com/devicegroup4_id"}])
    r = simulate(node.slices, node.device_classes, [c], node_name=node.node_name, mode="count")
    assert r.count == 4
    assert [[d.device for d in a] for a in r.allocation] == [
        [f"neuron-device-{i}" for i in range(g * 4, g * 4 + 4)] for g in range(4)]


def _random_case(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any], list[DeviceId]]:
    devices = [dev(f"d{i}", g=rng.randrange(3), h=rng.randrange(2)) for i in range(rng.randrange(3, 9))]
    if rng.random() < 0.3:
        del devices[rng.randrange(len(devices))]["attributes"]["g"]
    requests = []
    for i in range(rng.randrange(1, 3)):
        sel = (f"device.attributes['{DRIVER}'].h == {rng.randrange(2)}",) if rng.random() < 0.5 else ()
        if rng.random() < 0.2:
            requests.append({"name": f"r{i}", "firstAvailable": [
                {"name": "a", "deviceClassName": "c", "count": rng.randrange(2, 5)},
                {"name": "b", "deviceClassName": "c", "count": 1}]})
        else:
            requests.append(req(f"r{i}", count=None if rng.random() < 0.1 else rng.randrange(1, 4), selectors=sel))
    constraints = []
    if rng.random() < 0.7:
        named = [r["name"] for r in requests if rng.random() < 0.7]
        constraints.append({"requests": named, "matchAttribute": f"{DRIVER}/g"} if named
                           else {"matchAttribute": f"{DRIVER}/g"})
    allocated = [DeviceId(DRIVER, "n1", d["name"]) for d in devices if rng.random() < 0.2]
    return [slice_(devices)], claim(*requests, constraints=constraints), allocated


@pytest.mark.parametrize("seed", range(4))
def test_the_search_cut_never_changes_an_answer(seed: int) -> None:
    """With and without the cut, the same answer, devices and errors (the cut only skips failing subtrees)."""
    rng = random.Random(seed)
    env = CelEnvironment()
    for _ in range(150):
        slices, c, allocated = _random_case(rng)
        results = []
        for prune in (True, False):
            sim = Simulator(slices, [cls()], "n1", cel=env, prune=prune)
            results.append(simulate(slices, [], [c], node_name="n1", allocated=allocated, mode="count",
                                    simulator=sim))
        assert results[0] == results[1], c
