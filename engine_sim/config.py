"""Config: the simulated engine's settings and the KV capacity they imply, shared with the capacity plan.

``num_gpu_blocks`` comes from `fleet.capacity.plan.kv_budget_bytes` and `fleet.capacity.perf.kv_bytes_per_token`, the
same functions ``llmfleet plan`` uses, so a replica's simulated KV cache is the one the plan assumes.
``num_gpu_blocks_override`` and ``kv_cache_memory_bytes`` mirror vLLM's flags of the same names. The platform
(`engine_sim.platform`, from the GPU profile) sets the KV block size unless ``block_size`` does, and the step
costs: the roofline on a GPU, the measured per-step costs on the CPU build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_sim.errors import ConfigError
from engine_sim.kv import BlockPool, KVCacheManager
from engine_sim.kv_events import KVEventLog, KVEventSettings
from engine_sim.lora import LoraSettings
from engine_sim.platform import Platform, platform_of
from engine_sim.scheduler import Scheduler, SchedulerConfig
from engine_sim.timing import StepTimer
from fleet.capacity.catalog import GIB, GPUS, GpuType, ModelFacts
from fleet.capacity.lora import lora_slot_bytes
from fleet.capacity.perf import StepTimeModel, kv_bytes_per_token
from fleet.capacity.plan import kv_budget_bytes

__all__ = ["EngineConfig", "build_scheduler", "num_gpu_blocks"]


@dataclass(frozen=True)
class EngineConfig:
    """Everything a simulated replica needs; defaults follow ``vllm serve`` on an A100."""

    model: str
    facts: ModelFacts
    served_model_name: str
    gpu_profile: str = "a100-80gb"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.92
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    jitter: float = 0.0
    degradation_per_72h: float = 0.0
    slowdown: float = 1.0
    seed: int = 0
    lora: LoraSettings | None = None  # --enable-lora
    kv_events: KVEventSettings | None = None  # --kv-events-config
    block_size: int | None = None  # --block-size; None: the platform's default (16 on a GPU, 128 on the CPU build)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def gpu(self) -> GpuType:
        try:
            return GPUS[self.gpu_profile]
        except KeyError:
            raise ConfigError(f"unknown --gpu-profile {self.gpu_profile!r}; known: {sorted(GPUS)}") from None

    @property
    def platform(self) -> Platform:
        return platform_of(self.gpu_profile)

    @property
    def block_tokens(self) -> int:
        """Tokens per KV block: ``block_size``, else the platform's default."""
        return self.block_size if self.block_size is not None else self.platform.default_block_size

    @property
    def step_model(self) -> StepTimeModel:
        return StepTimeModel(self.facts, self.gpu, self.tensor_parallel_size)


def num_gpu_blocks(config: EngineConfig) -> int:
    """KV blocks of the replica; ConfigError, worded like vLLM's startup failures, when nothing fits."""
    if config.num_gpu_blocks_override is not None:
        blocks = config.num_gpu_blocks_override
    else:
        if config.kv_cache_memory_bytes is not None:
            budget = float(config.kv_cache_memory_bytes)
        else:
            budget = kv_budget_bytes(
                config.gpu, config.facts, config.tensor_parallel_size, config.gpu_memory_utilization
            )
            if config.lora is not None:  # the adapter slots are reserved before the KV cache is sized
                budget -= lora_slot_bytes(config.facts, config.lora.max_loras, config.lora.max_lora_rank)
        if budget <= 0:
            raise ConfigError(
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                f"initializing the engine (model needs more than {config.gpu.memory_gib:g} GiB x "
                f"{config.gpu_memory_utilization:g} on {config.gpu.name})."
            )
        blocks = int(budget // (kv_bytes_per_token(config.facts) * config.block_tokens))
    capacity = blocks * config.block_tokens
    if capacity < config.max_model_len:
        per_token = kv_bytes_per_token(config.facts)
        raise ConfigError(
            f"To serve at least one request with the models's max seq len ({config.max_model_len}), "
            f"({config.max_model_len * per_token / GIB:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({capacity * per_token / GIB:.2f} GiB). Based on the available "
            f"memory, the estimated maximum model length is {capacity}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    return blocks


def build_scheduler(
    config: EngineConfig,
    started_at: float = 0.0,
    *,
    pool_type: type[BlockPool] = BlockPool,
    manager_type: type[KVCacheManager] = KVCacheManager,
) -> Scheduler:
    """The engine's scheduler for ``config``; ``pool_type``/``manager_type`` let a replay swap in faster KV
    classes that behave the same (`simulate.kvpool`)."""
    pool = pool_type(num_gpu_blocks(config), enable_caching=config.enable_prefix_caching)
    if config.kv_events is not None and config.kv_events.config.publishes and config.enable_prefix_caching:
        pool.events = KVEventLog(config.kv_events, config.block_tokens)
    timer = StepTimer(
        config.step_model,
        cpu=config.platform.step_costs,
        jitter=config.jitter,
        degradation_per_72h=config.degradation_per_72h,
        slowdown=config.slowdown,
        seed=config.seed,
    )
    sched_config = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
    )
    return Scheduler(sched_config, manager_type(pool, config.block_tokens), timer, started_at=started_at)
