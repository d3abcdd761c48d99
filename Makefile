# Two commands do all the set-up on a fresh machine:
#   make serve   install into .venv and start the proxy on config.yaml (in-memory store)
#   make test    install into .venv, then lint, type-check and run the whole test suite
# and, where Docker runs, `make docker-smoke` builds the image and proves it serves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench docker-smoke lock

# Every dependency comes hash-pinned from the lock (requirements/, made by requirements/lock);
# the project itself then goes in with no dependencies of its own and its pinned build backend.
$(STAMP): pyproject.toml requirements/dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/compaction-proxy serve --config config.yaml

lint: $(STAMP)
	$(BIN)/ruff check proxy policies tests bench
	$(BIN)/ruff format --check proxy policies tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

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

docker-smoke: $(STAMP)
	PYTHON=$(BIN)/python scripts/docker-smoke.sh

lock:
	requirements/lock
