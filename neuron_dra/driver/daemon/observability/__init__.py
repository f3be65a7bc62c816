"""What the daemon shows about itself: Prometheus metrics (metrics), which pod holds which device
(attribution) and the pods of shared claims (consumers)."""
