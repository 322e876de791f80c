# The README's commands. `make up` sets everything up on a fresh machine and
# runs the product; `make test` runs every test except those marked gpu.
PY ?= python3
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

up: $(STAMP)
	$(BIN)/python manage.py lab_up

test: $(STAMP)
	scripts/ensure-test-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]
	scripts/test-platform-postgres

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
