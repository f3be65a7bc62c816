"""The Neuron kubelet plugin daemon on the kubelet-plugin helper (driver/kubeletplugin, imported through its face
only): the entry (main, the one lazy-import boundary), its options, the parts brought up in order (driver),
the claims this node holds (claims/), device health (health/), metrics and attribution (observability/), the
liveness probe (liveness), ResourceSlices (publisher) and crash points for tests (failpoints)."""
