"""The real-engine tier: tests against real ``vllm serve`` processes (vLLM's CPU build, a tiny model).

Only ``make test-vllm`` runs them (``-m vllm``; `make test` deselects the marker). It needs what
``images/vllm-cpu.sh`` builds under ``.build/vllm``: the engine's own venv with a ``vllm`` on ``bin/`` and the
tiny model. Missing, every test here fails with the command that builds it: a tier that cannot run is a failure,
never a skip.

The engines start through the product's own launch path (``llmfleet agent`` with ``engine.kind: vllm``), from
the shipped ``local-vllm`` stack with test timings. An engine's start is CPU-bound (about a minute on a quiet
two-core machine, several when two start at once), so each module shares its engines across its tests, starts
them one at a time, and runs its tests in file order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import Procs
from tests.support.stacks import write_stack

ROOT = Path(__file__).resolve().parents[2]
VLLM_DIR = Path(os.environ.get("VLLM_DIR", ROOT / ".build" / "vllm"))
VLLM = VLLM_DIR / "bin" / "vllm"
MODEL_DIR = VLLM_DIR / "models" / "tiny-qwen"
SERVED = "qwen2.5-7b-instruct"
HASH_SEED = "0"  # the engines' PYTHONHASHSEED: vLLM seeds its block-hash chain with it (engine_sim.block_hash)
START_S = 420.0  # one engine's start, launch to ready, on a busy two-core machine (a quiet one: about a minute)

# The engines' environment, set before any process starts: the agent finds `vllm` on PATH, as on an engine node.
ENGINE_ENV = {
    "PATH": f"{VLLM_DIR / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    "VLLM_CACHE_ROOT": str(VLLM_DIR / "cache"),
    "PYTHONHASHSEED": HASH_SEED,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session", autouse=True)
def real_engine() -> Iterator[None]:
    """Fail at once, naming the fix, where the engine or the model is missing; else point PATH at the engine."""
    missing = [str(p) for p in (VLLM, MODEL_DIR / "model.safetensors") if not p.exists()]
    if missing:
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
    ``overrides`` (dotted paths, `tests.support.stacks`), written to ``path``."""
    return write_stack(
        path,
        "local-vllm",
        **{
            "pools.0.model": str(MODEL_DIR),
            "pools.0.engine.tokenizer": str(ROOT / "models" / "llmfleet-tiny-tokenizer"),
            **overrides,
        },
    )


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    """Processes shared by one module's tests, stopped (and their engines' groups killed) after its last."""
    procs = Procs(tmp_path_factory.mktemp("procs"))
    yield procs
    procs.close()
