# Two commands do all the set-up on a fresh Debian machine (Python 3.11, root, no GPU):
#   make run    installs what is missing, then runs the main job on the default configuration
#   make test   installs what is missing, then runs the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The suites people report on (Meta-World, robosuite) need MuJoCo 3.3.x: their own environment.
SUITES_VENV ?= .venv-suites
SUITES_PY := $(SUITES_VENV)/bin/python
SUITES_STAMP := $(SUITES_VENV)/.installed
# The suite runs in two processes (pytest-xdist), each test file whole on one of them, and
# ends by naming its 25 slowest tests (the default suite must stay under 6 minutes on 2 cores).
TEST_WORKERS ?= 2

# The multi-seed headline: the main job on five seeds, one after the other (each uses both
# cores), then the report across them (docs/results.md).
SEEDS ?= 0,1,2,3,4
SWEEP_DIR ?= multirun/main_job_seeds

.PHONY: run test setup suites lint bench seeds

run: $(STAMP)
	$(PY) scripts/main.py

# Then the suites' tests (tests/suites/) in their own environment, built on first use.
test: $(STAMP) $(SUITES_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25
	$(SUITES_PY) -m pytest tests/suites -n $(TEST_WORKERS) --dist loadgroup --durations=10

seeds: $(STAMP)
	$(PY) scripts/train.py -m +experiment=main_job seed=$(SEEDS) hydra.launcher.n_jobs=1 \
		hydra.sweep.dir=$(SWEEP_DIR)
	$(PY) scripts/report.py $(SWEEP_DIR)

setup: $(STAMP)

# .venv-suites/: MuJoCo 3.3.x, Meta-World 3.1.1, robosuite 1.5.2 and the harness (docs/tasks.md)
suites: $(SUITES_STAMP)

$(SUITES_STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(SUITES_VENV) suites
	touch $(SUITES_STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_envs.py
