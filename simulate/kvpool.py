"""A replica's scheduler for the simulation, with a KV block pool that creates its blocks on first use.

`engine_sim.kv.BlockPool` builds every block up front (about a million objects over a replay's launches: a third
of a replay's time went there). `LazyBlockPool` hands out never-used blocks first, in id order, then the free
queue in LRU order: exactly the order in which `BlockPool` hands them out, since its never-used blocks sit at the
front of its free queue and released ones join at the back. `build_replica_scheduler` is
`engine_sim.config.build_scheduler` with that pool; tests hold it to the engine's behaviour. `replica_config`
is the engine a pool's replica runs, with vLLM's KV-cache events recorded when a routing reads them.
"""

from __future__ import annotations

from collections import OrderedDict

from engine_sim.config import EngineConfig, build_scheduler
from engine_sim.kv import Block, BlockPool
from engine_sim.kv_events import KVEventsConfig, KVEventSettings
from engine_sim.scheduler import Scheduler
from fleet.capacity.plan import model_facts, pool_gpu
from fleet.spec.stack import FleetSpec, PoolSpec

__all__ = ["LazyBlockPool", "build_replica_scheduler", "replica_config"]


class LazyBlockPool(BlockPool):
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._free: OrderedDict[int, Block] = OrderedDict()
        self._cached: dict[int, Block] = {}
        self._next_fresh = 0  # blocks [_next_fresh, num_blocks) were never handed out

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_blocks - self._next_fresh

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def allocate(self, count: int) -> list[Block]:
        if count > self.num_free:
            raise RuntimeError(f"allocate({count}) with {self.num_free} free blocks")
        fresh = min(count, self.num_blocks - self._next_fresh)
        out = [Block(i, 1) for i in range(self._next_fresh, self._next_fresh + fresh)]  # ref_count 1
        self._next_fresh += fresh
        if count > fresh:
            out.extend(super().allocate(count - fresh))
        return out


def build_replica_scheduler(config: EngineConfig, started_at: float = 0.0) -> Scheduler:
    """`engine_sim.config.build_scheduler` over a `LazyBlockPool`."""
    return build_scheduler(config, started_at, pool_type=LazyBlockPool)


def replica_config(spec: FleetSpec, pool: PoolSpec, *, kv_events: bool = False) -> EngineConfig:
    """The engine one of ``pool``'s replicas runs; ``kv_events``: its block pool records vLLM's KV-cache events
    (``--kv-events-config '{"enable_kv_cache_events": true}'``), which cost a replay hashing time otherwise."""
    eng = pool.engine
    return EngineConfig(
        model=pool.model,
        facts=model_facts(pool),
        served_model_name=pool.served_model_name or pool.model,
        gpu_profile=pool_gpu(spec, pool).name,
        tensor_parallel_size=eng.tensor_parallel_size,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        max_model_len=eng.max_model_len,
        max_num_seqs=eng.max_num_seqs,
        max_num_batched_tokens=eng.max_num_batched_tokens,
        enable_prefix_caching=eng.enable_prefix_caching,
        degradation_per_72h=eng.sim.degradation_per_72h,
        kv_events=KVEventSettings(KVEventsConfig(enable_kv_cache_events=True)) if kv_events else None,
    )
