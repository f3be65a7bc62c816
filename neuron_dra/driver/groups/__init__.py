"""The UltraServer group controller: a cluster-level Deployment (one replica, leader election on a Lease) that
publishes each UltraServer as one schedulable group device (docs/ultraserver.md). It runs from the driver's image:
`python -m neuron_dra.driver.groups` (main.py). The slices it writes are rendered by driver/model/ultraserver.py."""
