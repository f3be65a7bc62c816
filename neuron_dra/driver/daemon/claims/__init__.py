"""The claims this node holds: prepare and unprepare (state), the ResourceClaims as prepare reads them
(allocation), their CDI specs (cdi) and the checkpoint that records them (checkpoint)."""
