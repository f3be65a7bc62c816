"""Which DRA drivers and DeviceClasses the templates and the checks refer to.

Defaults are the bundled driver's (`neuron.aws.com`, the same names AWS's Neuron DRA driver uses, so the
same templates serve clusters running AWS's driver) and AWS's EFA driver's (`dra.net`, DeviceClass
`efa.networking.k8s.aws`, from driver/model/efa.py, the names EKS's chart installs); all are configurable. The
Neuron DeviceClasses left empty follow the driver name as the driver's deployment names them
(driver/deploy/manifests.py: the driver name, core_device_class_for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_dra.claim_templates.names import check_dns_subdomain
from neuron_dra.driver.deploy import DEFAULT_CORE_DEVICE_CLASS, core_device_class_for, device_class_selector
from neuron_dra.driver.model.efa import EFA_DEVICE_CLASS, EFA_DRIVER, efa_device_class
from neuron_dra.driver.model.k8s_names import DEFAULT_DRIVER_NAME, device_class_manifest

DEFAULT_NEURON_CLASS = DEFAULT_DRIVER_NAME  # AWS names the DeviceClass after the driver
DEFAULT_NEURON_CORE_CLASS = DEFAULT_CORE_DEVICE_CLASS  # NeuronCores (docs/neuron-cores.md §4)
DEFAULT_EFA_DRIVER = EFA_DRIVER
DEFAULT_EFA_CLASS = EFA_DEVICE_CLASS


@dataclass(frozen=True)
class Drivers:
    neuron_driver: str = DEFAULT_DRIVER_NAME
    neuron_class: str = ""  # "": the driver name
    efa_driver: str = DEFAULT_EFA_DRIVER
    efa_class: str = DEFAULT_EFA_CLASS
    neuron_core_class: str = ""  # "": core_device_class_for(neuron_driver)

    def __post_init__(self) -> None:
        if self.neuron_class == "":
            object.__setattr__(self, "neuron_class", self.neuron_driver)
        if self.neuron_core_class == "" and isinstance(self.neuron_driver, str):
            object.__setattr__(self, "neuron_core_class", core_device_class_for(self.neuron_driver))
        for name in ("neuron_driver", "neuron_class", "efa_driver", "efa_class", "neuron_core_class"):
            check_dns_subdomain(f"Drivers.{name}", getattr(self, name))

    def device_classes(self) -> list[dict[str, Any]]:
        """The DeviceClasses the drivers install: the bundled driver's two (whole devices, NeuronCores; the
        selectors of driver/deploy/manifests.py) and the EFA driver's (the chart's selector, driver/model/efa.py)."""
        return [device_class_manifest(self.neuron_class, self.neuron_driver,
                                      expression=device_class_selector(self.neuron_driver, cores=False)),
                device_class_manifest(self.neuron_core_class, self.neuron_driver,
                                      expression=device_class_selector(self.neuron_driver, cores=True)),
                efa_device_class(self.efa_class, self.efa_driver)]


DEFAULT_DRIVERS = Drivers()
