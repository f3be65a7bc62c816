"""The kubelet-plugin layer's files: generated gRPC code in sync with the protos and the wire contract, atomic
writes, the allocator controls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_dra.driver.kubeletplugin import _protogen as protogen
from neuron_dra.driver.kubeletplugin._atomicfile import write_atomic
from neuron_dra.driver.kubeletplugin._generated import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    grpc_health_v1_pb2,
    pluginregistration_pb2,
)

# --- generated code --------------------------------------------------------------------------------------------


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    committed = {p.name: p.read_bytes() for p in protogen.GENERATED_DIR.iterdir() if p.is_file()}
    fresh = {p.name: p.read_bytes() for p in written}
    assert sorted(fresh) == sorted(committed), "files differ: run python -m neuron_dra.driver.kubeletplugin._protogen"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"stale generated code {stale}: run python -m neuron_dra.driver.kubeletplugin._protogen"


def fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_wire_contract_of_the_registration_service() -> None:
    svc = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert svc.full_name == "pluginregistration.Registration"
    assert sorted(m.name for m in svc.methods) == ["GetInfo", "NotifyRegistrationStatus"]
    assert fields(pluginregistration_pb2.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3,
                                                         "supported_versions": 4}
    assert fields(pluginregistration_pb2.RegistrationStatus) == {"plugin_registered": 1, "error": 2}


@pytest.mark.parametrize(("module", "package", "share_id"), [
    (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", True),
    (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1", False),
])
def test_wire_contract_of_the_dra_service(module: object, package: str, share_id: bool) -> None:
    descriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    svc = descriptor.services_by_name["DRAPlugin"]
    assert svc.full_name == f"{package}.DRAPlugin"
    assert sorted(m.name for m in svc.methods) == ["NodePrepareResources", "NodeUnprepareResources"]
    m = descriptor.message_types_by_name
    device = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    if share_id:
        device["share_id"] = 5
    assert {f.name: f.number for f in m["Device"].fields} == device
    assert {f.name: f.number for f in m["Claim"].fields} == {"namespace": 1, "uid": 2, "name": 3}
    assert {f.name: f.number for f in m["NodePrepareResourceResponse"].fields} == {"devices": 1, "error": 2}
    assert {f.name: f.number for f in m["NodeUnprepareResourceResponse"].fields} == {"error": 1}
    assert m["NodePrepareResourcesResponse"].fields_by_name["claims"].message_type.GetOptions().map_entry


def test_health_protocol_is_grpc_health_v1() -> None:
    svc = grpc_health_v1_pb2.DESCRIPTOR.services_by_name["Health"]
    assert svc.full_name == "grpc.health.v1.Health"
    assert grpc_health_v1_pb2.HealthCheckResponse.SERVING == 1
    assert grpc_health_v1_pb2.HealthCheckResponse.NOT_SERVING == 2


# --- files ----------------------------------------------------------------------------------------------------


def test_atomic_write_leaves_old_content_when_interrupted(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_atomic(target, b"old")

    def boom() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, b"new", before_rename=boom)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.process
def test_memory_controls_apply_on_this_glibc() -> None:
    # In a child process: limiting arenas changes the allocator of the process that calls it.
    code = ("from neuron_dra.driver.kubeletplugin import _memory as memory; import sys; "
            "sys.exit(0 if memory.limit_arenas() else 1)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
