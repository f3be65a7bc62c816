"""The package's version: pyproject.toml's, read from the installed metadata (the driver image writes that
metadata too, see driver/Dockerfile), so no copy of the number is kept in the code."""

from importlib.metadata import version

VERSION = version("neuron-dra")
