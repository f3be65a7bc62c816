"""Discovery of emulated trees, and the errors broken trees give."""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_dra.driver.model import hosts, neuron_ls
from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, UnknownInstanceTypeError, get_instance_spec
from neuron_dra.driver.model.discovery import DiscoveryError, discover
from neuron_dra.driver.model.emulate import (
    EMULATED_MAJOR,
    NEURON_LS_KINDS,
    EmulationOptions,
    emulate,
    install_neuron_ls,
    neuron_bdf,
    numa_node,
)
from neuron_dra.driver.model.neuron_ls import NEURON_LS, NeuronLsError, normalize_bdf
from neuron_dra.driver.model.slices import NodeFacts, build_pool, resource_slices

HostTree = Callable[..., Path]
DEV = "sys/devices/virtual/neuron_device"


@pytest.mark.parametrize("instance_type", sorted(CATALOG))
def test_emulated_tree_discovers_as_its_catalog_type(host_tree: HostTree, instance_type: str) -> None:
    spec = get_instance_spec(instance_type)
    host = discover(host_tree(instance_type))
    assert host.spec == spec
    assert host.kernel_driver_version == "2.25.4.0"
    assert [d.index for d in host.devices] == list(range(spec.device_count))
    for dev in host.devices:
        assert dev.physical_cores == spec.physical_cores_per_device
        assert dev.memory_bytes == spec.hbm_bytes_per_device
        assert (dev.major, dev.minor) == (EMULATED_MAJOR, dev.index)
        assert (dev.pci_bdf, dev.numa_node) == (neuron_bdf(spec, dev.index), numa_node(spec, dev.index))
        assert dev.efa_bdf == (spec.device_efa_bdfs[dev.index] if spec.device_efa_bdfs else None)
    assert (host.ultraserver is not None) == (spec.ultraserver is not None)
    assert len(host.efa_bdfs) == spec.efa_count


def test_trn2_neighbours_and_neuron_ls(host_tree: HostTree) -> None:
    host = discover(host_tree("trn2.48xlarge"))
    assert host.device(0).connected == (12, 3, 4, 1)
    assert host.device(5).connected == (1, 4, 9, 6)
    # AWS's neuron-ls example (docs/neuron-ls.md §2)
    assert [(host.device(i).pci_bdf, host.device(i).numa_node) for i in (0, 8, 15)] == [
        ("0000:cc:00.0", 1), ("0000:9b:00.0", 0), ("0000:f7:00.0", 1)]
    assert host.device(0).memory_bytes == 103079215104
    assert host.neuron_ls is not None and host.neuron_ls.flags == "--output-format json"
    assert host.neuron_ls.field("instance_type") == "trn2.48xlarge"


def test_efa_alignment_per_family(host_tree: HostTree) -> None:
    trn1 = discover(host_tree("trn1.32xlarge"))
    assert [trn1.device(i).efa_bdf for i in (0, 1, 2, 14, 15)] == [
        "0000:10:1a.0", "0000:10:1a.0", "0000:a0:1a.0", "0000:a0:19.0", "0000:a0:19.0"]
    trn1n = discover(host_tree("trn1n.32xlarge"))
    assert [trn1n.device(i).efa_bdf for i in (0, 5, 15)] == ["0000:10:17.0", "0000:20:18.0", "0000:a0:18.0"]
    trn2 = discover(host_tree("trn2.48xlarge"))
    assert [trn2.device(i).efa_bdf for i in (0, 7, 15)] == ["0000:c9:00.0", "0000:6d:00.0", "0000:f6:00.0"]


def test_without_neuron_ls_sysfs_gives_pci_and_numa(host_tree: HostTree) -> None:
    spec = get_instance_spec("inf2.48xlarge")
    host = discover(host_tree("inf2.48xlarge", neuron_ls=False))
    assert (host.device(7).pci_bdf, host.device(7).numa_node) == (neuron_bdf(spec, 7), numa_node(spec, 7))
    assert host.device(3).memory_bytes == 32 * 1024**3
    assert host.device(0).connected == (11, 1)
    assert host.neuron_ls is None


def test_ultraserver_class_files(host_tree: HostTree) -> None:
    host = discover(host_tree("trn2u.48xlarge", ultraserver_node=3, host_id="us-a"))
    assert host.ultraserver is not None
    assert (host.ultraserver.node_id_4, host.ultraserver.node_id_2, host.ultraserver.mode) == (3, 1, 4)
    assert host.ultraserver.server_id_2.startswith(host.ultraserver.server_id_4)


# --- broken trees -------------------------------------------------------------------------------------------


def _error(root: Path) -> DiscoveryError:
    with pytest.raises(DiscoveryError) as exc:
        discover(root)
    return exc.value


def test_missing_core_count(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / DEV / "neuron3" / "core_count").unlink()
    err = _error(root)
    assert err.path.endswith("neuron3/core_count") and "missing file" in str(err)


def test_garbage_core_count(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / DEV / "neuron2" / "core_count").write_text("eight")
    err = _error(root)
    assert "neuron2/core_count" in str(err) and "'eight'" in str(err) and "decimal integer" in str(err)


def test_core_count_contradicting_catalog(host_tree: HostTree) -> None:
    root = host_tree("trn1.32xlarge")
    (root / DEV / "neuron0" / "core_count").write_text("8")
    assert "trn1.32xlarge devices have 2 cores" in str(_error(root))


def test_unknown_product_name(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / "sys/devices/virtual/dmi/id/product_name").write_text("m7i.large\n")
    err = _error(root)
    assert "product_name" in err.path and "'m7i.large'" in str(err) and "trn2.48xlarge" in str(err)


def test_missing_product_name(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / "sys/devices/virtual/dmi/id/product_name").unlink()
    assert "product_name: missing file" in str(_error(root))


def test_wrong_device_count(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    shutil.rmtree(root / DEV / "neuron15")
    err = _error(root)
    assert "has 16 Neuron devices" in str(err) and "neuron14" in str(err)


def test_neighbours_not_a_torus(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / DEV / "neuron5" / "connected_devices").write_text("1, 4, 9, 7")
    err = _error(root)
    assert "neuron5/connected_devices" in str(err) and "links to 1, 4, 9, 6" in str(err) and "'1, 4, 9, 7'" in str(err)


def test_garbage_neighbours(host_tree: HostTree) -> None:
    root = host_tree("trn1.32xlarge")
    (root / DEV / "neuron0" / "connected_devices").write_text("12; 3")
    assert "comma-separated device indexes" in str(_error(root))


def test_bad_kernel_driver_version(host_tree: HostTree) -> None:
    root = host_tree("inf2.xlarge")
    (root / "sys/module/neuron/version").write_text("2.25\n")
    assert "4-part version" in str(_error(root))


def test_wrong_architecture(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / DEV / "neuron1" / "info/architecture/device_name").write_text("Trainium1\n")
    err = _error(root)
    assert "device_name" in err.path and "'Trainium2'" in str(err) and "'Trainium1'" in str(err)


def test_missing_efa(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / "sys/bus/pci/drivers/efa/0000:c9:00.0").unlink()
    err = _error(root)
    assert "EFA interfaces" in str(err) and "0000:c9:00.0" in str(err)


def test_ultraserver_file_on_plain_trn2(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    for name in ("server_id_2", "server_id_4", "node_id_2", "node_id_4", "ultraserver_mode"):
        (root / "sys/class/neuron_device" / name).write_text("1\n")
    assert "UltraServer class files on a trn2.48xlarge host" in str(_error(root))


def test_bad_ultraserver_mode(host_tree: HostTree) -> None:
    root = host_tree("trn2u.48xlarge")
    (root / "sys/class/neuron_device/ultraserver_mode").write_text("3\n")
    err = _error(root)
    assert "ultraserver_mode" in err.path and "expected 1, 2 or 4" in str(err)


def test_missing_device_node(host_tree: HostTree) -> None:
    root = host_tree("inf2.24xlarge")
    (root / "dev/neuron4").unlink()
    assert "neuron4: missing device node" in str(_error(root))


def test_not_a_neuron_host(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/virtual/dmi/id").mkdir(parents=True)
    (tmp_path / "sys/devices/virtual/dmi/id/product_name").write_text("trn1.2xlarge\n")
    (tmp_path / "sys/module/neuron").mkdir(parents=True)
    (tmp_path / "sys/module/neuron/version").write_text("2.25.4.0\n")
    assert "no Neuron kernel driver loaded" in str(_error(tmp_path))


def test_normalize_bdf() -> None:
    assert normalize_bdf("CC:00.0") == "0000:cc:00.0"
    assert normalize_bdf("0000:10:1a.0") == "0000:10:1a.0"
    with pytest.raises(ValueError):
        normalize_bdf("10:1a")


def test_emulated_hosts_are_kept_per_type_options_and_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts._emulated_host.cache_clear()
    written: list[str] = []

    def counting_emulate(instance_type: str, *args: object, **kwargs: object) -> Path:
        written.append(instance_type)
        return emulate(instance_type, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hosts, "emulate", counting_emulate)
    first = hosts.emulated_host("inf2.xlarge")
    assert hosts.emulated_host("inf2.xlarge", EmulationOptions(), BUILTIN) is first  # the defaults are one key
    other = hosts.emulated_host("inf2.xlarge", EmulationOptions(host_id="other"))
    assert other != first and other.spec == first.spec  # options seed the serial numbers
    assert written == ["inf2.xlarge", "inf2.xlarge"]
    with pytest.raises(UnknownInstanceTypeError, match=r"nope\.xlarge"):
        hosts.emulated_host("nope.xlarge")
    assert hosts._emulated_host.cache_info().maxsize == hosts.EMULATED_HOSTS_KEPT  # bounded
    hosts._emulated_host.cache_clear()


def test_a_sysfs_pci_link_to_no_pci_address_is_an_error(host_tree: HostTree) -> None:
    root = host_tree("trn1.2xlarge")
    link = root / DEV / "neuron0" / "device"
    link.unlink()
    link.symlink_to("../../../pci0000:10/not-a-bdf")
    err = _error(root)
    assert err.path.endswith("neuron0/device") and "'../../../pci0000:10/not-a-bdf'" in str(err)


# --- neuron-ls of every version, and broken ones (docs/neuron-ls.md) ---------------------------------------------
# Real executables where discovery finds them (the host root's /opt/aws/neuron/bin/neuron-ls): the emulated tools
# of each kind, AWS's documented output (tests/fixtures/neuron-ls/README.md cites it) and broken tools.

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "neuron-ls"
LOGGER = "neuron_dra.driver.model.discovery"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def _published(host: Any) -> list[dict[str, Any]]:
    return resource_slices(build_pool(host, NodeFacts("node-a")))


@pytest.mark.parametrize("instance_type", ["trn2.48xlarge", "trn2u.48xlarge", "trn1.32xlarge", "inf2.48xlarge"])
def test_same_devices_published_whichever_neuron_ls_the_host_has(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, instance_type: str) -> None:
    """Judged (issue 40): a neuron-ls that accepts only `--output-format json` (Neuron 2.34+), only `--json-output`
    (before), or fails: the same devices, PCI addresses and NUMA nodes every time; one warning for the failing."""
    spec = get_instance_spec(instance_type)
    expected = [(i, neuron_bdf(spec, i), numa_node(spec, i)) for i in range(spec.device_count)]
    published = []
    for kind in NEURON_LS_KINDS:
        caplog.clear()
        root = emulate(instance_type, tmp_path / kind, EmulationOptions(neuron_ls_kind=kind))
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            host = discover(root)
        assert [(d.index, d.pci_bdf, d.numa_node) for d in host.devices] == expected, kind
        warnings = _warnings(caplog)
        if kind == "failing":
            assert host.neuron_ls is None
            (message,) = warnings
            exe = str(root / NEURON_LS)
            assert f"{exe} --output-format json: exited 1" in message
            assert f"{exe} --json-output: exited 1" in message and "failed to open /dev/neuron0" in message
            assert f"publishing the {spec.device_count} Neuron devices from sysfs" in message
        else:
            assert warnings == [], kind
            assert host.neuron_ls is not None  # it answered, so the values were checked against it
            assert host.neuron_ls.flags == {"output-format": "--output-format json",
                                            "json-output": "--json-output"}[kind]
        published.append(_published(host))
    assert published[0] == published[1] == published[2]
    devices = [d for s in published[0] for d in s["spec"]["devices"] if "deviceId" in d["attributes"]]
    assert len(devices) == spec.device_count
    assert all({"resource.kubernetes.io/pciBusID", "resource.kubernetes.io/numaNode"} <= set(d["attributes"])
               for d in devices)


@pytest.mark.parametrize(("fixture", "flags"), [("json-output-trn2.48xlarge.json", "--json-output"),
                                                 ("output-format-trn2.48xlarge.json", "--output-format json")])
@pytest.mark.parametrize("pci_link", [True, False])
def test_aws_documented_output_on_a_trn2(tmp_path: Path, caplog: pytest.LogCaptureFixture, fixture: str,
                                         flags: str, pci_link: bool) -> None:
    """AWS's neuron-ls output of a trn2 (each version answering only its own flag) agrees with the emulated sysfs;
    without a sysfs PCI link the PCI addresses and NUMA nodes come from it."""
    root = emulate("trn2.48xlarge", tmp_path / "host", EmulationOptions(neuron_ls=False, sysfs_pci_link=pci_link))
    install_neuron_ls(root, f'#!/bin/sh\n[ "$*" = "{flags}" ] || {{ echo "unknown option $*" >&2; exit 2; }}\n'
                            f'exec cat "{FIXTURES / fixture}"\n')
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        host = discover(root)
    assert _warnings(caplog) == []
    assert host.neuron_ls is not None and host.neuron_ls.flags == flags
    assert [(host.device(i).pci_bdf, host.device(i).numa_node) for i in (0, 4, 8, 12, 15)] == [
        ("0000:cc:00.0", 1), ("0000:6f:00.0", 0), ("0000:9b:00.0", 0), ("0000:f8:00.0", 1), ("0000:f7:00.0", 1)]
    if flags == "--output-format json":
        assert host.neuron_ls.field("instance_id") == "i-aabbccdd123456789"


BROKEN = {
    "exit-1.sh": ["--output-format json: exited 1: 'neuron-ls: failed to query the Neuron driver: ioctl failed",
                  "--json-output: exited 1"],
    "hang.sh": ["--output-format json: did not finish within 0.5 s"],
    "garbage.sh": ["--output-format json: not JSON", "'instance-type: trn2.48xlarge", "--json-output: not JSON"],
    "wrong-shape.sh": ["neuron_devices[0].neuron_device is 'zero'; expected an integer >= 0"],
    "too-large.sh": [f"--output-format json: printed more than {neuron_ls.MAX_OUTPUT_BYTES} bytes"],
}


@pytest.mark.parametrize("script", sorted(BROKEN))
def test_a_broken_neuron_ls_is_one_warning_and_sysfs(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    spec = get_instance_spec("trn2.48xlarge")
    root = emulate("trn2.48xlarge", tmp_path / "host", EmulationOptions(neuron_ls=False))
    reference = discover(root, use_neuron_ls=False)
    exe = install_neuron_ls(root, (FIXTURES / "broken" / script).read_text())
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("NEURON_LS_PID_FILE", str(pid_file))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        host = discover(root, neuron_ls_timeout=0.5)
    assert host.devices == reference.devices and host.neuron_ls is None
    assert host.device(8).pci_bdf == neuron_bdf(spec, 8)
    (message,) = _warnings(caplog)
    for part in BROKEN[script]:
        assert part in message, message
    assert message.startswith(f"{exe} --output-format json: ")
    assert len(message) < 1000  # what the tool said is truncated
    if script in ("hang.sh", "too-large.sh"):
        assert "--json-output" not in message  # a hung or flooding tool is not asked twice
    if script == "hang.sh":  # its child was stopped with it (its own process group): wait for its exit event
        try:
            pidfd = os.pidfd_open(int(pid_file.read_text()))
        except ProcessLookupError:
            return
        try:
            assert select.select([pidfd], [], [], 30)[0] == [pidfd], "the hung tool's child still runs"
        finally:
            os.close(pidfd)


def test_a_missing_or_unexecutable_neuron_ls_is_one_warning(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    root = emulate("inf2.24xlarge", tmp_path / "host", EmulationOptions(neuron_ls=False))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert discover(root).device(5).pci_bdf is not None
    (missing,) = _warnings(caplog)
    assert f"neuron-ls: not installed (no {root / NEURON_LS})" in missing
    caplog.clear()
    install_neuron_ls(root, "#!/bin/sh\nexit 0\n").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        discover(root)
    (unexecutable,) = _warnings(caplog)
    assert f"{root / NEURON_LS} --output-format json: present but not executable" in unexecutable


def _edit(path: Path, change: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["neuron_devices"][2].update(connected_to=[0, 1]),
     "device 2 connected_to [0, 1] disagrees with sysfs connected_devices '14, 1, 6, 3'"),
    (lambda d: d["neuron_devices"][3].update(bdf="aa:00.0"),
     "device 3 bdf '0000:aa:00.0' disagrees with its sysfs PCI link '0000:cb:00.0'"),
    (lambda d: d["neuron_devices"][4].update(numa_node="1"), "device 4 numa_node 1 disagrees with sysfs 0"),
    (lambda d: d["neuron_devices"].pop(), "lists devices [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]"),
    (lambda d: d.update(instance_type="trn1.32xlarge"),
     "says instance type 'trn1.32xlarge', the host's product_name says 'trn2.48xlarge'"),
    (lambda d: d["neuron_devices"][0].update(memory_size=1), "device 0 memory_size 1; trn2.48xlarge devices have"),
])
def test_neuron_ls_disagreeing_with_sysfs_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         change: Callable[[Any], None], said: str) -> None:
    root = emulate("trn2.48xlarge", tmp_path / "host")
    reference = discover(root, use_neuron_ls=False)
    _edit(root / "opt/aws/neuron/share/neuron-ls-output-format.json", change)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        host = discover(root)
    (message,) = _warnings(caplog)
    assert f"{root / NEURON_LS} --output-format json: {said}" in message
    assert host.devices == reference.devices and host.neuron_ls is None


def test_without_a_sysfs_pci_link_only_neuron_ls_knows_the_pci_addresses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What the kernel driver's public source creates (no PCI link under /sys/class/neuron_device)."""
    spec = get_instance_spec("trn1.32xlarge")
    working = discover(emulate("trn1.32xlarge", tmp_path / "a", EmulationOptions(sysfs_pci_link=False)))
    assert [(d.pci_bdf, d.numa_node) for d in working.devices] == [
        (neuron_bdf(spec, i), numa_node(spec, i)) for i in range(16)]
    root = emulate("trn1.32xlarge", tmp_path / "b", EmulationOptions(sysfs_pci_link=False, neuron_ls_kind="failing"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        failing = discover(root)
    assert {(d.pci_bdf, d.numa_node) for d in failing.devices} == {(None, None)}
    (message,) = _warnings(caplog)
    assert message.endswith("from sysfs (without PCI addresses and NUMA nodes where sysfs has no PCI link)")


def test_ultraserver_fields_of_the_new_format_are_kept(host_tree: HostTree) -> None:
    host = discover(host_tree("trn2u.48xlarge", ultraserver_node=2, host_id="us-b"))
    assert host.neuron_ls is not None and host.ultraserver is not None
    fields = dict(host.neuron_ls.ultraserver_fields)
    assert fields["ultraserver.server_id_4"] == host.ultraserver.server_id_4
    assert fields["ultraserver.node_id_4"] == "2"
    assert host.neuron_ls.field("instance_type") == "trn2u.48xlarge"


def test_neuron_ls_on_path_when_the_host_root_is_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "neuron-ls"
    tool.write_text(f'#!/bin/sh\nexec cat "{FIXTURES / "output-format-trn2.48xlarge.json"}"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    exe = neuron_ls.find(Path("/"))
    assert exe == str(tool)
    out = neuron_ls.run(exe)
    assert out.flags == "--output-format json" and out.devices[15].bdf == "0000:f7:00.0"
    assert neuron_ls.find(tmp_path) is None  # any other root: only its own /opt/aws/neuron/bin


def test_parse_either_shape_and_refusals() -> None:
    single = ('[{"instance_type": "trn2.3xlarge", "neuron_device": 0, "bdf": "0000:33:00.0", "numa_node": "-1", '
              '"connected_to": null, "memory_size": 103079215104}]')  # null and a full BDF are seen in the wild
    (dev,) = neuron_ls.parse(single, "--json-output").devices.values()
    assert (dev.bdf, dev.numa_node, dev.connected_to) == ("0000:33:00.0", None, ())
    nested = neuron_ls.parse('{"instance_info": {"instance_type": "x"}, "devices": []}', "--output-format json")
    assert nested.fields == (("instance_info.instance_type", "x"),)
    for text, said in [
        ('{"neuron_devices": "none"}', "neuron_devices is '\"none\"'; expected a list of devices"),
        ('{"instance_type": "x"}', "an object without a device list ('neuron_devices'): keys ['instance_type']"),
        ("[" * 200_000, "JSON nested too deeply"),
        ('[{"neuron_device": 0, "memory_size": 1}]', "devices[0] has no 'bdf'"),
        ('[{"neuron_device": 0, "bdf": "cc:00", "memory_size": 1}]', "devices[0].bdf is 'cc:00'; expected a PCI"),
        ('[{"neuron_device": 0, "bdf": "cc:00.0", "memory_size": 1, "numa_node": "one"}]',
         "devices[0].numa_node is 'one'; expected a NUMA node"),
        ('[{"neuron_device": true, "bdf": "cc:00.0", "memory_size": 1}]', "devices[0].neuron_device is True"),
        ('[{"neuron_device": 0, "bdf": "cc:00.0", "memory_size": 1},'
         ' {"neuron_device": 0, "bdf": "cc:00.0", "memory_size": 1}]', "devices[1] lists device 0 a second time"),
        ('[{"neuron_device": 0, "bdf": "cc:00.0", "memory_size": 1, "connected_to": "1, 2"}]',
         "devices[0].connected_to is '1, 2'; expected a list of device indexes or null"),
    ]:
        with pytest.raises(NeuronLsError) as e:
            neuron_ls.parse(text, "--json-output")
        assert said in str(e.value), (text, str(e.value))


def test_neuron_ls_open_for_writing_somewhere_is_retried_not_an_error(tmp_path: Path) -> None:
    """ETXTBSY: exec of a file that some process still has open for writing fails; a process forked while the
    emulator wrote neuron-ls holds such a descriptor until its own exec. Discovery waits a moment instead of
    giving up on the tool (seen once as 'Text file busy' when four nodes started together)."""
    import threading

    root = emulate("trn1.32xlarge", tmp_path / "host")
    exe = str(root / NEURON_LS)
    writer = (root / NEURON_LS).open("ab")  # our own descriptor open for writing: exec gets ETXTBSY
    threading.Timer(0.1, writer.close).start()
    out = neuron_ls.run(exe)
    assert writer.closed and len(out.devices) == 16
    # held for good: a clear refusal after a bounded wait
    with (root / NEURON_LS).open("ab"), pytest.raises(NeuronLsError) as e:
        neuron_ls.run(exe)
    assert "Text file busy" in str(e.value) and "--json-output" not in str(e.value)
