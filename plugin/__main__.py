"""Entry point of the neuron-dra plugin package: serve the components (neuron_dra/components/provider.py)."""

from neuron_dra.components.provider import main

if __name__ == "__main__":
    main()
