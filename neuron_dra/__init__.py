"""neuron-dra: AWS Trainium on Amazon EKS as code, with Kubernetes Dynamic Resource Allocation.

Subpackages: `neuron_dra.driver` (the DRA kubelet plugin and the device model),
`neuron_dra.claim_templates` (typed ResourceClaimTemplates, checked before deploy),
`neuron_dra.components` (Pulumi components), `neuron_dra.localcluster` (a local control plane).
"""

__version__ = "0.1.0"
