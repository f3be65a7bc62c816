"""Issue 14 items 4 and 9 (daemon side): bad files at start-up end in a log line or a clear start-up error, never a
traceback: a CDI spec with invalid UTF-8 (or a directory in its place), deeply nested or bad-uid checkpoints.
Issue 42 item 2: no answer of the API server at start-up (garbage, deep, huge, dripping) ends the daemon, and the
sockets open in time while every answer drips."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.daemon.claims.checkpoint import (
    JOURNAL_SUFFIX,
    Checkpoint,
    ClaimState,
    PreparedClaim,
    _canonical,
    _checksum,
    _line,
    encode,
)
from neuron_dra.driver.kubeletplugin.toolkit import is_listening
from tests.support import pluginclient
from tests.support.driver import (
    DRIVER,
    NODE,
    REPO,
    DaemonDirs,
    DaemonProcess,
    claim,
    devices,
    free_port,
    uid,
    wait_until,
)
from tests.support.fake_apiserver import FakeApiServer, Reply, Script, Seen, answer, ok, ok_json, serve
from tests.support.pluginclient import ClaimRef

pytestmark = [pytest.mark.attacks, pytest.mark.process]


def prepared_once(dirs: DaemonDirs, host_root: Path, *refs: ClaimRef) -> None:
    for i, r in enumerate(refs):
        dirs.put_claim(claim(r.name, r.uid, devices(i)))
    d = DaemonProcess(dirs, host_root).wait_ready()
    client = pluginclient.DraClient(dirs.dra_socket)
    try:
        assert all(not x.error for x in client.prepare(refs, timeout=20).values())
    finally:
        client.close()
        assert d.terminate() == 0


def test_cdi_spec_with_invalid_utf8_is_quarantined_and_rewritten(dirs: DaemonDirs, host_root: Path) -> None:
    c1, c2 = ClaimRef("default", "c1", uid(1)), ClaimRef("default", "c2", uid(2))
    prepared_once(dirs, host_root, c1, c2)
    spec1, spec2 = dirs.cdi / f"{DRIVER}_{uid(1)}.json", dirs.cdi / f"{DRIVER}_{uid(2)}.json"
    good = spec1.read_text()
    spec1.write_bytes(b'{"cdiVersion": "\xff\xfe"}')  # invalid UTF-8
    spec2.unlink()
    spec2.mkdir()  # not even a file
    orphan = dirs.cdi / f"{DRIVER}_{uid(3)}.json"
    orphan.write_bytes(b"\xff\xff")  # no checkpoint entry, unreadable: removed
    d = DaemonProcess(dirs, host_root).wait_ready()
    try:
        assert spec1.read_text() == good
        assert spec2.is_file() and json.loads(spec2.read_text())["kind"]
        assert not orphan.exists()
        quarantined = sorted(p.name for p in dirs.cdi.iterdir() if ".unreadable-" in p.name)
        assert len(quarantined) == 2 and all(q.startswith(".") for q in quarantined), quarantined
        warnings = [r for r in d.log_records() if r["msg"].startswith("unreadable CDI spec")]
        assert {r["claim"] for r in warnings} == {uid(1), uid(2)}
        assert "UnicodeDecodeError" in next(r["error"] for r in warnings if r["claim"] == uid(1))
        assert "Traceback" not in d.log()
    finally:
        assert d.terminate() == 0


def write_checkpoint(dirs: DaemonDirs, claims: object) -> None:
    dirs.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    doc = {"checksum": _checksum(_canonical(claims)), "preparedClaims": claims, "version": 1}
    dirs.checkpoint.write_text(json.dumps(doc))


@pytest.mark.parametrize(("case", "expected"), [
    ("deeply nested", "nested deeper"),
    ("bad uid, valid checksum", "is not allowed"),
    ("huge uid, valid checksum", "characters)"),
    ("entry not an object", "malformed entry"),
])
def test_bad_checkpoints_stop_start_up_with_a_reason_not_a_traceback(dirs: DaemonDirs, host_root: Path, case: str,
                                                                      expected: str) -> None:
    if case == "deeply nested":
        dirs.checkpoint.parent.mkdir(parents=True)
        dirs.checkpoint.write_text('{"version": 1, "preparedClaims": ' + "[" * 100000 + "]" * 100000 + "}")
    elif case == "bad uid, valid checksum":
        write_checkpoint(dirs, {"../../etc/passwd": {"namespace": "a", "name": "b"}})
    elif case == "huge uid, valid checksum":
        write_checkpoint(dirs, {"x" * 1_000_000: {}})
    else:
        write_checkpoint(dirs, {uid(1): [1, 2, 3]})
    d = DaemonProcess(dirs, host_root)
    assert d.wait_exit() == 1
    log = d.log()
    assert "Traceback" not in log
    error = next(r for r in d.log_records() if r["msg"] == "start-up failed")["error"]
    assert str(dirs.checkpoint) in error and expected in error, error
    assert len(error) < 1000, len(error)  # values are echoed capped


def test_a_crafted_journal_record_with_a_bad_uid_stops_start_up_with_the_reason(dirs: DaemonDirs,
                                                                                 host_root: Path) -> None:
    """The journal's records are checksummed like the snapshot: a valid checksum over a uid that names no claim
    (it would name a file outside the CDI dir) is refused as corruption, not a traceback."""
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_bytes(encode({}, "g1"))
    record = _line({"generation": "g1", "ops": [["put", "../../etc/x" * 1000, {}]], "synced": True})
    journal = dirs.checkpoint.with_name(dirs.checkpoint.name + JOURNAL_SUFFIX)
    journal.write_bytes(record + bytes(4096))
    d = DaemonProcess(dirs, host_root)
    assert d.wait_exit() == 1
    assert "Traceback" not in d.log()
    error = next(r for r in d.log_records() if r["msg"] == "start-up failed")["error"]
    assert "malformed journal record" in error and "is not allowed" in error and len(error) < 1000, error


@pytest.mark.parametrize("case", ["allocation a list", "nested 100,000 deep", "results a string"])
def test_a_malformed_claim_of_an_unfinished_prepare_does_not_stop_start_up(dirs: DaemonDirs, host_root: Path,
                                                                            case: str) -> None:
    """An unfinished prepare in the checkpoint (an earlier release killed between its two records, or a claim
    that damaged journal bytes demoted); by the restart the claim's answer is malformed. The daemon serves and
    keeps running (a raise here was an exit 1 on every restart: a crash loop), logs which claim could not be
    checked and why, and kubelet's retry of that claim gets a clear per-claim error."""
    c1 = ClaimRef("default", "c1", uid(1))
    dirs.put_claim(claim("c1", uid(1), devices(4)))
    dirs.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    recorded = Checkpoint(dirs.checkpoint)
    recorded.load()
    recorded.save({uid(1): PreparedClaim(uid(1), "default", "c1", ClaimState.PREPARE_STARTED, (), (4,), "{}", 0.0)})
    recorded.close(compact=False)
    path = dirs.claims / "default_c1.json"
    if case == "nested 100,000 deep":
        path.write_text('{"metadata": {"uid": "' + uid(1) + '"}, "status": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        doc = claim("c1", uid(1), devices(4))
        if case == "allocation a list":
            doc["status"]["allocation"] = [doc["status"]["allocation"]]
        else:
            doc["status"]["allocation"]["devices"]["results"] = "neuron-device-4"
        path.write_text(json.dumps(doc))
    d = DaemonProcess(dirs, host_root).wait_ready()
    try:
        warning = wait_until(lambda: next((r for r in d.log_records()
                                           if r["msg"].startswith("cannot check an unfinished prepare")), None),
                             what="the warning about the unfinished prepare")
        assert warning["claim"] == uid(1) and len(warning["error"]) < 1000
        assert ("status.allocation" in warning["error"]) or ("RecursionError" in warning["error"])
        client = pluginclient.DraClient(dirs.dra_socket)
        try:
            error = client.prepare([c1], timeout=20)[uid(1)].error
        finally:
            client.close()
        assert ("status.allocation" in error or "RecursionError" in error) and len(error) < 1000, error
        assert d.proc.poll() is None and "Traceback" not in d.log()
    finally:
        assert d.terminate() == 0


# --- Issue 42 item 2: what the API server answers at start-up -------------------------------------------------

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
DEEP = b"[" * 100_000 + b"]" * 100_000
POD_UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
GOOD_NODE = ok_json({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid", "labels": {}},
                     "status": {"nodeInfo": {"kubeletVersion": "v1.36.5"}}})
GOOD_VERSION = ok_json({"gitVersion": "v1.37.1"})
HUGE = ok(b'{"gitVersion": "' + b"x" * (5 * 1024 * 1024) + b'"}')  # past the client's 4 MiB object cap


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[FakeApiServer]:
    yield from serve(tmp_path)


class EntryProcess(DaemonProcess):
    """The daemon's real entry (`python -m neuron_dra.driver`: main, the API client, publishing) against `server`,
    with the DaemonSet's POD_UID, so that the socket names are read from the Node."""

    def __init__(self, dirs: DaemonDirs, host_root: Path, server: FakeApiServer, *extra: str) -> None:
        self.dirs = dirs
        self.log_path = dirs.base / f"entry-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, "POD_UID": POD_UID,
               "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_dra.driver", "--node-name", NODE, "--kubeconfig",
             str(server.kubeconfig(dirs.base / "kubeconfig")), "--plugins-dir", str(dirs.plugins), "--registry-dir",
             str(dirs.registry), "--cdi-root", str(dirs.cdi), "--host-root", str(host_root), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def record(self, msg: str) -> dict[str, Any] | None:
        return next((r for r in self.log_records() if r.get("msg") == msg), None)


def answering(node: bytes = GOOD_NODE, version: bytes = GOOD_VERSION) -> Script:
    """`node` to GET of this node, `version` to GET /version, 404 to everything else (claims, slices, events)."""
    def script(seen: Seen, reply: Reply) -> bool:
        reply.write(version if seen.target == "/version" else node if seen.target == f"/api/v1/nodes/{NODE}"
                    else NOT_FOUND)
        return True

    return script


@pytest.mark.parametrize(("case", "script", "unreadable"), [
    ("/version minor of 5,000 digits", answering(version=ok_json({"gitVersion": "v1." + "9" * 5000})), {"server"}),
    ("/version minor of 5 digits", answering(version=ok_json({"gitVersion": "v1.99999"})), set()),
    ("/version nested 100,000 deep", answering(version=ok(b'{"gitVersion": ' + DEEP + b"}")), {"server"}),
    ("Node nested 100,000 deep", answering(node=ok(b'{"status": ' + DEEP + b"}")), {"kubelet"}),
    ("kubeletVersion of 5,000 digits",
     answering(node=ok_json({"status": {"nodeInfo": {"kubeletVersion": "v1." + "3" * 5000}}})), {"kubelet"}),
    ("not JSON", answer(ok(b"\xff<html>"), keep=True), {"kubelet", "server"}),
    ("a JSON list", answer(ok(b"[[[1]]]"), keep=True), {"kubelet", "server"}),
    ("5 MiB answers", answer(HUGE, keep=True), {"kubelet", "server"}),
])
def test_no_start_up_answer_of_the_api_server_ends_the_daemon(dirs: DaemonDirs, host_root: Path,
                                                                api_server: FakeApiServer, case: str, script: Script,
                                                                unreadable: set[str]) -> None:
    """Each of these was a traceback and exit 1 at every restart (round 4). Now what cannot be read is unknown:
    the plain socket names, whole devices only, said in one warning; the daemon serves."""
    api_server.script = script
    d = EntryProcess(dirs, host_root, api_server)
    d.wait_ready()
    try:
        warnings = [r for r in d.log_records() if r["msg"].startswith("cannot read from the API server at start-up")]
        assert len(warnings) == (1 if unreadable else 0), warnings
        if unreadable:
            assert {k.removesuffix("_version_error") for k in warnings[0] if k.endswith("_version_error")} == \
                unreadable
            assert all(len(v) < 1000 for v in warnings[0].values()), warnings[0]
        names = d.record("socket names chosen")
        assert names is not None and (names["instance"] == "(plain names)") == ("kubelet" in unreadable), names
        if "kubelet" in unreadable:
            assert is_listening(dirs.registration_socket)
        if "server" in unreadable or case.startswith("/version"):
            whole = d.record("publishing whole Neuron devices only, no NeuronCores")
            assert whole is not None and "version is unknown" in whole["reason"] and len(whole["reason"]) < 1000, \
                whole
        assert d.proc.poll() is None and "Traceback" not in d.log()
    finally:
        assert d.terminate() == 0, d.log()
    assert "Traceback" not in d.log()


def test_the_sockets_open_in_time_while_every_api_answer_drips(dirs: DaemonDirs, host_root: Path,
                                                                api_server: FakeApiServer) -> None:
    """Every answer trickles in a byte at a time, at the largest request deadline: the registration socket and the
    health port were closed for 20-80 s (the probe allows far less). The start-up reads have a deadline of their
    own, so both open within 10 s (the deadline of this wait, not a measurement)."""
    def drip(seen: Seen, reply: Reply) -> bool:
        reply.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{")
        reply.drip(b" " * 400, 0.4, api_server.stop)
        return False

    api_server.script = drip
    port = free_port()
    d = EntryProcess(dirs, host_root, api_server, "--kube-api-timeout", "40", "--healthcheck-port", str(port))
    try:
        wait_until(lambda: (is_listening(dirs.registration_socket) and _accepts(port)) or d.proc.poll() is not None,
                   timeout=10, what="the registration socket and the health port")
        assert d.proc.poll() is None, d.log()
        warning = wait_until(lambda: d.record("cannot read from the API server at start-up; going on without it "
                                              "(the plain socket names, whole devices only)"), what="the warning")
        assert "no complete answer within the request deadline of 3 s" in warning["kubelet_version_error"], warning
    finally:
        api_server.stop.set()  # the drips end: the stop's own API calls fail at once
        assert d.terminate() == 0, d.log()
    assert "Traceback" not in d.log()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
