"""The kubelet-plugin helper on its own (`kubeletplugin.start`), driven by a toy driver of a few dozen lines and
grpcio's client over real unix sockets: registration, prepare and unprepare (the claim GET and its checks done by
the helper, the driver handed claim objects), the lock held around calls, the rolling update's two instances.
Nothing Neuron: the layer is generic."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from neuron_dra.driver import kubeletplugin
from neuron_dra.driver.kubeletplugin import CallScope, Claim, ClaimFailed, ClaimRef
from neuron_dra.driver.kubeletplugin._calls import Calls
from neuron_dra.driver.kubeletplugin._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.support.driver import FakeLookup, short_dir, wait_until

TOY = "toy.example.com"


@dataclass(frozen=True)
class ToyDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass
class ToyDriver:
    """Hands out the device its claim's allocation names; a claim named `bad` fails, a UID `u-*` only is taken.
    Notes whether the helper held its lock around each call."""

    lock: kubeletplugin.CallLock | None = None
    prepared: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    locked: list[bool] = field(default_factory=list)

    def check(self, ref: ClaimRef, *, named: bool) -> None:
        if not ref.uid.startswith("u-"):
            raise ClaimFailed(f"claim uid {ref.uid!r}: the toy takes u-* only", "invalid_request")

    def has_prepared(self, uid: str) -> bool:
        return False  # the toy records no answers: every claim is looked up

    def prepare(self, claims: Sequence[Claim | ClaimRef], call: CallScope
                ) -> Mapping[str, Sequence[ToyDevice] | ClaimFailed | None]:
        self._note_lock()
        self.calls.append(("prepare", tuple(c.uid for c in claims)))
        out: dict[str, Sequence[ToyDevice] | ClaimFailed | None] = {}
        for c in claims:
            assert isinstance(c, Claim)  # `has_prepared` names none
            if c.ref.name == "bad":
                out[c.uid] = ClaimFailed(f"claim {c.ref}: the toy refuses it")
                continue
            device = c.allocation["devices"]["results"][0]["device"]
            self.prepared[c.uid] = device
            out[c.uid] = [ToyDevice(("req",), "pool", device, (f"{TOY}/toy={c.uid}",))]
        return out

    def unprepare(self, refs: Sequence[ClaimRef], call: CallScope) -> Mapping[str, ClaimFailed | None]:
        self._note_lock()
        self.calls.append(("unprepare", tuple(r.uid for r in refs)))
        for r in refs:
            self.prepared.pop(r.uid, None)  # unknown claims succeed, as kubelet expects
        return {r.uid: None for r in refs}

    def failed(self, method: str, ref: ClaimRef, failure: ClaimFailed) -> None:
        self.failures.append((method, ref.uid, failure.reason))

    def _note_lock(self) -> None:
        if self.lock is not None:  # held by the helper: a second holder would wait (non-blocking try fails)
            free = self.lock._thread.acquire(blocking=False)
            if free:
                self.lock._thread.release()
            self.locked.append(not free)


def toy_claim(name: str, uid: str, device: str | None = "dev-x") -> dict[str, Any]:
    status = {} if device is None else {"allocation": {"devices": {"results": [
        {"request": "req", "driver": TOY, "pool": "pool", "device": device}]}}}
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": status}


LOOKUP = FakeLookup(toy_claim("a", "u-a", "dev-a"), toy_claim("bad", "u-bad"))


def options(base: Path, instance: str = "") -> kubeletplugin.Options:
    return kubeletplugin.Options(TOY, base / "plugins", base / "registry", instance)


def toy_helper(base: Path, instance: str = "") -> kubeletplugin.Helper:
    return kubeletplugin.start(ToyDriver(), options(base, instance), lookup=LOOKUP)


@pytest.fixture
def base() -> Iterator[Path]:
    with short_dir() as d:
        yield d


def test_registration_and_prepare_with_a_toy_driver(base: Path) -> None:
    driver = ToyDriver()
    helper = kubeletplugin.start(driver, options(base), lookup=LOOKUP)
    try:
        with grpc.insecure_channel(f"unix:{helper.paths.registration}") as ch:
            reg = pluginregistration_pb2_grpc.RegistrationStub(ch)
            info = reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", TOY, str(helper.paths.dra))
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            assert not helper.registered.is_set()
            reg.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
            assert helper.registered.is_set()
        with grpc.insecure_channel(f"unix:{helper.paths.dra}") as ch:
            dra = dra_v1_pb2_grpc.DRAPluginStub(ch)
            claims = [dra_v1_pb2.Claim(namespace="ns", name="a", uid="u-a"),
                      dra_v1_pb2.Claim(namespace="ns", name="bad", uid="u-bad")]
            got = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
            assert [(d.device_name, list(d.cdi_device_ids)) for d in got.claims["u-a"].devices] == [
                ("dev-a", [f"{TOY}/toy=u-a"])]
            assert "the toy refuses it" in got.claims["u-bad"].error
            assert driver.prepared == {"u-a": "dev-a"}
            done = dra.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=5)
            assert done.claims["u-a"].error == "" and driver.prepared == {}
            # An empty call (a liveness check's) is answered in the event loop, neither behind the DRA calls nor
            # their lock: the driver is not called.
            empty = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=5)
            assert not empty.claims and driver.calls == [("prepare", ("u-a", "u-bad")), ("unprepare", ("u-a",))]
    finally:
        helper.close()
    assert not helper.paths.registration.exists() and not helper.paths.dra.exists()


def test_the_helper_gets_and_checks_claims_and_holds_the_lock_around_calls(base: Path) -> None:
    """The claim GET with its checks is the helper's: a claim that is gone, replaced (another UID), not allocated,
    refused by the driver's `check` or not readable (API error) gets its error without reaching the driver's
    prepare, and the driver hears of it (`failed`); the others reach it as Claim objects, under the lock."""
    lookup = FakeLookup(toy_claim("a", "u-a", "dev-a"), toy_claim("new", "u-other"), toy_claim("idle", "u-idle", None))
    helper = kubeletplugin.start(None, options(base))
    driver = ToyDriver(lock=helper.lock)
    helper.serve(driver, lookup)
    try:
        with grpc.insecure_channel(f"unix:{helper.paths.dra}") as ch:
            dra = dra_v1_pb2_grpc.DRAPluginStub(ch)
            claims = [dra_v1_pb2.Claim(namespace="ns", name=n, uid=u) for n, u in (
                ("a", "u-a"), ("gone", "u-gone"), ("new", "u-new"), ("idle", "u-idle"), ("a", "x-refused"))]
            got = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=10)
            assert [d.device_name for d in got.claims["u-a"].devices] == ["dev-a"]
            assert "does not exist" in got.claims["u-gone"].error
            assert "has uid 'u-other', kubelet asked for 'u-new'" in got.claims["u-new"].error
            assert "is not allocated" in got.claims["u-idle"].error
            assert "the toy takes u-* only" in got.claims["x-refused"].error
            assert driver.calls == [("prepare", ("u-a",))] and driver.locked == [True]
            assert sorted(driver.failures) == [
                ("prepare", "u-gone", "not_found"), ("prepare", "u-idle", "not_allocated"),
                ("prepare", "u-new", "uid_mismatch"), ("prepare", "x-refused", "invalid_request")]
            lookup.fail = True  # the API server is down: a retryable error per claim; unprepare needs no API
            got = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims[:1]), timeout=10)
            assert "reading it from the API server failed" in got.claims["u-a"].error
            done = dra.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=10)
            assert done.claims["u-a"].error == "" and driver.prepared == {} and driver.locked == [True, True]
    finally:
        helper.close()


def test_calls_wait_for_serve_when_started_without_a_driver(base: Path) -> None:
    """Registration answers before the driver's state is loaded; a DRA call sent meanwhile waits for `serve`."""
    helper = kubeletplugin.start(None, options(base))
    driver = ToyDriver()
    try:
        with grpc.insecure_channel(f"unix:{helper.paths.registration}") as ch:
            info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(pluginregistration_pb2.InfoRequest(),
                                                                             timeout=5)
            assert info.name == TOY
        answers: list[object] = []

        def call() -> None:
            with grpc.insecure_channel(f"unix:{helper.paths.dra}") as ch:
                req = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace="ns", name="a",
                                                                                      uid="u-a")])
                answers.append(dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=30))

        caller = threading.Thread(target=call)
        caller.start()
        assert driver.calls == []
        helper.serve(driver, LOOKUP)
        caller.join(30)
        assert len(answers) == 1 and driver.calls == [("prepare", ("u-a",))]
    finally:
        helper.close()


def test_rolling_update_the_new_instance_waits_for_the_plain_one_then_takes_the_lock(base: Path) -> None:
    old = toy_helper(base)  # the previous release: plain names, no lock
    new = kubeletplugin.start(None, options(base, instance="0f8fad5b-d9cb-469f-a165-70867728950e"))
    stop = threading.Event()
    try:
        assert new.paths.registration != old.paths.registration and new.paths.registration.exists()
        locked: list[kubeletplugin.CallLock] = []
        waiter = threading.Thread(target=lambda: locked.append(new.lock_instances(stop)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not locked  # the plain instance still listens
        old.close()
        waiter.join(30)
        assert locked and locked[0] is new.lock and locked[0].instances is not None
        assert locked[0].instances.path == base / "plugins" / TOY / "serialize.lock"
    finally:
        stop.set()
        old.close()
        new.close()


def test_rolling_update_a_plain_instance_appearing_makes_this_one_unregister(base: Path) -> None:
    new = toy_helper(base, instance="0f8fad5b-d9cb-469f-a165-70867728950e")
    stop = threading.Event()
    appeared = threading.Event()
    old = None
    try:
        watch = new.watch_for_unshared_instance(stop, appeared.set, poll=0.05)
        assert watch is not None
        old = toy_helper(base)  # a rollback: the previous release starts
        assert appeared.wait(30)
        wait_until(lambda: not new.paths.registration.exists(), 30, "the new instance to unregister")
        assert new.paths.dra.exists()  # calls already sent to it are still answered
        watch.join(30)
    finally:
        stop.set()
        new.close()
        if old is not None:
            old.close()


def test_plain_names_neither_wait_nor_watch(base: Path) -> None:
    helper = toy_helper(base)
    try:
        assert helper.watch_for_unshared_instance(threading.Event()) is None
        instances = helper.lock_instances(threading.Event()).instances
        assert instances is not None and instances.path.parent == base / "plugins" / TOY
    finally:
        helper.close()


def toy_slice(node: str, *devices: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"generateName": f"{node}-toy-"},
            "spec": {"driver": TOY, "nodeName": node, "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                     "devices": [{"name": d} for d in devices]}}


@pytest.mark.cluster
def test_publish_hands_slices_over_as_data(base: Path, api: Any) -> None:
    """`publish(resources)` against the real API server: published, then replaced by the next call's slices, then
    slices from a function of the publisher's feedback; `withdraw` deletes them once publishing stopped."""
    node = "toy-node"
    helper = toy_helper(base)
    stop = threading.Event()

    def published() -> list[list[str]]:
        listed = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={TOY}")
        return [sorted(d.name for d in s.spec.devices or ()) for s in listed.items]

    try:
        publisher = helper.publish([toy_slice(node, "a", "b")], api, node, stop)
        assert publisher.published.wait(60)
        wait_until(lambda: published() == [["a", "b"]], 30, "the toy's slice")
        helper.publish([toy_slice(node, "c")], api, node, stop)
        wait_until(lambda: published() == [["c"]], 30, "the toy's new slice")
        seen: list[bool] = []

        def from_feedback(feedback: kubeletplugin.PublishFeedback) -> list[dict[str, Any]]:
            seen.append(feedback.taints_supported)  # no taints sent yet: still assumed kept
            return [toy_slice(node, "d", "e")]

        helper.publish(from_feedback, api, node, stop)
        wait_until(lambda: published() == [["d", "e"]], 30, "the slice built from the feedback")
        assert seen and all(seen)
        stop.set()
        assert helper.withdraw() == 1
        assert published() == []
    finally:
        stop.set()
        helper.close()


@dataclass
class RecordingDriver(ToyDriver):
    """Says it has prepared `u-a` (a look without the lock), then finds it no longer prepared under the lock."""

    handed: list[tuple[str, ...]] = field(default_factory=list)

    def has_prepared(self, uid: str) -> bool:
        return uid == "u-a"

    def prepare(self, claims: Sequence[Claim | ClaimRef], call: CallScope
                ) -> Mapping[str, Sequence[ToyDevice] | ClaimFailed | None]:
        self.handed.append(tuple(type(c).__name__ for c in claims))
        refs = [c for c in claims if isinstance(c, ClaimRef)]
        answers = dict(super().prepare([c for c in claims if isinstance(c, Claim)], call))
        return {**answers, **dict.fromkeys((r.uid for r in refs), None)}  # None: the claim is needed after all


def test_a_claim_the_driver_has_prepared_skips_its_get_until_the_driver_needs_it() -> None:
    """`has_prepared` hands the claim over as its ref without a GET (a repeat answered from the driver's records
    while the API server is down); when the driver answers None under the lock (unprepared meanwhile), the helper
    GETs the claim and calls again, so the claim is looked up and prepared like any other."""
    lookup = FakeLookup(toy_claim("a", "u-a", "dev-a"), toy_claim("b", "u-b", "dev-b"))
    driver = RecordingDriver()
    calls = Calls(driver, lookup, kubeletplugin.CallLock())
    answers = calls.prepare([ClaimRef("ns", "a", "u-a"), ClaimRef("ns", "b", "u-b")])
    assert driver.handed == [("ClaimRef", "Claim"), ("Claim",)]
    assert lookup.calls == [("ns", "b"), ("ns", "a")]  # a's GET only once the driver needed it
    assert {uid: [d.device_name for d in a] for uid, a in answers.items()
            if not isinstance(a, ClaimFailed) and a is not None} == {"u-a": ["dev-a"], "u-b": ["dev-b"]}


class AbandoningLookup(FakeLookup):
    """Kubelet gives up on the call while its claim is being looked up (the GET answers after the deadline)."""

    def __init__(self, call: CallScope, *claims: Any) -> None:
        super().__init__(*claims)
        self.call = call

    def get(self, namespace: str, name: str) -> Any:
        self.call.abandon()
        return super().get(namespace, name)


@pytest.mark.parametrize("count", [1, 2])
def test_a_call_kubelet_gave_up_on_during_its_gets_prepares_nothing_and_takes_no_lock(count: int) -> None:
    """The claims looked up are not handed to the driver (nobody waits for the answer; under the lock it would
    hold up the calls that are waited for, issue 14 item 7): each is failed as abandoned, kubelet retries."""
    call = CallScope()
    lookup = AbandoningLookup(call, toy_claim("a", "u-a", "dev-a"), toy_claim("b", "u-b", "dev-b"))
    lock = kubeletplugin.CallLock()
    driver = ToyDriver(lock=lock)
    refs = [ClaimRef("ns", "a", "u-a"), ClaimRef("ns", "b", "u-b")][:count]
    answers = Calls(driver, lookup, lock).prepare(refs, call)
    assert len(lookup.calls) >= 1 and driver.calls == [] and driver.prepared == {}
    assert {uid: a.reason for uid, a in answers.items() if isinstance(a, ClaimFailed)} == dict.fromkeys(
        (r.uid for r in refs), "abandoned")
    with lock.hold(0.0):  # free: nothing kept it
        pass


@dataclass
class AfterAnswerDriver(ToyDriver):
    """Puts its bookkeeping after the answer; the bookkeeping waits until the test has the answer in hand."""

    answered: threading.Event = field(default_factory=threading.Event)
    noted: list[tuple[str, bool]] = field(default_factory=list)

    def prepare(self, claims: Sequence[Claim | ClaimRef], call: CallScope
                ) -> Mapping[str, Sequence[ToyDevice] | ClaimFailed | None]:
        out = super().prepare(claims, call)
        call.after_answer(lambda: 1 / 0)  # a failing one is logged and does not skip the next
        call.after_answer(lambda: self.noted.append(("prepare", self.answered.wait(10))))
        return out


def test_work_after_the_answer_runs_once_kubelet_has_it(base: Path) -> None:
    """CallScope.after_answer over the real socket: the answer is not held for it, it runs when the call is over
    (the prepare's own log line and duration metric go there); on a scope no call ends (a direct caller's), at
    once."""
    driver = AfterAnswerDriver()
    helper = kubeletplugin.start(driver, options(base), lookup=LOOKUP)
    try:
        with grpc.insecure_channel(f"unix:{helper.paths.dra}") as ch:
            dra = dra_v1_pb2_grpc.DRAPluginStub(ch)
            got = dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ns", name="a", uid="u-a")]), timeout=5)
            assert got.claims["u-a"].devices[0].device_name == "dev-a"
            assert driver.noted == []  # answered while the work waits for this test
            driver.answered.set()
            wait_until(lambda: driver.noted == [("prepare", True)], what="the work after the answer")
    finally:
        helper.close()
    direct, ran = CallScope(), []
    direct.after_answer(lambda: ran.append(1))
    assert ran == [1]
    ended = CallScope(ends=True)
    ended.after_answer(lambda: ran.append(2))
    assert ran == [1]
    ended.abandon()
    ended.after_answer(lambda: ran.append(3))  # over already: at once
    assert ran == [1, 2, 3]
