"""The device model: the hardware catalog, host discovery and emulation, the ResourceSlices and NeuronCore
partitions the driver publishes, and the opaque configs it accepts. claim_templates and components import this."""
