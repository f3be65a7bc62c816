"""The local cluster: a real control plane with emulated Neuron nodes on one machine (`neuron-dra cluster`,
`neuron-dra demo`).

From the top down, each part importing only those below it (the import contract in pyproject.toml):

- demo/          `neuron-dra demo`: workloads on a running cluster, the outcome table and topology pictures
- cluster.py     `cluster up|down`: the supervisor started detached, waited for, stopped
- supervisor.py  the one process that owns the control plane and every emulated node
- nodes/         an emulated node: topology, kubelet, fake runtime or containerd in its namespaces, images,
                 NetworkPolicy, the emulated EFA driver
- controlplane/  etcd, kube-apiserver, controller-manager, scheduler; their PKI and profiles; how they reach
                 kubelets; server-side apply; Prometheus
- build.py       the binaries built from the Go module proxy at the versions go/*/go.mod pin (BUILD.md)
- processes/     how every process is spawned, restarted and stopped, and containers' logs
- hostreqs.py, cachedir.py   what the host needs beyond pip; where builds are cached
"""
