"""KV capacity: the simulator's blocks are the capacity plan's KV tokens; impossible configs fail early."""

from __future__ import annotations

import pytest

from engine_sim.config import num_gpu_blocks
from engine_sim.errors import ConfigError
from fleet.capacity.catalog import MODELS
from fleet.capacity.plan import plan_pool
from fleet.spec.loader import load_spec
from tests.engine_sim.builders import make_config


def test_simulated_kv_cache_matches_the_capacity_plan_of_the_local_stack() -> None:
    spec = load_spec("local").spec
    pool = spec.pools[0]
    plan = plan_pool(spec, pool)
    config = make_config(
        model=pool.model,
        facts=MODELS[pool.model],
        gpu_profile=pool.engine.sim.gpu_profile,
        gpu_memory_utilization=pool.engine.gpu_memory_utilization,
        tensor_parallel_size=pool.engine.tensor_parallel_size,
    )
    assert num_gpu_blocks(config) * 16 == plan.kv_tokens


@pytest.mark.parametrize(
    ("overrides", "blocks"),
    [
        ({"num_gpu_blocks_override": 100, "max_model_len": 1600}, 100),
        ({"kv_cache_memory_bytes": 57344 * 16 * 10, "max_model_len": 160}, 10),
    ],
)
def test_vllm_overrides_set_the_block_count(overrides: dict[str, int], blocks: int) -> None:
    assert num_gpu_blocks(make_config(**overrides)) == blocks


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpu_profile": "cpu-demo"}, "No available memory for the cache blocks"),
        ({"num_gpu_blocks_override": 10, "max_model_len": 1024}, "max seq len (1024)"),
        ({"gpu_profile": "no-such-gpu"}, "unknown --gpu-profile"),
    ],
)
def test_configs_vllm_would_refuse_fail_at_startup(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        num_gpu_blocks(make_config(**overrides))
