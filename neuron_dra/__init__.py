"""neuron-dra: AWS Trainium on Amazon EKS as code, with Kubernetes Dynamic Resource Allocation.

Subpackages: `neuron_dra.driver` (the DRA kubelet plugin and the device model),
`neuron_dra.claim_templates` (typed ResourceClaimTemplates, checked before deploy),
`neuron_dra.components` (Pulumi components), `neuron_dra.localcluster` (a local control plane).
"""

__version__ = "0.1.0"

# The one folder <-> namespace mapping: each subpackage of `neuron_dra` is a symlink to a top-level folder of the
# repository (`neuron_dra/driver -> ../driver`), so a checkout is worked on folder by folder and installed as one
# namespace. tests/test_layout.py checks the links; a clone needs symlinks (git's core.symlinks on Windows).
PARTS: dict[str, str] = {
    "driver": "driver",
    "claim_templates": "claim_templates",
    "components": "components",
    "localcluster": "localcluster",
}
