"""The simulation's lazily built KV block pool hands out and frees blocks exactly as the engine's pool does."""

from __future__ import annotations

import random

from engine_sim.config import EngineConfig, build_scheduler
from engine_sim.kv import Block, BlockPool
from engine_sim.request import SimRequest
from fleet.capacity.plan import model_facts
from simulate.kvpool import LazyBlockPool, build_replica_scheduler
from tests.support import stacks


def test_lazy_pool_matches_the_block_pool_on_a_random_sequence_of_operations() -> None:
    rng = random.Random(5)
    eager, lazy = BlockPool(64), LazyBlockPool(64)
    held: list[tuple[list[Block], list[Block]]] = []
    for step in range(3000):
        assert (eager.num_free, eager.usage) == (lazy.num_free, lazy.usage)
        op = rng.random()
        if op < 0.5 and eager.num_free:
            n = rng.randint(1, min(8, eager.num_free))
            a, b = eager.allocate(n), lazy.allocate(n)
            assert [x.block_id for x in a] == [x.block_id for x in b], step
            for x, y in zip(a, b, strict=True):
                h = rng.randrange(40)
                eager.register(x, h)
                lazy.register(y, h)
            held.append((a, b))
        elif op < 0.8 and held:
            a, b = held.pop(rng.randrange(len(held)))
            eager.release(a)
            lazy.release(b)
        else:
            h = rng.randrange(40)
            x, y = eager.lookup(h), lazy.lookup(h)
            assert (x is None) == (y is None) and (x is None or y is None or x.block_id == y.block_id)
            if x is not None and y is not None:
                eager.touch([x])
                lazy.touch([y])
                held.append(([x], [y]))


def test_replica_scheduler_is_the_engine_scheduler_over_the_lazy_pool() -> None:
    pool = stacks.spec("prod").pools[0]
    engine = EngineConfig(model=pool.model, facts=model_facts(pool), served_model_name="m", max_model_len=4096)
    ours, theirs = build_replica_scheduler(engine, 3.0), build_scheduler(engine, 3.0)
    assert ours.config == theirs.config and ours.started_at == theirs.started_at
    assert ours.kv.pool.num_blocks == theirs.kv.pool.num_blocks == ours.kv.pool.num_free
    assert isinstance(ours.kv.pool, LazyBlockPool)


def test_a_replica_scheduler_serves_a_workload_exactly_as_the_engine_scheduler_does() -> None:
    pool = stacks.spec("prod").pools[0]
    engine = EngineConfig(
        model=pool.model,
        facts=model_facts(pool),
        served_model_name="m",
        max_model_len=4096,
        num_gpu_blocks_override=600,
    )
    runs = []
    for build in (build_scheduler, build_replica_scheduler):
        sched = build(engine, 0.0)
        rng = random.Random(3)
        now, log = 0.0, []
        for i in range(40):  # shared heads, long enough to fill the cache and preempt
            head = [rng.randrange(4)] * rng.choice([16, 200, 700])
            sched.add(SimRequest(f"r{i}", head + [1000 + i] * rng.randrange(1, 300), max_tokens=30), now)
        while sched.has_work():
            result = sched.step(now)
            assert result is not None
            now = result.plan.end
            log += [(e.request.request_id, e.token_id, e.latency, e.request.num_cached_tokens) for e in result.events]
        runs.append((log, sched.stats))
    assert runs[0] == runs[1]
    assert runs[0][1].prefix_hits > 0 and runs[0][1].preemptions > 0
