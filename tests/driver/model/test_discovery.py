"""Discovery of emulated trees, and the errors broken trees give."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from neuron_dra.driver.model import hosts
from neuron_dra.driver.model.catalog import BUILTIN, CATALOG, UnknownInstanceTypeError, get_instance_spec
from neuron_dra.driver.model.discovery import DiscoveryError, discover, normalize_bdf, parse_neuron_ls
from neuron_dra.driver.model.emulate import EMULATED_MAJOR, EmulationOptions, emulate

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
        assert dev.pci_bdf is not None and dev.numa_node is not None  # from neuron-ls
        assert dev.efa_bdf == (spec.device_efa_bdfs[dev.index] if spec.device_efa_bdfs else None)
    assert (host.ultraserver is not None) == (spec.ultraserver is not None)
    assert len(host.efa_bdfs) == spec.efa_count


def test_trn2_neighbours_and_neuron_ls(host_tree: HostTree) -> None:
    host = discover(host_tree("trn2.48xlarge"))
    assert host.device(0).connected == (12, 3, 4, 1)
    assert host.device(5).connected == (1, 4, 9, 6)
    assert host.device(0).pci_bdf == "0000:cc:00.0"  # neuron-ls example in docs/neuron-hardware.md §2
    assert host.device(0).numa_node == 1
    assert host.device(0).memory_bytes == 103079215104


def test_efa_alignment_per_family(host_tree: HostTree) -> None:
    trn1 = discover(host_tree("trn1.32xlarge"))
    assert [trn1.device(i).efa_bdf for i in (0, 1, 2, 14, 15)] == [
        "0000:10:1a.0", "0000:10:1a.0", "0000:a0:1a.0", "0000:a0:19.0", "0000:a0:19.0"]
    trn1n = discover(host_tree("trn1n.32xlarge"))
    assert [trn1n.device(i).efa_bdf for i in (0, 5, 15)] == ["0000:10:17.0", "0000:20:18.0", "0000:a0:18.0"]
    trn2 = discover(host_tree("trn2.48xlarge"))
    assert [trn2.device(i).efa_bdf for i in (0, 7, 15)] == ["0000:c9:00.0", "0000:6d:00.0", "0000:f6:00.0"]


def test_without_neuron_ls_uses_catalog_memory(host_tree: HostTree) -> None:
    host = discover(host_tree("inf2.48xlarge", neuron_ls=False))
    assert host.device(3).pci_bdf is None and host.device(3).numa_node is None
    assert host.device(3).memory_bytes == 32 * 1024**3
    assert host.device(0).connected == (11, 1)


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


def test_broken_neuron_ls_json(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    (root / "opt/aws/neuron/share/neuron-ls.json").write_text("{not json")
    assert "not JSON" in str(_error(root))


def test_neuron_ls_disagreeing_with_sysfs(host_tree: HostTree) -> None:
    root = host_tree("trn2.48xlarge")
    data_file = root / "opt/aws/neuron/share/neuron-ls.json"
    data = json.loads(data_file.read_text())
    data[2]["connected_to"] = [0, 1]
    data_file.write_text(json.dumps(data))
    assert "device 2 connected_to disagrees with sysfs" in str(_error(root))


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


def test_parse_neuron_ls_errors() -> None:
    with pytest.raises(DiscoveryError, match="missing field 'bdf'"):
        parse_neuron_ls('[{"neuron_device": 0, "memory_size": 1, "nc_count": 2}]')
    with pytest.raises(DiscoveryError, match="expected a JSON list"):
        parse_neuron_ls('"x"')
    assert parse_neuron_ls('{"neuron_devices": []}') == {}


def test_normalize_bdf() -> None:
    assert normalize_bdf("CC:00.0") == "0000:cc:00.0"
    assert normalize_bdf("0000:10:1a.0") == "0000:10:1a.0"
    with pytest.raises(ValueError):
        normalize_bdf("10:1a")


def test_neuron_ls_open_for_writing_somewhere_is_retried_not_an_error(tmp_path: Path) -> None:
    """ETXTBSY: exec of a file that some process still has open for writing fails; a process forked while the
    emulator wrote neuron-ls holds such a descriptor until its own exec. Discovery waits a moment instead of
    failing the node (seen once as 'Text file busy' when four nodes started together)."""
    import threading

    from neuron_dra.driver.model.discovery import NEURON_LS, run_neuron_ls
    root = emulate("trn1.32xlarge", tmp_path / "host")
    writer = (root / NEURON_LS).open("ab")  # our own descriptor open for writing: exec gets ETXTBSY
    threading.Timer(0.1, writer.close).start()
    devices = run_neuron_ls(root)
    assert writer.closed and devices is not None and len(devices) == 16
    # held for good: a clear error after a bounded wait
    with (root / NEURON_LS).open("ab"), pytest.raises(DiscoveryError) as e:
        run_neuron_ls(root)
    assert "Text file busy" in str(e.value)


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
