# llmfleet: two commands a newcomer needs.
#   make test   lint, type-check and run every test but the image tests (what CI runs first)
#   make up     run the whole fleet on this machine (simulated engines, real processes), with a live view
# and, with root, buildah, podman and debootstrap:
#   make images        build the runtime image (IMAGES=engine|all for the others) and print its digest
#   make test-images   build the runtime image and test it (what CI runs after `make test`)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test up lint typecheck pytest venv clean bench images test-images

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

# pytest in two passes that together run every test once (the second ignores what the first ran). First the
# folders whose tests run inside pytest's process (at most a short-lived tool or CLI run), on PYTEST_WORKERS workers
# (pytest-xdist; one file per worker, so a module's fixtures start once); then all the others one at a time: they
# start fleets, agents, engines and gateways as real processes on loopback ports under deadlines, and two at once
# would take the CPU those deadlines measure. Folders, not files: a folder that is renamed or not there falls into
# the second pass. Both passes run; the recipe fails if either did.
PARALLEL_TESTS := $(wildcard tests/test_layers.py tests/fleet tests/infra tests/policies tests/rollout tests/simulate)
PYTEST_WORKERS ?= 2

pytest: $(STAMP)
	status=0; \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PARALLEL_TESTS) || status=$$?; \
	$(BIN)/pytest -q $(addprefix --ignore=,$(PARALLEL_TESTS)) || status=$$?; \
	exit $$status

test: lint typecheck pytest

IMAGES ?= runtime

images:
	images/build.sh $(IMAGES)

test-images: $(STAMP)
	$(BIN)/pytest -q -m image tests/images

up: $(STAMP)
	$(BIN)/llmfleet up --stack local --live

bench: $(STAMP)
	$(BIN)/python bench/engine_sim.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/autoscaling.py
	$(BIN)/python bench/fleet_sim.py
	$(BIN)/python bench/control_plane_intake.py
	$(BIN)/python bench/chaos.py
	$(BIN)/python bench/simulate_speed.py
	$(BIN)/python bench/model_fetch.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
