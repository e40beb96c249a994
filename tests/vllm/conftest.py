"""The real-engine tier: tests against real ``vllm serve`` processes (vLLM's CPU build, a tiny model).

Only ``make test-vllm`` runs them (``-m vllm``; `make test` deselects the marker). It needs what
``images/vllm-cpu.sh`` builds under ``.build/vllm``: the engine's own venv with a ``vllm`` on ``bin/`` and the
tiny model. Missing, every test here fails with the command that builds it: a tier that cannot run is a failure,
never a skip.

The engines start through the product's own launch path (``llmfleet agent`` with ``engine.kind: vllm``), from
the shipped ``local-vllm`` stack with test timings. An engine's start is CPU-bound (about a minute on a quiet
two-core machine, several when two start at once), so each module shares its engines across its tests, starts
them one at a time, and runs its tests in file order.

``LLMFLEET_TIER_ENGINE=sim`` (``make test-vllm-sim``) runs the same tests on the simulator instead: the same stack
with ``engine.kind: sim`` on the ``cpu-tiny`` profile, which plays the CPU build (0.32.0, 128-token blocks, no sleep
mode, its measured step times; `engine_sim.platform`) and starts in `SIM_START_S`. Nothing needs building then.
The tests whose assertion is the real engine's alone say so where they branch on `TIER_ENGINE`; the differential
suite (``test_differential*``), which compares the two, is deselected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.capacity.catalog import CPU_BUILD_GPUS
from tests.support.procs import Procs
from tests.support.stacks import write_stack

ROOT = Path(__file__).resolve().parents[2]
VLLM_DIR = Path(os.environ.get("VLLM_DIR", ROOT / ".build" / "vllm"))
VLLM = VLLM_DIR / "bin" / "vllm"
MODEL_DIR = VLLM_DIR / "models" / "tiny-qwen"
SERVED = "qwen2.5-7b-instruct"
HASH_SEED = "0"  # the engines' PYTHONHASHSEED: vLLM seeds its block-hash chain with it (engine_sim.block_hash)
START_S = 420.0  # one engine's start, launch to ready, on a busy two-core machine (a quiet one: about a minute)
TIER_ENGINE = os.environ.get("LLMFLEET_TIER_ENGINE", "vllm")  # vllm (the real engine) or sim (the simulator)
_ENGINES = ("vllm", "sim")
SIM_START_S = 5.0  # the simulated CPU build's start (`engine.sim.startupSeconds`): the real one takes ~50 s
SIM_PROFILE = "cpu-tiny"
assert SIM_PROFILE in CPU_BUILD_GPUS

# The engines' environment, set before any process starts: the agent finds `vllm` on PATH, as on an engine node.
ENGINE_ENV = {
    "PATH": f"{VLLM_DIR / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    "VLLM_CACHE_ROOT": str(VLLM_DIR / "cache"),
    "PYTHONHASHSEED": HASH_SEED,
}


def pytest_configure(config: pytest.Config) -> None:
    del config  # Unused.
    if TIER_ENGINE not in _ENGINES:
        raise pytest.UsageError(f"LLMFLEET_TIER_ENGINE={TIER_ENGINE!r}: allowed: {', '.join(_ENGINES)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    deselected = []
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.vllm)
            if TIER_ENGINE == "sim" and Path(str(item.path)).name.startswith("test_differential"):
                deselected.append(item)  # it compares the simulator with the real engine: it needs both
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(scope="session", autouse=True)
def real_engine() -> Iterator[None]:
    """Fail at once, naming the fix, where the engine or the model is missing; else point PATH at the engine.
    The simulator needs neither (the model's path is only its name there)."""
    missing = [str(p) for p in (VLLM, MODEL_DIR / "model.safetensors") if not p.exists()]
    if missing and TIER_ENGINE == "vllm":
        pytest.fail(f"the real engine is not built ({', '.join(missing)}): run `make vllm-cpu` (images/vllm-cpu.sh)")
    saved = {k: os.environ.get(k) for k in ENGINE_ENV}
    os.environ.update(ENGINE_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def vllm_stack(path: Path, **overrides: Any) -> Path:
    """The shipped ``local-vllm`` stack with the model's absolute path (tests run from any folder) and
    ``overrides`` (dotted paths, `tests.support.stacks`), written to ``path``; on the simulator (`TIER_ENGINE`)
    its engine is ``sim`` on the CPU build's profile, at the real engine's speed."""
    engine = {}
    if TIER_ENGINE == "sim":
        engine = {"pools.0.engine.kind": "sim", "pools.0.engine.sim": {"gpuProfile": SIM_PROFILE,
                                                                       "startupSeconds": SIM_START_S}}  # fmt: skip
    return write_stack(
        path,
        "local-vllm",
        **{
            "pools.0.model": str(MODEL_DIR),
            "pools.0.engine.tokenizer": str(ROOT / "models" / "llmfleet-tiny-tokenizer"),
            **engine,
            **overrides,
        },
    )


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    """Processes shared by one module's tests, stopped (and their engines' groups killed) after its last."""
    procs = Procs(tmp_path_factory.mktemp("procs"))
    yield procs
    procs.close()
