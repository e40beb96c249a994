"""KV-aware routing in the replay: ``p2c+kv`` and ``work+kv`` fed by the replicas' own KV events after a delay,
the oracle router ``oracle-kv`` that reads their prefix caches; their hit rates against ``p2c`` on shared
prefixes; what ``work+kv``'s gateway counts."""

from __future__ import annotations

import random

import pytest

from gateway.routing.base import RequestInfo
from simulate.configs import Config, make_router
from simulate.fleet_sim import FleetSim
from simulate.kv_oracle import OracleKv, prefix_cache_keys
from simulate.kvfeed import KvFeed
from simulate.prompts import prompt_tokens
from simulate.replay import Prepared, prepare, run_config
from simulate.report import row
from simulate.trace import TraceRequest
from tests.support import stacks


def shared_prefix_trace(n: int, rate: float = 6.0, groups: int = 40, seed: int = 3) -> list[TraceRequest]:
    """``n`` requests of 2,300 tokens, each opening with one of ``groups`` 4-block (2,048-token) prefixes."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        group = rng.randrange(groups)
        blocks = (*(1000 * group + k for k in range(4)), 10**6 + i)
        out.append(TraceRequest(t, f"r{i}", 2300, 16, blocks))
    return out


def _sim(prepared: Prepared, routing: str, replicas: int, delay_s: float = 0.05) -> FleetSim:
    spec = stacks.spec("prod")
    router = make_router(spec, routing, seed=7)
    return FleetSim(spec, prepared.pool, router, None, prepared.trace, initial_replicas=replicas, kv_delay_s=delay_s)


@pytest.mark.parametrize("delay_s", [0.05, 0.4])
def test_the_kv_routings_index_sees_a_replicas_blocks_only_after_the_delay(delay_s: float) -> None:
    trace = [TraceRequest(0.0, "a", 2300, 4, (11, 12, 13, 14, 15))]
    prepared = prepare("prod", trace)
    sim = _sim(prepared, "p2c+kv", replicas=2, delay_s=delay_s)
    assert sim.kv_feed is not None and sim.kv_feed.delay_s == delay_s
    index, keys = sim.kv_feed.index, prefix_cache_keys(prompt_tokens(trace[0], 0))
    sim.begin()
    cached_at = seen_at = None
    while sim.events and seen_at is None:
        sim.handle_next()
        held = {r.name for r in sim.replicas if r.scheduler.kv.pool.lookup(keys[0]) is not None}
        if held and cached_at is None:
            cached_at = sim.now
        if any(index.blocks_of(name) for name in held):
            seen_at = sim.now
    assert cached_at is not None and seen_at is not None
    assert seen_at == pytest.approx(cached_at + delay_s)
    (name,) = index.replicas()
    while sim.events:
        sim.handle_next()
    assert index.blocks_of(name) == 2300 // 16  # every full block of the prompt, as the engine cached them
    replica = sim.by_name[name]
    sim.leave(replica, sim.now)  # it stops: the feed forgets it, after the same delay
    left_at = sim.now
    assert index.blocks_of(name) > 0
    while sim.events:
        sim.handle_next()
    assert index.blocks_of(name) == 0 and sim.now == pytest.approx(left_at + delay_s)


def test_only_a_router_with_a_kv_cache_scorer_has_the_engines_record_events() -> None:
    prepared = prepare("prod", shared_prefix_trace(5))
    for routing, records in [("p2c+kv", True), ("p2c+prefix", False), ("oracle-kv", False), ("p2c", False)]:
        sim = _sim(prepared, routing, replicas=2)
        sim.begin()
        assert (sim.kv_feed is not None) == records, routing
        assert all((r.scheduler.kv.pool.events is not None) == records for r in sim.replicas), routing


def test_the_oracle_scores_each_replica_by_its_real_cached_prefix() -> None:
    trace = shared_prefix_trace(120, groups=12)
    prepared = prepare("prod", trace)
    sim = _sim(prepared, "oracle-kv", replicas=3)
    sim.run()
    (oracle,) = [s for s, _ in sim.router.scorers if isinstance(s, OracleKv)]
    views = [r.view(prepared.pool.name, sim.model, 256, sim.now) for r in sim.replicas]
    differed = 0
    for i, probe in enumerate(shared_prefix_trace(30, groups=16, seed=9)):
        tokens = prompt_tokens(probe, 10_000 + i)
        info = RequestInfo(f"probe-{i}", sim.model, "acme", 8, "", None, sim.now, token_ids=tuple(tokens))
        scores = list(oracle.score(views, info))
        # what each engine would serve from its cache on admission, over the prompt's full blocks
        real = [r.scheduler.kv.computed_blocks(f"probe-{i}", tokens)[0] for r in sim.replicas]
        assert scores == [len(blocks) / (len(tokens) // 16) for blocks in real]
        differed += len(set(scores)) > 1
    assert differed >= 5  # replicas hold different prefixes: the scores are not all alike


def test_on_shared_prefixes_the_kv_routings_hit_well_above_p2c_and_at_most_the_oracle() -> None:
    prepared = prepare("prod", shared_prefix_trace(400))
    hit = {
        r: float(row(run_config(prepared, Config(r, "fixed", 4), 7), prepared)["hit"])
        for r in ("p2c", "p2c+kv", "work+kv", "oracle-kv")
    }
    assert hit["p2c+kv"] >= hit["p2c"] + 0.08 and hit["work+kv"] >= hit["p2c"] + 0.08
    assert hit["p2c+kv"] <= hit["oracle-kv"] + 0.01  # the oracle may lose a little by its greedy choice, no more
    assert hit["oracle-kv"] <= prepared.cache_ceiling


def test_a_negative_delay_is_refused() -> None:
    router = make_router(stacks.spec("prod"), "p2c+kv", seed=1)
    with pytest.raises(ValueError, match="KV event delay"):
        KvFeed.for_router(router, -0.01)


def test_work_kv_counts_each_replicas_queued_prefill_as_the_gateway_would_and_ends_at_zero() -> None:
    prepared = prepare("prod", shared_prefix_trace(200))
    sim = _sim(prepared, "work+kv", replicas=3)
    assert sim.router.picker.name == "least-work" and sim.kv_feed is not None
    sim.begin()
    busiest = 0
    while sim.events:
        sim.handle_next()
        for r in sim.replicas:
            # prefill counts only requests not yet answered, context only those answered
            waiting = [rid for rid, (_, _, answered) in r.open.items() if not answered]
            assert r.prefill_tokens == sum(r.open[rid][0] for rid in waiting)
            assert r.context_tokens == sum(tokens for _, tokens, answered in r.open.values() if answered)
            busiest = max(busiest, r.prefill_tokens)
    assert busiest >= 2300  # a cold prompt was queued at some point
    assert all((r.open, r.prefill_tokens, r.context_tokens, r.in_flight) == ({}, 0, 0, 0) for r in sim.replicas)
