# Two commands do all the set-up on a fresh Debian machine (Python 3.11, root, no GPU):
#   make run    installs what is missing, then runs the main job on the default configuration
#   make test   installs what is missing, then runs the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The suite runs in two processes (pytest-xdist), each test file whole on one of them.
TEST_WORKERS ?= 2

.PHONY: run test setup lint bench

run: $(STAMP)
	$(PY) scripts/main.py

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_envs.py
