"""Issue 14 "keep it fixed": bounded, seeded fuzzing of every gRPC method the daemon serves and of the config
decoders, and a bounded kill -9 loop. Each prints its counts (seed, calls, status codes) into the test output.

- gRPC: random bytes, truncated / bit-flipped / extended encodings of valid requests and oversized messages on
  every method of DRA v1 and v1beta1, registration and health. Every call must end promptly with a status the
  daemon means (OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND, UNIMPLEMENTED): no UNKNOWN (an exception in a
  handler), no INTERNAL, no hang; the daemon still answers its liveness check afterwards, its log has no traceback.
- Config decoders: the opaque config decoder (driver/model/config.py) and the stack settings decoder get random JSON
  structures; they return a value or raise their NotAllowed error with a bounded message, nothing else.
- kill -9: random prepares and unprepares, the daemon killed at a random moment, restarted; after every restart
  the checkpoint loads, every completed claim's CDI spec is on disk as recorded, no temp files are left, and a
  repeated prepare of a prepared claim answers the same devices.
"""

from __future__ import annotations

import json
import random
import signal
import string
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, ClaimState
from neuron_dra.driver.daemon.liveness import HEALTH
from neuron_dra.driver.kubeletplugin._generated import dra_v1_pb2, grpc_health_v1_pb2, grpc_health_v1_pb2_grpc
from neuron_dra.driver.kubeletplugin._plugin import DRA_V1, DRA_V1BETA1, REGISTRATION
from neuron_dra.driver.model import config as opaque_config
from neuron_dra.driver.model.errors import NotAllowed
from tests.support import pluginclient
from tests.support.driver import DRIVER, DaemonDirs, DaemonProcess, claim, devices, free_port, uid
from tests.support.pluginclient import ClaimRef

SEED = 20261130
MEANT = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "UNIMPLEMENTED"}


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n[fuzz] {line}")


def _text(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return uid(rng.randrange(10))
    if pick < 0.5:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(40)))
    if pick < 0.6:
        return "x" * rng.randrange(1, 5000)
    return "".join(rng.choice(string.ascii_lowercase + "-") for _ in range(rng.randrange(1, 20)))


def _valid(path: str, rng: random.Random) -> bytes:
    """A well-formed request for the method at `path`, with random contents."""
    if path.endswith("PrepareResources"):
        claims = [dra_v1_pb2.Claim(namespace=_text(rng), name=_text(rng), uid=_text(rng))
                  for _ in range(rng.randrange(4))]
        return bytes(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims).SerializeToString())
    if "Health" in path:
        return bytes(grpc_health_v1_pb2.HealthCheckRequest(service=_text(rng)).SerializeToString())
    return b""


def payload(path: str, rng: random.Random) -> bytes:
    base = _valid(path, rng)
    kind = rng.randrange(6)
    if kind == 0 or not base:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 1:
        return base[:rng.randrange(len(base))]
    if kind == 2:
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 3:
        return base + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    if kind == 4:
        return b"\x0a" + bytes([0xff] * rng.randrange(1, 10)) + base  # a huge length prefix
    return base


@pytest.mark.slow
@pytest.mark.attacks
@pytest.mark.process
def test_fuzz_every_grpc_method(dirs: DaemonDirs, host_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    dirs.put_claim(claim("c1", uid(1), devices(0)))
    d = DaemonProcess(dirs, host_root, extra_args=["--healthcheck-port", str(port), "--bind-address",
                                                   "127.0.0.1"]).wait_ready()
    rng = random.Random(SEED)
    targets = [(f"unix://{dirs.dra_socket}", (DRA_V1, DRA_V1BETA1)), (f"unix://{dirs.registration_socket}",
               (REGISTRATION,)), (f"127.0.0.1:{port}", (HEALTH,))]
    per_method: dict[str, Counter[str]] = {}
    slowest = 0.0
    try:
        for target, services in targets:
            with grpc.insecure_channel(target) as channel:
                for service in services:
                    for method in service.methods:
                        path = f"/{service.full_name}/{method.name}"
                        counts = per_method.setdefault(path, Counter())
                        for _ in range(150):
                            data = payload(path, rng)
                            start = time.monotonic()
                            try:
                                if method.server_streaming:
                                    stream = channel.unary_stream(path, request_serializer=None,
                                                                  response_deserializer=None)
                                    call = stream(data, timeout=10)
                                    next(iter(call), None)
                                    call.cancel()
                                else:
                                    channel.unary_unary(path, request_serializer=None,
                                                        response_deserializer=None)(data, timeout=10)
                                counts["OK"] += 1
                            except grpc.RpcError as e:
                                counts[e.code().name] += 1
                            slowest = max(slowest, time.monotonic() - start)
        total = sum(sum(c.values()) for c in per_method.values())
        report(capsys, f"gRPC: seed {SEED}, {total} calls over {len(per_method)} methods, slowest "
                       f"{slowest:.2f} s: " + "; ".join(f"{p.rsplit('/', 1)[1]} {dict(c)}"
                                                       for p, c in per_method.items()))
        # The health port's front ends every connection 5 s after it opened (docs/grpc-server.md): a call in
        # flight on this long-lived channel at that moment fails UNAVAILABLE, and the channel reconnects.
        recycled = {p: c.pop("UNAVAILABLE", 0) for p, c in per_method.items() if p.startswith(f"/{HEALTH.full_name}/")}
        assert all(n <= 5 for n in recycled.values()), recycled
        unexpected = {p: {k: v for k, v in c.items() if k not in MEANT} for p, c in per_method.items()}
        assert not any(unexpected.values()), unexpected
        assert slowest < 10
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = grpc_health_v1_pb2_grpc.HealthStub(channel).Check(
                grpc_health_v1_pb2.HealthCheckRequest(service="liveness"), timeout=10).status
        assert status == grpc_health_v1_pb2.HealthCheckResponse.SERVING
        assert d.proc.poll() is None
        log = d.log()
        for bad in ("Traceback", "Exception calling application"):
            assert bad not in log, log[max(0, log.find(bad) - 1500):log.find(bad) + 1500]
    finally:
        d.terminate()


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 6 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, 2, 4, -1, 2**63, 1.5, float("nan"), 10**100])
    if pick in (3, 4, 5):
        return _text(rng)
    if pick in (6, 7):
        return {_text(rng): _json_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _config_params(rng: random.Random) -> Any:
    params: Any = {"apiVersion": rng.choice([opaque_config.API_VERSION, _text(rng), None, 1]),
                   "kind": rng.choice([*opaque_config.KINDS, _text(rng), None])}
    for name in ("logicalNeuronCore", "ultraserverMode", _text(rng)):
        if rng.random() < 0.5:
            params[name] = _json_value(rng)
    if rng.random() < 0.1:
        return _json_value(rng)
    if rng.random() < 0.05:
        deep: Any = params
        for _ in range(3000):
            deep = [deep]
        return deep
    return params


@pytest.mark.attacks
def test_fuzz_config_decoders(capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_dra.components.settings_schema import SETTINGS_BY_KEY, decode_settings

    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        try:
            opaque_config.decode(_config_params(rng))
            outcomes["config ok"] += 1
        except NotAllowed as e:
            assert len(str(e)) < 2000, str(e)[:300]
            outcomes["config refused"] += 1
    keys = sorted(SETTINGS_BY_KEY)
    for _ in range(1500):
        raw: dict[str, object] = {}
        for key in rng.sample(keys, rng.randrange(1, 4)):
            value = _json_value(rng)
            raw[f"neuron-dra:{key}"] = value if rng.random() < 0.5 or isinstance(value, str) else json.dumps(value)
        if rng.random() < 0.1:
            raw[f"neuron-dra:{_text(rng)}"] = _text(rng)
        try:
            decode_settings(raw)
            outcomes["settings ok"] += 1
        except NotAllowed as e:
            assert len(str(e)) < 3000, str(e)[:300]
            outcomes["settings refused"] += 1
    report(capsys, f"config decoders: seed {SEED}, {sum(outcomes.values())} inputs: {dict(outcomes)}")
    assert outcomes["config ok"] and outcomes["config refused"] and outcomes["settings refused"]


@pytest.mark.slow
@pytest.mark.process
def test_kill_9_loop(dirs: DaemonDirs, host_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(SEED)
    refs = [ClaimRef("default", f"k{i}", uid(300 + i)) for i in range(6)]
    for i, r in enumerate(refs):
        dirs.put_claim(claim(r.name, r.uid, devices(2 * i, 2 * i + 1)))
    cycles, operations, kills_mid_call = 12, 0, 0
    answers: dict[str, tuple[str, ...]] = {}
    for _ in range(cycles):
        d = DaemonProcess(dirs, host_root).wait_ready()
        _check_invariants(dirs)
        client = pluginclient.DraClient(dirs.dra_socket)
        deadline = time.monotonic() + rng.uniform(0.2, 1.5)
        try:
            while time.monotonic() < deadline:
                batch = rng.sample(refs, rng.randrange(1, 4))
                try:
                    if rng.random() < 0.6:
                        for u, res in client.prepare(batch, timeout=10).items():
                            if not res.error:
                                got = tuple(x.device_name for x in res.devices)
                                # A prepared claim always answers the same devices (until unprepared).
                                assert answers.setdefault(u, got) == got
                    else:
                        client.unprepare(batch, timeout=10)
                        for r in batch:
                            answers.pop(r.uid, None)
                    operations += 1
                except pluginclient.PluginCallError:
                    kills_mid_call += 1
        finally:
            client.close()
            d.proc.send_signal(signal.SIGKILL)
            d.kill()
    d = DaemonProcess(dirs, host_root).wait_ready()
    try:
        _check_invariants(dirs)
        assert d.terminate() == 0
    finally:
        d.kill()
    report(capsys, f"kill -9 loop: seed {SEED}, {cycles} kills, {operations} prepare/unprepare calls, "
                   f"{len(answers)} claims prepared at the end")
    assert operations >= cycles


def _check_invariants(dirs: DaemonDirs) -> None:
    """Right after a restart (no call running): the snapshot plus its journal, read without changing either
    (Checkpoint._read; load() would take the journal over from the running daemon)."""
    claims, _ = Checkpoint(dirs.checkpoint)._read()
    specs = {p.name for p in dirs.cdi.iterdir()} if dirs.cdi.exists() else set()
    for u, entry in claims.items():
        if entry.state is ClaimState.PREPARE_COMPLETED:
            name = f"{DRIVER}_{u}.json"
            assert name in specs, f"spec of completed claim {u} missing after restart"
            assert (dirs.cdi / name).read_text() == entry.cdi_spec
    leftovers = [n for n in specs if ".tmp-" in n]
    assert not leftovers, leftovers
