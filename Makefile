# One entry point for people and CI. `make demo` and `make test` install what they need.
SHELL := /bin/bash
PROFILE ?= kwok
VENV := .venv
PY := $(VENV)/bin/python
LOCALKUBE := python3 localkube/cluster.py

.PHONY: demo test test-unit lint manifests venv cluster-up cluster-down cluster-status cluster-kubeconfig cluster-reset binaries images
# What `make binaries` builds (localkube/build-binaries.sh): components or profiles (kwok, full, all).
BINARIES ?= all
# `make images`: where the images are named and whether they are pushed (images/build.sh, docs/install.md).
REGISTRY ?=
PUSH ?= 0
IMAGES ?= all

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 is missing: apt-get install -y python3 python3-venv"; exit 1; }
	@python3 -c 'import ensurepip' 2>/dev/null || apt-get install -y -qq python3-venv >/dev/null
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	@touch $@

demo: venv
	hack/demo.sh

binaries:
	localkube/build-binaries.sh $(BINARIES)

# Every image from its Dockerfile with buildah: `make images REGISTRY=registry.example.com/pg PUSH=1`.
images:
	@command -v buildah >/dev/null || apt-get install -y -qq --no-install-recommends buildah runc debootstrap >/dev/null
	REGISTRY=$(REGISTRY) PUSH=$(PUSH) images/build.sh $(IMAGES)

cluster-up:
	@$(LOCALKUBE) up $(PROFILE)

cluster-down:
	@$(LOCALKUBE) down

cluster-reset:
	@$(LOCALKUBE) reset

cluster-status:
	@$(LOCALKUBE) status

cluster-kubeconfig:
	@$(LOCALKUBE) kubeconfig

lint: venv
	$(VENV)/bin/ruff check src tests bench localkube
	$(VENV)/bin/ruff format --check src tests bench localkube
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q tests/unit/test_import_layers.py tests/unit/test_module_size.py

manifests: venv
	$(PY) -m pg_operator.api.manifests

test-unit: venv
	$(PY) -m pytest tests/unit -q

# The whole suite: lint, then two pytest sessions at once (tests/suite.py): unit → e2e (full profile) on
# this machine's network, and the integration tier (kwok profile) in a private network namespace. The
# fixtures start the profile each tier needs and stop what they started.
test: venv binaries
	@command -v promtool >/dev/null || apt-get install -y -qq --no-install-recommends prometheus >/dev/null  # rule tests, e2e monitoring
	@command -v buildah >/dev/null || apt-get install -y -qq --no-install-recommends buildah runc debootstrap >/dev/null  # the image build test
	$(MAKE) -s lint
	$(PY) tests/suite.py

