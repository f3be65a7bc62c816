"""The package's version, written here only: pyproject.toml reads it (`[tool.setuptools.dynamic]`), so the
installed metadata (`importlib.metadata`) says the same, and the driver image, which runs from PYTHONPATH without
metadata, needs nothing else."""

VERSION = "0.1.0"
