"""The generic kubelet-plugin layer under the Neuron daemon: gRPC serving on unix sockets, plugin registration,
rolling-update instances and their lock, the API client with its deadline and rate limit, atomic files, logs,
signals and the generated protocol code. Nothing here names Neuron hardware; an import contract keeps the layer
free of the daemon (pyproject.toml)."""
