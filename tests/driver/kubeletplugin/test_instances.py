"""Two instances of the driver side by side on one node (a surge rollout, docs/upgrades.md): how the socket names
are chosen, that neither removes what the other serves, that both answer from one shared state, and that the
kill -9 guarantees hold while both run."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_dra.driver.daemon.claims.checkpoint import Checkpoint, ClaimState
from neuron_dra.driver.daemon.options import parse_options, with_socket_names
from neuron_dra.driver.kubeletplugin import _sockets as sockets
from neuron_dra.driver.kubeletplugin._instances import InstanceError, check_pod_uid, decide, kubelet_minor
from neuron_dra.driver.kubeletplugin._kube import ClientOptions
from neuron_dra.driver.kubeletplugin._ratelimit import Rate
from neuron_dra.driver.kubeletplugin._sockets import SocketPaths
from tests.support import pluginclient
from tests.support.driver import DRIVER, DaemonDirs, DaemonProcess, claim, devices, short_dir, uid, wait_until
from tests.support.fake_apiserver import FakeApiServer, serve
from tests.support.fake_apiserver import answer as fake_answer
from tests.support.fake_apiserver import answer_json as fake_answer_json
from tests.support.pluginclient import ClaimRef

SEED = int(os.environ.get("NEURON_DRA_FUZZ_SEED", "22"))


# --- which names -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "pod_uid", "version", "instance", "reason"), [
    ("auto", "u-1", "v1.36.5", "u-1", "registers several instances"),
    ("auto", "u-1", "v1.33.0-eks-4f4795d", "u-1", "registers several instances"),
    ("auto", "u-1", "v1.32.9", "", "older than 1.33"),
    ("auto", "u-1", None, "", "could not be read"),
    ("auto", "u-1", "banana", "", "is not a version"),
    ("auto", "", "v1.36.5", "", "no pod UID"),
    ("plain", "u-1", "v1.36.5", "", "plain"),
    ("per-instance", "u-1", "v1.30.0", "u-1", "per-instance"),
])
def test_socket_names_follow_the_pod_uid_and_the_kubelets_version(mode: str, pod_uid: str, version: str | None,
                                                                   instance: str, reason: str) -> None:
    asked = []

    def kubelet_version() -> str | None:
        asked.append(1)
        return version

    naming = decide(mode, pod_uid, kubelet_version)
    assert (naming.instance, reason in naming.reason) == (instance, True), naming
    assert bool(asked) == (mode == "auto" and bool(pod_uid))  # the API server is asked only when it decides


def test_bad_socket_name_settings_are_refused_naming_the_value() -> None:
    with pytest.raises(InstanceError, match=r"per-instance needs the pod UID \(env POD_UID"):
        decide("per-instance", "", lambda: None)
    with pytest.raises(InstanceError, match=r"'sideways' are not allowed; allowed: auto, per-instance, plain"):
        decide("sideways", "u", lambda: None)
    with pytest.raises(InstanceError, match=r"POD_UID '\.\./x' is not a pod UID; allowed: up to 64 letters"):
        check_pod_uid("../x")
    with pytest.raises(SystemExit):
        parse_options(["--node-name", "n", "--pod-uid", "a/b"], {})
    assert parse_options(["--node-name", "n"], {"POD_UID": "abc-1"}).pod_uid == "abc-1"
    assert kubelet_minor("v1.37.0-rc.1") == (1, 37) and kubelet_minor("1.9") == (1, 9) and kubelet_minor("v1") is None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeApiServer]:
    yield from serve(tmp_path)


@pytest.mark.parametrize(("answer", "instance"), [
    ({"status": {"nodeInfo": {"kubeletVersion": "v1.36.5"}}}, "u-1"),
    ({"status": {"nodeInfo": {"kubeletVersion": "v1.32.4"}}}, ""),
    ({"status": {}}, ""),
    (None, ""),  # the API server answers 500: the plain names, which every kubelet takes
])
def test_the_daemon_reads_the_kubelets_version_from_its_node(server: FakeApiServer, answer: dict[str, object] | None,
                                                             instance: str) -> None:
    server.script = fake_answer_json(answer) if answer is not None else fake_answer(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}")
    options = parse_options(["--node-name", "node-a", "--pod-uid", "u-1", "--kube-api-timeout", "2"], {})
    chosen = with_socket_names(options, server.client(options=ClientOptions(rate=Rate(1000, 1000))))
    assert chosen.instance == instance
    assert chosen.sockets.registration.name == (f"{DRIVER}-u1-reg.sock" if instance else f"{DRIVER}-reg.sock")
    assert [seen.target for seen in server.seen][:1] == ["/api/v1/nodes/node-a"]


def test_per_instance_names_are_the_go_helpers_with_16_digits_of_the_pod_uid() -> None:
    pod = "0f8fad5b-d9cb-469f-a165-70867728950e"
    paths = SocketPaths.for_driver(Path("/var/lib/kubelet/plugins"), Path("/var/lib/kubelet/plugins_registry"),
                                   DRIVER, pod)
    assert paths.instance == "0f8fad5bd9cb469f"
    assert paths.dra == Path(f"/var/lib/kubelet/plugins/{DRIVER}/dra-0f8fad5bd9cb469f.sock")
    assert paths.registration == Path(f"/var/lib/kubelet/plugins_registry/{DRIVER}-0f8fad5bd9cb469f-reg.sock")
    plain = SocketPaths.for_driver(Path("/p"), Path("/r"), DRIVER)
    assert (plain.dra, plain.registration, plain.instance) == (Path(f"/p/{DRIVER}/dra.sock"),
                                                               Path(f"/r/{DRIVER}-reg.sock"), "")
    # The local cluster's kubelet dials its relocated registry dir: with the whole UID that path was 113 bytes.
    kubelet_view = Path("/tmp/ndra-41aa1f99fa/trn2-48xlarge-1/plugins_registry")
    assert len(str(SocketPaths.for_driver(kubelet_view, kubelet_view, DRIVER, pod).registration)) <= \
        sockets.MAX_UNIX_SOCKET_PATH


def _listen(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def _dead(path: Path, age: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # closed without unlinking: what a kill -9 leaves
    os.utime(path, (time.time() - age, time.time() - age))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory for unix sockets: pytest's tmp_path (longer still under xdist) can pass the 107-byte limit."""
    with short_dir() as d:
        yield d


def test_only_sockets_nobody_listens_on_are_removed(short_tmp: Path) -> None:
    me = SocketPaths.for_driver(short_tmp / "p", short_tmp / "r", DRIVER, str(uuid.UUID(int=1 << 96)))
    live = SocketPaths.for_driver(short_tmp / "p", short_tmp / "r", DRIVER, str(uuid.UUID(int=2 << 96)))
    gone = SocketPaths.for_driver(short_tmp / "p", short_tmp / "r", DRIVER, str(uuid.UUID(int=3 << 96)))
    fresh = SocketPaths.for_driver(short_tmp / "p", short_tmp / "r", DRIVER, str(uuid.UUID(int=4 << 96)))
    listeners = [_listen(live.dra), _listen(live.registration)]
    try:
        for p in (gone.dra, gone.registration):
            _dead(p, 120)
        for p in (fresh.dra, fresh.registration):  # bound a moment ago: perhaps an instance about to listen
            _dead(p, 1)
        other_driver = short_tmp / "r" / f"{DRIVER}-efa-reg.sock"  # another driver's plain name, also dead
        _dead(other_driver, 120)
        plain = SocketPaths.for_driver(short_tmp / "p", short_tmp / "r", DRIVER)
        _dead(plain.registration, 120)  # the plain names are never another instance's leftovers to remove
        assert sorted(sockets.remove_leftovers(me)) == sorted([gone.dra, gone.registration])
        for p in (live.dra, live.registration, fresh.dra, fresh.registration, other_driver, plain.registration):
            assert p.exists(), p
        assert sockets.is_listening(live.dra) and not sockets.is_listening(fresh.dra)
    finally:
        for s in listeners:
            s.close()


def test_an_instance_removes_its_socket_only_while_it_is_still_its_own(tmp_path: Path) -> None:
    path = tmp_path / "dra.sock"
    first = _listen(path)
    identity = sockets.bound_identity(path)
    first.close()
    path.unlink()
    time.sleep(0.05)  # the kernel's file times tick every few milliseconds; instances start seconds apart
    second = _listen(path)  # a newer instance with the plain names replaced it (often the same inode number)
    try:
        assert not sockets.remove_own(path, identity) and path.exists()
        assert sockets.remove_own(path, sockets.bound_identity(path)) and not path.exists()
    finally:
        second.close()


# --- two daemons -----------------------------------------------------------------------------------------------

class Instance:
    """A daemon with names of its own, as the DaemonSet's pod with POD_UID on a 1.33+ kubelet."""

    def __init__(self, dirs: DaemonDirs, host_root: Path, pod_uid: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.pod_uid = pod_uid or str(uuid.uuid4())
        self.paths = SocketPaths.for_driver(dirs.plugins, dirs.registry, DRIVER, self.pod_uid)
        self.process = DaemonProcess(dirs, host_root, extra_args=("--socket-names", "per-instance", *extra_args),
                                     env={"POD_UID": self.pod_uid}).wait_ready()

    def client(self) -> pluginclient.DraClient:
        return pluginclient.DraClient(self.paths.dra)


@pytest.mark.process
def test_two_instances_serve_one_state_and_neither_removes_the_others_sockets(dirs: DaemonDirs,
                                                                              host_root: Path) -> None:
    for i in range(3):
        dirs.put_claim(claim(f"c{i}", uid(i), devices(2 * i, 2 * i + 1)))
    dirs.put_claim(claim("thief", uid(9), devices(0, 1)))  # the devices of c0
    old = Instance(dirs, host_root)
    new = Instance(dirs, host_root)
    try:
        for inst in (old, new):  # both registered at once, each with its own endpoint
            assert pluginclient.register(inst.paths.registration).endpoint == str(inst.paths.dra)
        a, b = old.client(), new.client()
        c0, c1, c2 = (ClaimRef("default", f"c{i}", uid(i)) for i in range(3))
        first = a.prepare([c0, c1], timeout=20)
        assert not first[c0.uid].error and not first[c1.uid].error
        again = b.prepare([c0], timeout=20)  # the other instance knows what the first prepared
        assert [d.device_name for d in again[c0.uid].devices] == [d.device_name for d in first[c0.uid].devices]
        busy = b.prepare([ClaimRef("default", "thief", uid(9))], timeout=20)[uid(9)]
        assert "prepared for another live claim: default/c0" in busy.error
        assert b.unprepare([c1], timeout=20) == {c1.uid: ""}
        assert not b.prepare([c2], timeout=20)[c2.uid].error
        assert set(Checkpoint(dirs.checkpoint).read()) == {c0.uid, c2.uid}
        a.close()
        b.close()
        # The old one stops (SIGTERM): its own sockets go, the new one's stay and it serves on.
        assert old.process.terminate() == 0
        assert not old.paths.dra.exists() and not old.paths.registration.exists()
        assert new.paths.dra.exists() and new.paths.registration.exists()
        b = new.client()
        assert b.unprepare([c0, c2], timeout=20) == {c0.uid: "", c2.uid: ""}
        b.close()
        assert Checkpoint(dirs.checkpoint).read() == {}
        assert new.process.terminate() == 0
    finally:
        old.process.kill()
        new.process.kill()


@pytest.mark.process
def test_with_the_plain_names_the_stopping_instance_leaves_the_newer_ones_sockets(dirs: DaemonDirs,
                                                                                 host_root: Path) -> None:
    # kubelet < 1.33: one endpoint per driver; the new instance takes the names over.
    old = DaemonProcess(dirs, host_root).wait_ready()
    new = DaemonProcess(dirs, host_root).wait_ready()
    try:
        assert old.terminate() == 0
        assert dirs.dra_socket.exists() and dirs.registration_socket.exists()
        assert pluginclient.register(dirs.registration_socket).endpoint == str(dirs.dra_socket)
        assert new.terminate() == 0
        assert not dirs.dra_socket.exists() and not dirs.registration_socket.exists()
    finally:
        old.kill()
        new.kill()


@pytest.mark.process
def test_an_instance_on_the_plain_names_is_waited_for_before_the_claims_are_loaded(dirs: DaemonDirs,
                                                                                  host_root: Path) -> None:
    """The first surge rollout from the previous release: that instance takes no lock and never refreshes, so
    the new one loads the claims only once it is gone; kubelet's calls to the new one wait meanwhile."""
    dirs.put_claim(claim("c1", uid(1), devices(0)))
    old = DaemonProcess(dirs, host_root).wait_ready()  # the plain names, as the previous release
    pod = str(uuid.uuid4())
    new = DaemonProcess(dirs, host_root, extra_args=("--socket-names", "per-instance"), env={"POD_UID": pod})
    paths = SocketPaths.for_driver(dirs.plugins, dirs.registry, DRIVER, pod)
    try:
        wait_until(lambda: any("waiting until it stops" in r.get("msg", "") for r in new.log_records()), 20,
                   "the new instance to wait for the old one")
        assert pluginclient.register(paths.registration).endpoint == str(paths.dra)  # registered meanwhile
        answers: list[dict[str, pluginclient.PrepareResult]] = []
        client = pluginclient.DraClient(paths.dra)
        call = threading.Thread(target=lambda: answers.append(client.prepare([ClaimRef("default", "c1", uid(1))],
                                                                             timeout=30)))
        call.start()
        time.sleep(1.0)
        assert not answers and not any(r.get("msg") == "serving" for r in new.log_records())
        assert old.terminate() == 0
        call.join(30)
        client.close()
        assert answers and not answers[0][uid(1)].error  # answered once the old one was gone
        assert set(Checkpoint(dirs.checkpoint).read()) == {uid(1)}
        assert new.terminate() == 0
    finally:
        old.kill()
        new.kill()


@pytest.mark.process
def test_an_instance_on_the_plain_names_appearing_takes_the_calls_over(dirs: DaemonDirs, host_root: Path) -> None:
    """A rollback to the previous release: its pod starts on the plain names and shares nothing, so this
    instance unregisters (kubelet then calls only that one) and keeps its DRA socket for calls already sent."""
    new = Instance(dirs, host_root)
    old = None
    try:
        old = DaemonProcess(dirs, host_root).wait_ready()  # the plain names, as the previous release
        wait_until(lambda: not new.paths.registration.exists(), 10, "this instance to unregister")
        assert new.paths.dra.exists() and dirs.registration_socket.exists()
        assert any("unregistering so that kubelet calls only that one" in r.get("msg", "")
                   for r in new.process.log_records())
        assert new.process.terminate() == 0
        assert pluginclient.register(dirs.registration_socket).endpoint == str(dirs.dra_socket)
    finally:
        new.process.kill()
        if old is not None:
            old.kill()


@pytest.mark.slow
@pytest.mark.process
def test_kill_9_loop_with_two_instances(dirs: DaemonDirs, host_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Random prepares and unprepares sent to either of two live instances; one of them killed (kill -9) at a
    random moment and replaced by a new pod. Every answer for a prepared claim stays the same, no device is
    prepared for two claims, and after each kill the state on disk is whole. It starts from an empty node (no
    checkpoint yet), where round 3 of attacks found double grants before the first kill."""
    rng = random.Random(SEED)
    refs = [ClaimRef("default", f"k{i}", uid(400 + i)) for i in range(8)]
    for i, r in enumerate(refs):  # pairs of claims share devices: a conflict either instance must see
        dirs.put_claim(claim(r.name, r.uid, devices(2 * (i // 2), 2 * (i // 2) + 1)))
    assert not dirs.checkpoint.exists() and not dirs.checkpoint.parent.exists()
    instances = [Instance(dirs, host_root), Instance(dirs, host_root)]
    answers: dict[str, tuple[str, ...]] = {}
    uncertain: set[str] = set()  # claims whose last call a kill cut short: either outcome is right
    killed: list[SocketPaths] = []
    operations = kills = mid_call = 0
    try:
        for _ in range(8):
            window = rng.uniform(0.6, 1.5)
            deadline = time.monotonic() + window
            clients = [inst.client() for inst in instances]
            victim = rng.randrange(2)
            # kill -9 while calls run: those sent to the victim fail, the survivor's go on
            timer = threading.Timer(rng.uniform(0.1, window - 0.2), instances[victim].process.proc.kill)
            timer.start()
            try:
                while time.monotonic() < deadline:
                    client = rng.choice(clients)
                    batch = rng.sample(refs, rng.randrange(1, 3))
                    try:
                        if rng.random() < 0.6:
                            for u, res in client.prepare(batch, timeout=10).items():
                                if not res.error:
                                    got = tuple(x.device_name for x in res.devices)
                                    assert answers.setdefault(u, got) == got
                                    uncertain.discard(u)
                                    # A claim on these devices whose unprepare a kill cut short was unprepared
                                    # after all (else this prepare is refused): forget its old answer.
                                    for v in [v for v in uncertain if v in answers and set(answers[v]) & set(got)]:
                                        del answers[v]
                                        uncertain.discard(v)
                                elif u not in answers:
                                    uncertain.discard(u)  # refused (busy): nothing recorded
                        else:
                            client.unprepare(batch, timeout=10)
                            for r in batch:
                                answers.pop(r.uid, None)
                                uncertain.discard(r.uid)
                        operations += 1
                    except pluginclient.PluginCallError:
                        mid_call += 1
                        uncertain.update(r.uid for r in batch)
                    holders: dict[str, str] = {}
                    for u in answers.keys() - uncertain:  # two claims answered with one device at once: never
                        for dev in answers[u]:
                            assert holders.setdefault(dev, u) == u, (dev, holders[dev], u)
            finally:
                timer.cancel()
                instances[victim].process.proc.send_signal(signal.SIGKILL)
                for c in clients:
                    c.close()
                instances[victim].process.kill()
                killed.append(instances[victim].paths)
                kills += 1
            _check_whole(dirs)
            instances[victim] = Instance(dirs, host_root)  # the DaemonSet's new pod: a new UID
        # What either instance answered is what is recorded: prepared claims prepared, unprepared ones gone.
        recorded = Checkpoint(dirs.checkpoint).read()
        completed = {u for u, c in recorded.items() if c.state is ClaimState.PREPARE_COMPLETED}
        assert completed - uncertain == set(answers) - uncertain
        for inst in instances:
            assert inst.process.terminate() == 0
        # Left: only sockets of killed pods (a later instance removes them once nobody listened for 30 s).
        left = {*dirs.plugins.joinpath(DRIVER).glob("dra-*.sock"), *dirs.registry.glob("*.sock")}
        assert left <= {p for k in killed for p in (k.dra, k.registration)}, left
    finally:
        for inst in instances:
            inst.process.kill()
    capsys.readouterr()
    with capsys.disabled():
        print(f"\nkill -9 loop, two instances: seed {SEED}, {kills} kills, {operations} calls "
              f"({mid_call} cut by a kill), {len(answers)} claims prepared at the end")
    assert operations >= kills


def _check_whole(dirs: DaemonDirs) -> None:
    """After a kill, with the other instance idle: what is recorded loads, and every completed claim's spec is
    there (the survivor keeps serving from the same files)."""
    claims, _ = Checkpoint(dirs.checkpoint)._read()
    specs = {p.name for p in dirs.cdi.iterdir()} if dirs.cdi.exists() else set()
    for u, entry in claims.items():
        if entry.state is ClaimState.PREPARE_COMPLETED:
            assert f"{DRIVER}_{u}.json" in specs, f"spec of completed claim {u} missing"
