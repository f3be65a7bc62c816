"""Device health: the sysfs counters watched (monitor), kubelet's health stream (stream), and taints, events and
metrics for unhealthy devices (reporting). The daemon's own liveness probe is daemon/liveness.py."""
