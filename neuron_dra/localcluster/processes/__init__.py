"""The local cluster's processes: how each is spawned, recorded and stopped (procs.py), restarted with backoff
(restarting.py), and what its containers logged (podlogs.py)."""
