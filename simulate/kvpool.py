"""A replica's scheduler for the simulation, with a KV block pool that creates its blocks on first use.

`engine_sim.kv.BlockPool` builds every block up front (about a million objects over a replay's launches: a third
of a replay's time went there). `LazyBlockPool` hands out never-used blocks first, in id order, then the free
queue in LRU order: exactly the order in which `BlockPool` hands them out, since its never-used blocks sit at the
front of its free queue and released ones join at the back. `build_replica_scheduler` is
`engine_sim.config.build_scheduler` with that pool; tests hold it to the engine's behaviour.
"""

from __future__ import annotations

from collections import OrderedDict

from engine_sim.config import EngineConfig, build_scheduler
from engine_sim.kv import Block, BlockPool
from engine_sim.scheduler import Scheduler

__all__ = ["LazyBlockPool", "build_replica_scheduler"]


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
