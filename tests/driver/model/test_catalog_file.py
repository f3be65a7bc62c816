"""Catalog files (docs/catalog-file.md): strict validation, and an instance type of our own making through
emulation, discovery, slices and the CLIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuron_dra.driver import deploy
from neuron_dra.driver.daemon.options import parse_options
from neuron_dra.driver.model.catalog import BUILTIN, GIB, TopologyKind
from neuron_dra.driver.model.catalog_file import CatalogFileError, load_catalog, parse_catalog
from neuron_dra.driver.model.discovery import discover
from neuron_dra.driver.model.emulate import emulate
from neuron_dra.driver.model.hosts import emulated_host
from neuron_dra.driver.model.slices import NodeFacts, build_pool
from tests.support import kubeschema
from tests.support.driver import DaemonDirs, DaemonProcess, short_dir

ACME_EFA = [f"0000:{b}:00.0" for b in ("10", "10", "20", "20", "30", "30", "40", "40")]
ACME: dict[str, Any] = {
    "apiVersion": "neuron-dra/v1",
    "kind": "NeuronCatalog",
    "families": {"acme1": {"deviceName": "Acme1", "archType": "NDv9", "archInstanceType": "Acme1",
                           "pciDeviceId": "0x9964", "coreGeneration": "NeuronCore-v9", "coresPerDevice": 4,
                           "hbmGiB": 64, "lnc": {"supported": True, "default": 2}}},
    "instanceTypes": {
        "acme1.24xlarge": {"family": "acme1", "devices": 8, "topology": "all-to-all", "efaCount": 4,
                           "efaMap": ACME_EFA},
        "acme1u.24xlarge": {"basedOn": "acme1.24xlarge", "ultraServer": {"servers": 2, "generation": "Acme"}},
        "trn3.48xlarge": {"efaCount": 8},
    },
}


def write(tmp_path: Path, doc: object, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_a_file_adds_types_and_overrides_values_without_touching_the_builtin(tmp_path: Path) -> None:
    catalog = load_catalog(write(tmp_path, ACME))
    acme = catalog.spec("acme1.24xlarge")
    assert (acme.device_count, acme.physical_cores_per_device, acme.hbm_bytes_per_device) == (8, 4, 64 * GIB)
    assert acme.topology is TopologyKind.ALL_TO_ALL and acme.family.pci_device_id == 0x9964
    assert acme.logical_cores_per_device() == 2 and acme.device_efa_bdfs == tuple(ACME_EFA)
    us = catalog.spec("acme1u.24xlarge")
    assert us.ultraserver is not None and us.ultraserver.servers == 2 and us.ultraserver.modes == (1, 2)
    assert us.device_count == 8 and us.family.name == "acme1"
    assert catalog.spec("trn3.48xlarge").efa_count == 8 and BUILTIN.spec("trn3.48xlarge").efa_count == 1
    assert catalog.spec("trn3.48xlarge").source.endswith("catalog.yaml")
    assert "acme1.24xlarge" not in BUILTIN
    assert catalog.of_family("acme1") == ("acme1.24xlarge", "acme1u.24xlarge")


def test_changing_a_family_changes_its_builtin_types(tmp_path: Path) -> None:
    doc = {"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "families": {"trn3": {"hbmGiB": 160}}}
    catalog = load_catalog(write(tmp_path, doc))
    assert catalog.spec("trn3.48xlarge").hbm_bytes_per_device == 160 * GIB
    assert catalog.spec("trn3p.48xlarge").hbm_bytes_per_device == 144 * GIB  # its own family, trn3p
    assert catalog.spec("trn2.48xlarge") == BUILTIN.spec("trn2.48xlarge")


def test_an_own_type_is_emulated_discovered_and_published(tmp_path: Path) -> None:
    catalog = load_catalog(write(tmp_path, ACME))
    root = emulate("acme1.24xlarge", tmp_path / "host", catalog=catalog)
    host = discover(root, catalog=catalog)
    assert len(host.devices) == 8 and host.efa_bdfs == tuple(sorted(set(ACME_EFA)))
    with pytest.raises(Exception, match=r"acme1\.24xlarge"):  # the built-in catalog does not know the host
        discover(root)
    devs = build_pool(host, NodeFacts("n")).devices
    assert [d.capacity for d in devs] == [{"cores": "4", "memory": "64Gi"}] * 8
    assert devs[0].attributes["resource.aws.com/devicegroup1_id"] == {"string": "0000:10:00.0"}
    group4 = "resource.aws.com/devicegroup4_id"
    assert devs[0].attributes[group4] == devs[3].attributes[group4] != devs[4].attributes[group4]
    us = build_pool(emulated_host("acme1u.24xlarge", catalog=catalog), NodeFacts("n")).devices
    assert us[-1].name == "neuron-node" and us[-1].attributes["deviceCount"] == {"int": 8}


@pytest.mark.process
def test_the_clis_take_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, ACME)
    run = [sys.executable, "-m", "neuron_dra"]
    out = subprocess.run([*run, "slices", "--catalog", str(path), "--instance-type", "acme1.24xlarge",
                          "--node-name", "n1"], capture_output=True, text=True, check=True)
    assert [d["capacity"]["memory"]["value"] for d in json.loads(out.stdout)[0]["spec"]["devices"]] == ["64Gi"] * 8
    out = subprocess.run([*run, "emulate", "--catalog", str(path), "acme1.24xlarge", str(tmp_path / "h")],
                         capture_output=True, text=True, check=True)
    assert discover(Path(out.stdout.strip()), catalog=load_catalog(path)).instance_type == "acme1.24xlarge"
    unknown = subprocess.run([*run, "slices", "--instance-type", "acme1.24xlarge", "--node-name", "n1"],
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "trn3.48xlarge" in unknown.stderr and "--catalog FILE" in unknown.stderr
    bad = write(tmp_path, {**ACME, "instanceTypes": {"acme1.24xlarge": {**ACME["instanceTypes"]["acme1.24xlarge"],
                                                                      "devices": "eight"}}}, "bad.yaml")
    refused = subprocess.run([*run, "slices", "--catalog", str(bad), "--instance-type", "acme1.24xlarge",
                              "--node-name", "n1"], capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "bad.yaml: instanceTypes[acme1.24xlarge].devices: 'eight': an integer from 1 to 127" in refused.stderr


def _types(entry: object, name: str = "x.big") -> dict[str, Any]:
    return {"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "instanceTypes": {name: entry}}


NEW = {"family": "trn3", "devices": 4, "topology": "all-to-all"}
# document -> (key path, shown value, what is allowed) the error must name
INVALID: list[tuple[object, str, str, str]] = [
    ({"apiVersion": "v1", "kind": "NeuronCatalog"}, "apiVersion", "'v1'", "neuron-dra/v1"),
    ({"apiVersion": "neuron-dra/v1"}, "kind", "(missing)", "NeuronCatalog"),
    ({**_types(NEW), "extra": 1}, "extra", "1", "allowed keys: apiVersion, kind, families, instanceTypes"),
    (_types({**NEW, "device": 4}), "instanceTypes[x.big].device", "4", "allowed keys of instanceTypes[x.big]"),
    (_types({**NEW, "devices": True}), "instanceTypes[x.big].devices", "True", "an integer from 1 to 127"),
    (_types({**NEW, "devices": 200}), "instanceTypes[x.big].devices", "200", "an integer from 1 to 127"),
    (_types({"family": "trn3", "devices": 4}), "instanceTypes[x.big].topology", "(missing)", "required"),
    (_types({**NEW, "topology": "mesh"}), "instanceTypes[x.big].topology", "'mesh'",
     "single, torus4x4, ring, all-to-all"),
    (_types({**NEW, "topology": "torus4x4"}), "instanceTypes[x.big].devices", "4", "16 with topology torus4x4"),
    (_types({**NEW, "topology": "single"}), "instanceTypes[x.big].devices", "4", "1 with topology single"),
    (_types({**NEW, "family": "trn9"}), "instanceTypes[x.big].family", "'trn9'", "a known family: trn1,"),
    (_types({"basedOn": "trn9.big"}), "instanceTypes[x.big].basedOn", "'trn9.big'", "a known instance type"),
    (_types(NEW, "Trn3_Big"), "instanceTypes[Trn3_Big]", "'Trn3_Big'", "an EC2 instance type name"),
    (_types({**NEW, "lnc": {"default": 3}}), "instanceTypes[x.big].lnc.default", "3", "1 or 2"),
    (_types({**NEW, "lnc": {"mode": 2}}), "instanceTypes[x.big].lnc.mode", "2", "supported, default"),
    (_types({**NEW, "family": "inf2", "lnc": {"default": 2}}), "instanceTypes[x.big].lnc.default", "2",
     "1 when LNC is not supported"),
    (_types({**NEW, "coresPerDevice": 3}), "instanceTypes[x.big].coresPerDevice", "3", "an even number of cores"),
    (_types({**NEW, "hbmGiB": -1}), "instanceTypes[x.big].hbmGiB", "-1", "an integer from 1 to 4096"),
    (_types({**NEW, "efaMap": ["0000:10:00.0"]}), "instanceTypes[x.big].efaMap", "['0000:10:00.0']",
     "exactly 4 addresses"),
    (_types({**NEW, "efaMap": ["cc:00"] * 4}), "instanceTypes[x.big].efaMap[0]", "'cc:00'", "a PCI address"),
    (_types({**NEW, "efaCount": 1, "efaMap": [f"0000:1{i}:00.0" for i in range(4)]}),
     "instanceTypes[x.big].efaCount", "1", "at least 4"),
    (_types({**NEW, "ultraServer": {"servers": 36}}), "instanceTypes[x.big].ultraServer.servers", "36", "2 or 4"),
    (_types({**NEW, "ultraServer": {"nodes": 4}}), "instanceTypes[x.big].ultraServer.nodes", "4", "servers"),
    (_types({**NEW, "capacityBlocks": "yes"}), "instanceTypes[x.big].capacityBlocks", "'yes'", "true or false"),
    (_types({"devices": 8}, "trn2.48xlarge"), "instanceTypes[trn2.48xlarge].efaMap", "(missing)",
     "an efaMap of 8 addresses"),
    ({"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "families": {"acme": {"deviceName": "Acme"}}},
     "families[acme].archType", "(missing)", "required for a new family"),
    ({"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog"}, "instanceTypes", "{}", "at least one"),
    (["a list"], "", "['a list']", "a mapping with keys apiVersion, kind"),
]


@pytest.mark.parametrize(("doc", "key", "value", "allowed"), INVALID,
                         ids=[f"{i}-{c[1]}" for i, c in enumerate(INVALID)])
def test_invalid_files_name_the_key_the_value_and_what_is_allowed(doc: object, key: str, value: str,
                                                                  allowed: str) -> None:
    with pytest.raises(CatalogFileError) as err:
        parse_catalog(doc, "f.yaml")
    assert err.value.key == key
    assert str(err.value).startswith(f"f.yaml: {key}: {value}: " if key else f"f.yaml: {value}: ")
    assert allowed in err.value.allowed


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CatalogFileError, match="readable catalog file"):
        load_catalog(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("instanceTypes: [\n", encoding="utf-8")
    with pytest.raises(CatalogFileError, match=r"valid YAML at line \d+"):
        load_catalog(broken)


@pytest.mark.process
def test_the_daemon_serves_an_own_type_from_the_env_catalog_and_refuses_without_it(tmp_path: Path) -> None:
    path = write(tmp_path, ACME)
    with short_dir() as base:
        dirs = DaemonDirs(base)
        root = emulate("acme1.24xlarge", base / "host", catalog=load_catalog(path))
        without = DaemonProcess(dirs, root)
        assert without.wait_exit() == 1
        assert "unknown Neuron instance type 'acme1.24xlarge'" in without.log() and "catalog file" in without.log()
        bad = DaemonProcess(dirs, root, env={"NEURON_DRA_CATALOG": str(tmp_path / "absent.yaml")})
        assert bad.wait_exit() == 1 and "catalog file:" in bad.log() and "absent.yaml" in bad.log()
        daemon = DaemonProcess(dirs, root, env={"NEURON_DRA_CATALOG": str(path)}).wait_ready()
        try:
            found = next(r for r in daemon.log_records() if r.get("msg") == "discovered host")
            assert found["instance_type"] == "acme1.24xlarge" and found["devices"] == 8
        finally:
            assert daemon.terminate() == 0


def test_the_daemonset_mounts_the_catalog_and_schedules_on_its_types() -> None:
    text = yaml.safe_dump(ACME)
    options = deploy.DriverDeployOptions(catalog_yaml=text)
    objs = {o["kind"]: o for o in deploy.manifests(options)}
    for obj in objs.values():
        kubeschema.validate(obj, "1.34", strict=True)
    assert objs["ConfigMap"]["data"] == {"catalog.yaml": text}
    pod = objs["DaemonSet"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NEURON_DRA_CATALOG"] == "/etc/neuron-dra/catalog.yaml"
    assert {"name": "catalog", "mountPath": "/etc/neuron-dra", "readOnly": True} in container["volumeMounts"]
    assert {"name": "catalog", "configMap": {"name": objs["ConfigMap"]["metadata"]["name"]}} in pod["spec"]["volumes"]
    assert "neuron-dra/catalog-sha256" in pod["metadata"]["annotations"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    types = terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert "acme1.24xlarge" in types and "trn3.48xlarge" in types
    # The daemon, given the DaemonSet's env, picks the file up.
    assert parse_options(["--node-name", "n"], env).catalog == Path("/etc/neuron-dra/catalog.yaml")
    assert "ConfigMap" not in {o["kind"] for o in deploy.manifests(deploy.DriverDeployOptions())}
    with pytest.raises(deploy.DeployOptionError, match="catalog_yaml"):
        deploy.DriverDeployOptions(catalog_yaml="kind: NeuronCatalog\n")
    with pytest.raises(deploy.DeployOptionError, match=r"acme1\.24xlarge"):
        deploy.DriverDeployOptions(instance_types=("acme1.24xlarge",))
    assert deploy.DriverDeployOptions(catalog_yaml=text, instance_types=("acme1.24xlarge",)).node_instance_types == (
        "acme1.24xlarge",)


HEADER = "apiVersion: neuron-dra/v1\nkind: NeuronCatalog\n"


def aliases(levels: int) -> str:
    """Anchors that each repeat the previous one nine times: 9**levels values from a few hundred bytes."""
    parts = ["&a0 [" + ", ".join(["x"] * 9) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


HOSTILE = [
    ("alias bomb", HEADER + "extra: " + aliases(9), "at most 100000 values with every alias expanded at line 3"),
    ("flow nesting", "[" * 10_000 + "]" * 10_000, "at most 64 levels of nested mappings and sequences at line 1"),
    ("block nesting", "".join(" " * i + "a:\n" for i in range(500)), "at most 64 levels of nested mappings"),
    ("too many aliases", HEADER + "x: &x 1\nextra: [" + ", ".join(["*x"] * 101) + "]\n", "at most 100 aliases"),
    ("4300-digit integer", HEADER + "instanceTypes:\n  x.big: {devices: " + "9" * 4300 + "}\n",
     "integers of at most 30 characters (this one has 4300) at line 4"),
    ("large file", HEADER + "#" * (1 << 20), "a file of at most 1048576 bytes"),
]


@pytest.mark.parametrize(("text", "allowed"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_files_are_refused_by_a_bound_in_a_short_message(tmp_path: Path, text: str, allowed: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogFileError) as err:
        load_catalog(path)
    assert allowed in err.value.allowed and len(str(err.value)) < 300, str(err.value)[:1000]


def test_the_echo_of_a_value_is_capped_even_when_aliases_make_it_huge(tmp_path: Path) -> None:
    """Within the bounds (75,000 values once expanded) the unknown key's value is still echoed in a few lines."""
    path = tmp_path / "aliases.yaml"
    path.write_text(HEADER + "extra: " + aliases(5) + "\n", encoding="utf-8")
    with pytest.raises(CatalogFileError) as err:
        load_catalog(path)
    assert err.value.key == "extra" and "unknown key" in err.value.allowed
    assert len(str(err.value)) < 600 and str(err.value).startswith(f"{path}: extra: [['x', 'x',")




@pytest.mark.parametrize(("field", "value", "shown"), [
    ("devices", 16.0, "16.0"), ("devices", True, "True"), ("efaCount", 4.0, "4.0"),
    ("ultraServer", {"servers": 2.0}, "2.0"), ("ultraServer", {"servers": True}, "True"),
])
def test_numbers_are_exactly_integers_not_floats_or_booleans(field: str, value: object, shown: str) -> None:
    entry = {"family": "trn3", "devices": 16, "topology": "torus4x4", field: value}
    with pytest.raises(CatalogFileError) as err:
        parse_catalog(_types(entry), "f.yaml")
    key = f"instanceTypes[x.big].{field}" + (".servers" if field == "ultraServer" else "")
    assert str(err.value).startswith(f"f.yaml: {key}: {shown}: ")


def test_a_yaml_float_tag_is_not_an_integer(tmp_path: Path) -> None:
    path = tmp_path / "float.yaml"
    path.write_text(HEADER + "instanceTypes:\n  x.big: {family: trn3, devices: 16, topology: torus4x4, "
                    "ultraServer: {servers: !!float 2}}\n", encoding="utf-8")
    with pytest.raises(CatalogFileError, match=r"ultraServer\.servers: 2\.0: 2 or 4"):
        load_catalog(path)


@pytest.mark.process
def test_the_daemon_refuses_a_hostile_catalog_with_a_reason_and_leaves_no_socket(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 10_000 + "]" * 10_000, encoding="utf-8")
    with short_dir() as base:
        dirs = DaemonDirs(base)
        root = emulate("trn2.48xlarge", base / "host")
        daemon = DaemonProcess(dirs, root, extra_args=["--catalog", str(path)])
        assert daemon.wait_exit() == 1
        log = daemon.log()
        assert "Traceback" not in log and "at most 64 levels of nested" in log, log[-2000:]
        sockets = [p for d in (dirs.plugins, dirs.registry) if d.exists() for p in d.rglob("*") if p.is_socket()]
        assert sockets == []
