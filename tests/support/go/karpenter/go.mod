// Wrapper module that pins Karpenter's released modules; nothing is built from it. The local control plane
// installs the CustomResourceDefinitions these releases ship (tests/support/karpenter.py): the AWS provider's
// pkg/apis/crds (what its karpenter-crd chart installs) and, for the record, the core module it requires.
// Both releases declare go 1.26.9, newer than this toolchain; their zips are only read, never compiled, so
// go.sum's hashes are checked by tests/support/karpenter.py itself.
module neuron-dra/tests/support/go/karpenter

go 1.26.0

require (
	github.com/aws/karpenter-provider-aws v1.15.0
	sigs.k8s.io/karpenter v1.15.0
)
