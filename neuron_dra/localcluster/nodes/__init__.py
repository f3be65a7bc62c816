"""An emulated Neuron node: which nodes a cluster has (topology.py) and their Node objects (labels.py), the real
kubelet (kubelet.py) with the fake CRI runtime (fakeruntime.py) or containerd in the node's namespaces
(containerd.py, nodens.py, containerd_node.py, images.py), what every node agent does (nodeagent.py), the
NetworkPolicy enforcer (netpol.py) and the emulated EFA driver (efa_emulator.py)."""
