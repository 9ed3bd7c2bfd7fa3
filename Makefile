# mrc: the two commands of the README are `make demo` and `make test`; both set up from nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup test lint typecheck unit bench clean

setup:
	@bash deploy/setup.sh

test: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest tests

unit: setup
	$(PY) -m pytest tests/unit -q

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check . || true

typecheck: setup
	$(PY) -m mypy

bench: setup
	$(PY) bench/wire.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
