# The README's commands. `make up` sets everything up on a fresh machine and
# runs the product; `make test` runs every test except those marked gpu.
PY ?= python3
# pytest-xdist workers for `make test` (tests are independent: each end-to-end
# stack has its own database, run folders and queue name).
TEST_WORKERS ?= auto
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint format bench venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# UP_ARGS passes options to manage.py lab_up, e.g. `make up UP_ARGS=--check`
# (CI: start, let a demo run train, stop, and check the stop).
up: $(STAMP)
	$(BIN)/python manage.py lab_up $(UP_ARGS)

test: $(STAMP)
	scripts/ensure-test-deps
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS) || [ $$? -eq 5 ]
	scripts/test-platform-postgres -n $(TEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) var runs .pytest_cache
