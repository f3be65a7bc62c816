"""The kubelet plugin daemon: entry point, gRPC services (registration, DRA, health), prepare/unprepare state, the
checkpoint, CDI specs, the ResourceSlice publisher, device health and metrics."""
