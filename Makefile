# The two commands: `make run` and `make test`. Both create .venv and install first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOME_DIR ?= $(or $(RELAY_HOME),$(HOME)/.dork/relay)
STAMP := $(VENV)/.installed

.PHONY: run test lint bench install clean clients browser soak soak-ledger

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark,edges,federation]'
	touch $(STAMP)

install: $(STAMP)

# HTTP=HOST:PORT: the gateway's address (the Procfile's default: 127.0.0.1:7480).
run: $(STAMP)
	RELAY_HOME=$(HOME_DIR) PATH=$(CURDIR)/$(BIN):$$PATH $(if $(HTTP),RELAY_HTTP_LISTEN=$(HTTP)) \
		$(BIN)/honcho start

# The Node.js and C clients: Debian -dev packages, npm ci, the C build (clients/setup.sh).
clients:
	sh clients/setup.sh

# Debian's chromium, which the console's browser test drives (edges/setup-browser.sh).
browser:
	sh edges/setup-browser.sh

# Lint first: a lint or type error fails `make test`, and so CI (.ci/run).
test: lint clients browser
	$(BIN)/pytest -n auto --dist loadfile

# The model test of delivery for long (docs/testing.md): DURATION seconds (default 600)
# or STEPS steps, JOBS rounds at a time; prints sequences, steps and failures at the end.
soak: $(STAMP)
	$(BIN)/python -m tests.model.soak

# The delivery ledger against its model, in process (tests/test_ledger_model.py):
# EXAMPLES sequences (default 50,000, about 15 minutes).
soak-ledger: $(STAMP)
	RELAY_LEDGER_EXAMPLES=$(or $(EXAMPLES),50000) $(BIN)/pytest -s -q -p no:cacheprovider \
		--timeout=0 tests/test_ledger_model.py

# ruff's rules and formatting over the tree; mypy over sdk/ (pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
