# llmfleet: two commands a newcomer needs.
#   make test   lint, type-check and run every test (what CI runs)
#   make up     run the whole fleet on this machine (simulated engines, real processes)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test up lint typecheck pytest venv clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck pytest

up: $(STAMP)
	$(BIN)/llmfleet up --stack local

bench: $(STAMP)
	$(BIN)/python bench/engine_sim.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/autoscaling.py
	$(BIN)/python bench/fleet_sim.py
	$(BIN)/python bench/control_plane_intake.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
