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

# The router's hot units compiled with mypyc into build/compiled/ (sdk/compiled.py,
# build_units.py; docs/performance.md "Fewer objects per publish, and mypyc"), again
# whenever a source changes. Without a C compiler the build fails and the pure-Python
# modules run.
COMPILED := build/compiled/manifest.json

$(COMPILED): $(STAMP) $(wildcard sdk/*.py broker/*.py broker/router/*.py workers/*.py)
	mkdir -p build
	$(BIN)/python build_units.py > build/units.log 2>&1 || \
		echo "mypyc build failed (build/units.log): the pure-Python modules run"

install: $(STAMP) $(COMPILED)

# HTTP=HOST:PORT: the gateway's address (the Procfile's default: 127.0.0.1:7480).
run: install
	RELAY_HOME=$(HOME_DIR) PATH=$(CURDIR)/$(BIN):$$PATH $(if $(HTTP),RELAY_HTTP_LISTEN=$(HTTP)) \
		$(BIN)/honcho start

# The Node.js and C clients: Debian -dev packages, npm ci, the C build (clients/setup.sh).
clients:
	sh clients/setup.sh

# Debian's chromium, which the console's browser test drives (edges/setup-browser.sh).
browser:
	sh edges/setup-browser.sh

# Lint first: a lint or type error fails `make test`, and so CI (.ci/run). The suite
# runs the compiled units, and refuses to start without a current build: a build that
# failed would otherwise leave the compiled path untested while every test passed. The
# compiled units' own tests run again as pure Python (RELAY_PURE=1), the fallback every
# install without a compiler runs.
test: lint clients browser install
	@$(BIN)/python -c 'import sys; from sdk import compiled; sys.exit(0 if compiled.in_use() else \
		"the mypyc build is missing or stale (build/units.log): make test runs it, so it must build")'
	$(BIN)/pytest -n auto --dist loadfile
	RELAY_PURE=1 $(BIN)/pytest -n auto --dist loadfile $(PURE_TESTS)

PURE_TESTS := tests/test_compiled.py tests/test_subjects.py tests/test_sublist.py \
	tests/test_budget.py tests/test_publish_plan.py tests/test_reliability_policies.py \
	tests/test_reliability_wiring.py tests/test_rules.py tests/test_ids.py tests/test_types.py \
	tests/test_consumers.py tests/test_federation_units.py tests/test_broker_messaging.py \
	tests/test_writer_protocol.py tests/test_sockets.py tests/test_wire_limits.py \
	tests/test_maildir.py tests/test_index.py tests/test_writer_claims.py \
	tests/test_sdk_transport.py tests/test_sdk_client.py

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

bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
