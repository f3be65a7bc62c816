"""Issue 32, round 3 of attacks on the daemon's inputs (finding 9): a catalog file with control characters,
repeated keys or YAML 1.1 number forms, and claim UIDs or request names that end in a line feed. Each is refused
with an error naming the field, the value and what is allowed; the daemon's start-up ends with its one
"start-up failed" line, never a traceback. Bounded: small files, loopback sockets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from neuron_dra.driver.daemon import driver as daemon_driver
from neuron_dra.driver.daemon import main as daemon_main
from neuron_dra.driver.daemon import options as daemon_options
from neuron_dra.driver.daemon.claims.allocation import ClaimError, Reason, allocated_devices
from neuron_dra.driver.daemon.claims.cdi import CdiDevice, CdiError, check_claim_uid
from neuron_dra.driver.kubeletplugin._claimref import Claim, ClaimRef
from neuron_dra.driver.model.catalog import BUILTIN
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.k8s_names import is_dns_label, is_dns_subdomain, is_label_value
from tests.support import pluginclient
from tests.support.driver import DRIVER, NODE, DaemonDirs, DaemonProcess, claim, devices, result, short_dir, uid

pytestmark = pytest.mark.attacks
HEADER = "apiVersion: neuron-dra/v1\nkind: NeuronCatalog\n"
TYPE = "instanceTypes:\n  trn2.mine:\n    basedOn: trn2.48xlarge\n"


@pytest.mark.parametrize(("character", "name"), [("\0", "NUL"), ("\x1b", "ESC"), ("\x07", "BEL"), ("\x7f", "DEL")])
@pytest.mark.process
def test_a_catalog_with_a_control_character_ends_start_up_with_its_line(tmp_path: Path, character: str,
                                                                        name: str) -> None:
    """Round 3: a NUL in the catalog ended start-up with a traceback and no "start-up failed" line."""
    path = tmp_path / "catalog.yaml"
    path.write_text(HEADER + TYPE + f"    devices: 1{character}6\n", encoding="utf-8")
    with pytest.raises(CatalogFileError) as err:
        load_catalog(path)
    assert f"control character {ord(character):#04x}" in str(err.value) and "line 6, column 15" in str(err.value)
    if name != "NUL":
        return
    with short_dir() as base:
        dirs = DaemonDirs(base)
        daemon = DaemonProcess(dirs, emulate("trn2.48xlarge", base / "host"), extra_args=["--catalog", str(path)])
        assert daemon.wait_exit() == 1
        assert "Traceback" not in daemon.log()
        failed = [r for r in daemon.log_records() if r.get("msg") == "start-up failed"]
        assert len(failed) == 1 and str(path) in failed[0]["error"] and "control character 0x00" in failed[0]["error"]


def test_a_repeated_key_is_an_error_naming_it_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(HEADER + TYPE + "    devices: 4\n    efaCount: 0\n    devices: 16\n", encoding="utf-8")
    with pytest.raises(CatalogFileError) as err:
        load_catalog(path)
    assert "key 'devices' repeats the one of line 6" in str(err.value) and "line 8" in str(err.value)
    path.write_text(HEADER + TYPE + "instanceTypes: {}\n", encoding="utf-8")  # at the top level too
    with pytest.raises(CatalogFileError, match="key 'instanceTypes' repeats"):
        load_catalog(path)


@pytest.mark.parametrize("number", ["1_6", "0_16", "1:30", "017", "+1_6", "1_6.0"])
def test_yaml_1_1_number_forms_are_refused_not_misread(tmp_path: Path, number: str) -> None:
    """Round 3: `1_6` read as 16 (and `1:30` reads as 90, `017` as 15)."""
    path = tmp_path / "catalog.yaml"
    path.write_text(HEADER + TYPE + f"    devices: {number}\n", encoding="utf-8")
    with pytest.raises(CatalogFileError) as err:
        load_catalog(path)
    assert f"(got '{number}')" in str(err.value) and "plain decimal or 0x hex" in str(err.value)
    path.write_text(HEADER + TYPE + "    devices: 16\n    hbmGiB: 0x60\n", encoding="utf-8")
    assert load_catalog(path).spec("trn2.mine").device_count == 16  # plain decimal and hex still read


def test_catalog_names_ending_in_a_line_feed_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(HEADER + 'instanceTypes:\n  "trn2.mine\\n":\n    basedOn: trn2.48xlarge\n', encoding="utf-8")
    with pytest.raises(CatalogFileError, match=r"instanceTypes\[trn2.mine\n\]"):
        load_catalog(path)
    path.write_text(HEADER + TYPE + '    efaMap: ["0000:c9:00.0\\n"]\n', encoding="utf-8")
    with pytest.raises(CatalogFileError, match="a PCI address like"):
        load_catalog(path)
    assert BUILTIN.spec("trn2.48xlarge")  # the built-in catalog is untouched


@pytest.mark.parametrize("value", ["abc\n", "default\n", "a.b\n"])
def test_names_are_matched_whole_not_before_a_final_line_feed(value: str) -> None:
    assert not is_dns_label(value) and not is_dns_subdomain(value) and not is_label_value(value)
    with pytest.raises(CdiError, match="is not allowed"):
        check_claim_uid(uid(1) + "\n")
    with pytest.raises(CdiError, match="is not allowed"):
        CdiDevice(f"{uid(1)}-request-{value}")


def test_a_request_name_ending_in_a_line_feed_is_a_malformed_claim_naming_the_field() -> None:
    ref = ClaimRef("default", "c1", uid(1))
    doc = claim("c1", uid(1), [result("neuron-device-0", request="neurons\n")])
    with pytest.raises(ClaimError) as err:
        allocated_devices(Claim.checked(ref, doc), DRIVER, NODE, BUILTIN.spec("trn2.48xlarge"))
    assert err.value.reason == Reason.MALFORMED_CLAIM
    assert ".request is 'neurons\\n'" in err.value.message and "a request name (a DNS label" in err.value.message
    for good in ("neurons", "neurons/big"):
        doc = claim("c1", uid(1), [result("neuron-device-0", request=good)])
        allocated = allocated_devices(Claim.checked(ref, doc), DRIVER, NODE, BUILTIN.spec("trn2.48xlarge"))
        assert allocated[0].request == good


@pytest.mark.process
def test_the_daemon_refuses_a_line_feed_in_a_uid_or_request_name_and_writes_no_cdi_id_with_it(
        dirs: DaemonDirs, host_root: Path) -> None:
    """Round 3: a claim UID or request name ending in a line feed was accepted and the LF reached the CDI id."""
    dirs.put_claim(claim("c1", uid(1) + "\n", devices(0)))
    dirs.put_claim(claim("c2", uid(2), [result("neuron-device-1", request="neurons\n")]))
    dirs.put_claim(claim("c3", uid(3), devices(2)))
    d = DaemonProcess(dirs, host_root).wait_ready()
    client = pluginclient.DraClient(dirs.dra_socket)
    try:
        bad_uid = client.prepare([ClaimRef("default", "c1", uid(1) + "\n")], timeout=20)[uid(1) + "\n"]
        assert "claim uid '" + uid(1) + "\\n' is not allowed" in bad_uid.error and not bad_uid.devices
        bad_request = client.prepare([ClaimRef("default", "c2", uid(2))], timeout=20)[uid(2)]
        assert ".request is 'neurons\\n'" in bad_request.error and not bad_request.devices
        good = client.prepare([ClaimRef("default", "c3", uid(3))], timeout=20)[uid(3)]
        assert not good.error and all("\n" not in i for x in good.devices for i in x.cdi_device_ids)
    finally:
        client.close()
        assert d.terminate() == 0
    assert [p.name for p in dirs.cdi.iterdir() if p.name.endswith(".json")] == [f"{DRIVER}_{uid(3)}.json"]
    assert b"\n\"" not in (dirs.cdi / f"{DRIVER}_{uid(3)}.json").read_bytes()


def test_an_unexpected_fault_at_start_up_still_ends_with_the_start_up_failed_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever a check missed, start-up ends with exit 1 and the one line operators look for."""
    def broken(self: daemon_driver.Daemon) -> None:
        raise UnicodeError("a fault no check names")

    monkeypatch.setattr(daemon_driver.Daemon, "start", broken)
    monkeypatch.setattr(daemon_driver.Daemon, "stop", lambda self: None)
    options = daemon_options.parse_options(["--node-name", NODE, "--plugins-dir", str(tmp_path / "p"), "--registry-dir",
                                         str(tmp_path / "r"), "--cdi-root", str(tmp_path / "c"), "--host-root",
                                         str(tmp_path)], {})
    with caplog.at_level(logging.ERROR, logger="neuron_dra.driver.daemon.main"):
        assert daemon_main.run_daemon(options, lookup=None, api=None) == 1  # type: ignore[arg-type]
    (line,) = [r for r in caplog.records if r.getMessage() == "start-up failed"]
    assert "a fault no check names" in line.error  # type: ignore[attr-defined]
