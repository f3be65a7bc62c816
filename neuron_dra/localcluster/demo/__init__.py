"""`neuron-dra demo` on a local cluster: the run (run.py), its workloads (workloads.py), the device-health stage
(health.py), the outcome table (report.py) and the topology pictures (topology_view.py)."""
