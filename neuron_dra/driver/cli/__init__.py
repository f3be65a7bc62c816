"""The driver's commands over the device model: `neuron-dra slices`, `emulate`, `emulate-fault`."""
