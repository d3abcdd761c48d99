# Two commands do all the set-up on a fresh machine:
#   make serve   install into .venv and start the proxy on config.yaml (in-memory store)
#   make test    install into .venv, then lint, type-check and run the whole test suite
# and, where Docker runs, `make docker-smoke` builds the image and proves it serves;
# `make agents-e2e` runs the real Codex CLI and Claude Code through it (docs/agents-e2e.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# make serve CONFIG=my.yaml: another config file
CONFIG ?= config.yaml

.PHONY: serve test test-quick test-docker lint bench docker-smoke agents-e2e lock

# Every dependency comes hash-pinned from the lock (requirements/, made by requirements/lock);
# the project itself then goes in with no dependencies of its own and its pinned build backend.
# Serving needs only the runtime pins; the tests add the dev pins (the same versions) on top.
$(RUNTIME): pyproject.toml requirements/runtime.txt requirements/build.txt
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "compaction-proxy needs Python 3.11 or later: make PY=python3.11 ..." >&2; exit 1; }
	@$(PY) -m venv $(VENV) || { echo "python3 -m venv failed: on Debian/Ubuntu, apt install python3-venv (or python3.11-venv)" >&2; exit 1; }
	$(BIN)/pip install -q --require-hashes -r requirements/runtime.txt -r requirements/build.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) requirements/dev.txt
	$(BIN)/pip install -q --require-hashes -r requirements/dev.txt
	touch $(STAMP)

serve: $(RUNTIME)
	$(BIN)/compaction-proxy serve --config $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check proxy policies tests bench
	$(BIN)/ruff format --check proxy policies tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

# While working: all but the Redis topologies, litellm and the subprocesses (make test runs all).
test-quick: $(STAMP)
	$(BIN)/pytest -m "not (cluster or sentinel or tls or litellm or subprocess or docker)"

# The checks that need Docker Compose, which make test leaves out.
test-docker: $(STAMP)
	$(BIN)/pytest -n 0 -m docker

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/savings.py
	$(BIN)/python bench/sessions.py
	$(BIN)/python bench/litellm_route.py
	$(BIN)/python bench/anthropic_cache.py
	$(BIN)/python bench/retention.py
	$(BIN)/python bench/headroom.py
	$(BIN)/python bench/summaries.py
	$(BIN)/python bench/loop_summaries.py

docker-smoke: $(STAMP)
	PYTHON=$(BIN)/python scripts/docker-smoke.sh

agents-e2e: $(STAMP)
	PYTHON=$(BIN)/python scripts/agents-e2e.sh $(ARGS)

lock:
	requirements/lock
