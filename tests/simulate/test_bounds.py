"""The yardsticks on hand-computed traces: the clairvoyant replica-seconds and the infinite-cache hit rate."""

from __future__ import annotations

import pytest

from simulate.bounds import clairvoyant_replica_seconds, infinite_cache_hit_rate, needed_replicas
from simulate.trace import TraceRequest


def arrivals(*counts: int, interval: float = 10.0) -> list[TraceRequest]:
    """``counts[i]`` requests spread over interval i."""
    out: list[TraceRequest] = []
    for i, n in enumerate(counts):
        out += [TraceRequest(i * interval + j * interval / max(1, n), f"r{i}-{j}", 100, 10) for j in range(n)]
    return out


def test_needed_replicas_per_interval_at_the_planned_rate() -> None:
    # 1 req/s per replica, 10 s intervals: 10 requests need 1 replica, 11 need 2, none need the minimum.
    assert needed_replicas(arrivals(10, 11, 0, 30), 1.0, 10.0) == [1, 2, 0, 3]
    assert needed_replicas(arrivals(10, 11, 0, 30), 1.0, 10.0, min_replicas=1) == [1, 2, 1, 3]
    with pytest.raises(ValueError):
        needed_replicas(arrivals(1), 0.0, 10.0)


def test_one_replica_pays_one_cold_start_then_runs_while_needed() -> None:
    # needed [1, 1, 1]: launched 30 s ahead, runs 3 x 10 s.
    assert clairvoyant_replica_seconds([1, 1, 1], 10.0, 30.0) == 60.0
    # already running at t=0: no cold start
    assert clairvoyant_replica_seconds([1, 1, 1], 10.0, 30.0, initial=1) == 30.0


def test_a_gap_shorter_than_the_cold_start_is_bridged_a_longer_one_relaunches() -> None:
    # needed [1, 0, 1]: the 10 s gap is cheaper than a 30 s relaunch: 30 + 10 + 10 + 10.
    assert clairvoyant_replica_seconds([1, 0, 1], 10.0, 30.0) == 60.0
    # needed [1, 0, 0, 0, 0, 1] with a 30 s cold start: a 40 s gap costs a relaunch (30) instead.
    assert clairvoyant_replica_seconds([1, 0, 0, 0, 0, 1], 10.0, 30.0) == 30 + 10 + 30 + 10


def test_replicas_stack_slot_by_slot() -> None:
    # needed [1, 3, 1], cold start 5, one warm at t=0:
    # slot 1: 30 s (warm); slots 2 and 3: 5 + 10 each.
    assert clairvoyant_replica_seconds([1, 3, 1], 10.0, 5.0, initial=1) == 30 + 2 * 15
    # a warm replica not needed at first is kept through a short gap or stopped: min(gap, cold start).
    assert clairvoyant_replica_seconds([0, 1], 10.0, 5.0, initial=1) == 5 + 10
    assert clairvoyant_replica_seconds([], 10.0, 5.0) == 0.0


def test_infinite_cache_hits_every_prefix_seen_before() -> None:
    trace = [
        TraceRequest(0.0, "a", 1024, 1, (1, 2)),  # cold: 0 of 1024
        TraceRequest(1.0, "b", 1536, 1, (1, 2, 3)),  # blocks 1, 2 seen: 1024 of 1536
        TraceRequest(2.0, "c", 1024, 1, (9, 2)),  # block 9 new, so (9, 2) is a different prefix: 0
        TraceRequest(3.0, "d", 1024, 1, (1, 2)),  # all seen, capped at prompt - 1 in 16-token blocks: 1008
        TraceRequest(4.0, "e", 100, 1),  # no blocks: shares nothing
    ]
    assert infinite_cache_hit_rate(trace) == pytest.approx((1024 + 1008) / (1024 + 1536 + 1024 + 1024 + 100))
    assert infinite_cache_hit_rate([]) == 0.0
