SHELL := /bin/bash
# mrc: the two commands of the README are `make demo` and `make test`; both set up from nothing.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test lint typecheck unit bench clean

setup:
	@bash deploy/setup.sh

demo: setup
	@bash deploy/demo.sh

test: setup lint typecheck
	$(PY) -m pytest tests

unit: setup
	$(PY) -m pytest tests/unit -q

lint: setup
	$(PY) -m ruff check .

# mypy cannot follow setuptools' editable finder, so it checks a tree of symlinks laid out as the
# installed package (dataplane/ -> mrc/dataplane, ctl/ -> mrc/ctl); paths are mapped back in the report.
typecheck: setup
	@rm -rf build/typing && mkdir -p build/typing
	@cp -rs "$(CURDIR)/mrc" build/typing/mrc && cp -rs "$(CURDIR)/dataplane" build/typing/mrc/dataplane \
	  && cp -rs "$(CURDIR)/ctl" build/typing/mrc/ctl && cp -rs "$(CURDIR)/tests" build/typing/tests \
	  && cp -rs "$(CURDIR)/bench" build/typing/bench
	@cd build/typing && "$(CURDIR)/$(PY)" -m mypy --config-file "$(CURDIR)/pyproject.toml" mrc tests bench \
	  | sed -e 's#^mrc/dataplane/#dataplane/#' -e 's#^mrc/ctl/#ctl/#'; exit $${PIPESTATUS[0]}

bench: setup
	$(PY) bench/wire.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache mrc/transport/_fastc*.so mrc/sim/_simc*.so
