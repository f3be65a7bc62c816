"""neuron-dra: AWS Trainium on Amazon EKS as code, with Kubernetes Dynamic Resource Allocation.

Subpackages: `neuron_dra.driver` (the DRA kubelet plugin and the device model),
`neuron_dra.claim_templates` (typed ResourceClaimTemplates, checked before deploy),
`neuron_dra.components` (Pulumi components), `neuron_dra.localcluster` (a local control plane),
`neuron_dra.cli` (the `neuron-dra` command).
"""

from neuron_dra.driver.model.version import VERSION as __version__

__all__ = ["__version__"]
