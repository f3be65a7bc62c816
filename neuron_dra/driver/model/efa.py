"""AWS's EFA DRA driver (DRANET) as EKS installs it: its driver name, DeviceClass and the attributes of its devices.

The one home of these facts for the claim checks (claim_templates/drivers.py), the components that install the
driver (components/efa_driver.py) and the local cluster's EFA emulator (localcluster/nodes/efa_emulator.py), so the
DeviceClass a template names selects, in every one of them, the devices real DRANET publishes
(docs/efa-dra-driver.md §2-3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuron_dra.driver.model.k8s_names import device_class_manifest
from neuron_dra.driver.model.slices import AWS_DOMAIN, K8S_DOMAIN, Pool

EFA_DRIVER = "dra.net"  # DRANET's driver name and attribute domain
EFA_DEVICE_CLASS = "efa.networking.k8s.aws"  # the chart's deviceClass.name
EFA_PCI_DEVICE = "Elastic Fabric Adapter (EFA)"  # dra.net/pciDevice of an EFA (PCI device name)
EFA_PCI_VENDOR = "Amazon.com, Inc."


def efa_device_class_expression(driver: str = EFA_DRIVER) -> str:
    """The CEL selector of the chart's DeviceClass (stable/aws-dranet/templates/deviceclass.yaml), for `driver`."""
    return f'device.driver == "{driver}" &&\ndevice.attributes["{driver}"].pciDevice == \'{EFA_PCI_DEVICE}\'\n'


def efa_device_class(name: str = EFA_DEVICE_CLASS, driver: str = EFA_DRIVER) -> dict[str, Any]:
    """The DeviceClass the chart creates: `driver`'s devices whose PCI device is an EFA."""
    return device_class_manifest(name, driver, expression=efa_device_class_expression(driver))


def efa_device_attributes(bdf: str, groups: Mapping[str, Mapping[str, Any]],
                          driver: str = EFA_DRIVER) -> dict[str, dict[str, Any]]:
    """The attributes DRANET publishes for the EFA at PCI address `bdf`, as far as claims use them: its PCI
    identity and RDMA flag in `driver`'s domain, the PCIe root, and the `resource.aws.com/devicegroup*_id` values
    of the Neuron devices wired to it (`groups`, keyed by attribute name), so one matchAttribute aligns both."""
    domain, bus = bdf.split(":")[0], bdf.split(":")[1]
    return {
        f"{driver}/pciAddress": {"string": bdf},
        f"{driver}/pciDevice": {"string": EFA_PCI_DEVICE},
        f"{driver}/pciVendor": {"string": EFA_PCI_VENDOR},
        f"{driver}/rdma": {"bool": True},
        f"{K8S_DOMAIN}/pcieRoot": {"string": f"pci{domain}:{bus}"},
        **{k: dict(v) for k, v in groups.items() if k.startswith(f"{AWS_DOMAIN}/devicegroup")},
    }


def efa_driver_devices(pool: Pool, driver: str = EFA_DRIVER) -> list[dict[str, Any]]:
    """The devices DRANET publishes on the node of `pool` (the Neuron driver's), as the claim checks and the local
    cluster model them: one per EFA wired to Neuron devices, named efa-N in BDF order."""
    seen: dict[str, dict[str, Any]] = {}
    for dev in pool.devices:
        bdf = dev.attributes.get(f"{AWS_DOMAIN}/devicegroup1_id")
        if bdf is None or bdf["string"] in seen:
            continue
        seen[bdf["string"]] = {"attributes": efa_device_attributes(bdf["string"], dev.attributes, driver)}
    return [{"name": f"efa-{i}", **d} for i, (_, d) in enumerate(sorted(seen.items()))]
