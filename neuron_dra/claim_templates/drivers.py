"""Which DRA drivers and DeviceClasses the templates and the checks refer to.

Defaults are the bundled driver's (`neuron.aws.com`, the same names AWS's Neuron DRA driver uses, so the
same templates serve clusters running AWS's driver) and AWS's EFA driver's (`dra.net`, DeviceClass
`efa.networking.k8s.aws`, from driver/model/efa.py, the names EKS's chart installs); all are configurable. The
Neuron DeviceClasses left empty follow the driver name by the rule the driver's deployment names them with
(`neuron_dra.driver.model.k8s_names.device_class_names`). A ClaimTemplate given no Drivers follows the driver it is
deployed with: the `ClaimTemplates` component renders it with that driver's names (`ClaimTemplate.for_drivers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_dra.claim_templates.names import check_dns_subdomain
from neuron_dra.driver.model.efa import EFA_DEVICE_CLASS, EFA_DRIVER, efa_device_class
from neuron_dra.driver.model.k8s_names import (
    DEFAULT_CORE_DEVICE_CLASS,
    DEFAULT_DRIVER_NAME,
    DeviceClassNames,
    device_class_manifest,
    device_class_names,
    device_class_selector,
)

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
    neuron_core_class: str = ""  # "": derived from neuron_driver (device_class_names)

    def __post_init__(self) -> None:
        if isinstance(self.neuron_driver, str):
            names = device_class_names(self.neuron_driver, self.neuron_class or None, self.neuron_core_class)
            object.__setattr__(self, "neuron_class", names.device_class)
            object.__setattr__(self, "neuron_core_class", names.core_device_class)
        for name in ("neuron_driver", "neuron_class", "efa_driver", "efa_class", "neuron_core_class"):
            check_dns_subdomain(f"Drivers.{name}", getattr(self, name))

    @classmethod
    def of(cls, names: DeviceClassNames, efa_driver: str = DEFAULT_EFA_DRIVER,
           efa_class: str = DEFAULT_EFA_CLASS) -> Drivers:
        """The drivers of a deployment: its driver name and DeviceClass names (DriverDeployOptions.class_names)."""
        return cls(neuron_driver=names.driver_name, neuron_class=names.device_class, efa_driver=efa_driver,
                   efa_class=efa_class, neuron_core_class=names.core_device_class)

    def device_classes(self) -> list[dict[str, Any]]:
        """The DeviceClasses the drivers install: the bundled driver's two (whole devices, NeuronCores; the
        selectors of driver/model/k8s_names.py) and the EFA driver's (the chart's selector, driver/model/efa.py)."""
        return [device_class_manifest(self.neuron_class, self.neuron_driver,
                                      expression=device_class_selector(self.neuron_driver, cores=False)),
                device_class_manifest(self.neuron_core_class, self.neuron_driver,
                                      expression=device_class_selector(self.neuron_driver, cores=True)),
                efa_device_class(self.efa_class, self.efa_driver)]


DEFAULT_DRIVERS = Drivers()
