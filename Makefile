# Named commands for developers and CI (.ci/run calls `make lint` and `make test`).
# `make test` is the README's test command; `make test-fast` leaves out what needs Go, a control plane,
# the Pulumi engine or more than a few seconds (pytest markers declared in pyproject.toml).

PYTHON ?= python3
# Tagged with the package version (neuron_dra/driver/model/version.py, the one place it is written).
VERSION := $(shell sed -n 's/^VERSION = "\(.*\)"$$/\1/p' neuron_dra/driver/model/version.py)
IMAGE ?= neuron-dra-driver:$(VERSION)
FAST := not cluster and not gobuild and not pulumi_engine and not slow
# The inner loop: the fast tests minus those that start the daemon or a CLI as a process (`process` marker), on
# every core (pytest-xdist, one test file per worker at a time so a file's module fixtures and lazy imports are paid
# once); pytest's cache provider off so parallel worktrees do not share state; bytecode written even where
# PYTHONDONTWRITEBYTECODE is set (__pycache__ is ignored by git): compiling the package and rewriting the tests'
# asserts again on every run is seconds of CPU.
UNIT := $(FAST) and not process
PYTEST_UNIT_SERIAL := PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q -p no:cacheprovider -m "$(UNIT)"
PYTEST_UNIT := $(PYTEST_UNIT_SERIAL) -n auto --dist loadfile

.PHONY: help install test test-fast test-unit test-driver test-claims test-components test-localcluster test-bench test-attacks \
	lint protos image-manifest \
	image demo

help:
	@echo "make install    pip install -r requirements.txt (everything, this repository editable)"
	@echo "make test-unit  the inner loop: fast tests that start no process (tests/), under a minute"
	@echo "make test-driver / test-claims / test-components / test-localcluster / test-bench   the same, for one part"
	@echo "make test-attacks  the attack suites on the daemon (bounded, loopback only)"
	@echo "make test-fast  tests without Go, a control plane, the Pulumi engine or slow tests"
	@echo "make test       every test: $(PYTHON) -m pytest -q (the README's command, what CI runs)"
	@echo "make lint       ruff, mypy (package, tests, bench), import contracts"
	@echo "make protos     regenerate driver/kubeletplugin/_generated from driver/kubeletplugin/proto"
	@echo "make image-manifest  rewrite neuron_dra/driver/image-files.txt (the image's allowlist) from git ls-files"
	@echo "make image      build the driver image: docker build as $(IMAGE), or without Docker buildah (an OCI archive)"
	@echo "make demo       neuron-dra demo: local cluster, emulated nodes, driver, workloads"

install:
	$(PYTHON) -m pip install -r requirements.txt

test-unit:
	$(PYTEST_UNIT) tests

test-driver:
	$(PYTEST_UNIT) tests/driver

test-claims:
	$(PYTEST_UNIT) tests/claim_templates

test-components:
	$(PYTEST_UNIT) tests/components

# Serial: a few seconds of tests, less than starting the workers costs.
test-localcluster:
	$(PYTEST_UNIT_SERIAL) tests/localcluster

# The benchmarks' own tests (their harnesses and tables, on quick runs).
test-bench:
	$(PYTEST_UNIT_SERIAL) tests/bench

# The attack suites (rounds 1-3): bounded, loopback only; part of `make test` too.
test-attacks:
	$(PYTHON) -m pytest -q -p no:cacheprovider -m attacks tests

test-fast:
	$(PYTHON) -m pytest -q -m "$(FAST)"

test:
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	$(PYTHON) -m mypy tests bench
	lint-imports

protos:
	$(PYTHON) -m neuron_dra.driver.kubeletplugin._protogen

image-manifest:
	$(PYTHON) -m tests.support.image_manifest

image:
	@if command -v docker >/dev/null 2>&1; then docker build -f neuron_dra/driver/Dockerfile -t $(IMAGE) .; \
	else $(PYTHON) -m neuron_dra.localcluster.nodes.images driver; fi

demo:
	$(PYTHON) -m neuron_dra demo
