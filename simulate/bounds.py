"""Yardsticks a simulated configuration is measured against: what no scaler and no router could beat.

**Clairvoyant replica-seconds.** Cut the trace into intervals of ``interval_s`` (a minute in a replay:
`simulate.replay.BOUND_INTERVAL_S`).
Interval i needs ``n_i = max(min, ceil(arrivals_i / (per_replica_qps x interval_s)))`` replicas, where
``per_replica_qps`` is the capacity plan's at-SLO rate per replica for the trace's token mix
(`fleet.capacity.plan.plan_pool`). A scaler that knows the whole trace runs replica k (k = 1, 2, ...) exactly over the
intervals where ``n_i >= k``, launching it a cold start ahead (billed from launch) and, between two such runs,
keeping it running through a gap shorter than the cold start (cheaper than stopping and launching again). The
first ``initial`` replicas are running at time 0 (the simulation starts the scaled pool with them). The sum over k
is the fewest replica-seconds any scaler could have billed for the trace at the plan's rate: the bound the
simulated scalers' replica-hours are divided by. It ignores queueing inside an interval, so a scaler can only
approach it from above with a TTFT SLO to keep.

**Clairvoyant paid GPU-seconds.** The same need at node granularity: during interval i the fewest nodes that
hold ``m_i`` replicas, where ``m_i`` is the largest need of the intervals a start ahead (the cold start plus the
node start, `control_plane.loop.node_lead`: a node is ordered that long before its replicas must serve), the
per-zone minimum included (`simulate.billing.NodeBilling`). Summed over the intervals, it is the fewest paid
GPU-seconds any scaler could bill at the plan's rate; on a stack whose per-zone minimum already holds the
need, it is that minimum for the trace's span.

**Infinite shared cache.** One prefix cache of unlimited size shared by every replica: a request hits every
leading prefix block (Mooncake ``hash_ids``) some earlier request had, capped like vLLM's cache at
``prompt - 1`` tokens in whole 16-token blocks. Its hit rate (hit tokens / prompt tokens) is the most any router
could reach; a router's own rate is reported as a share of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from simulate.trace import PREFIX_BLOCK_TOKENS, TraceRequest

__all__ = [
    "clairvoyant_paid_gpu_seconds",
    "clairvoyant_replica_seconds",
    "infinite_cache_hit_rate",
    "lookahead",
    "needed_replicas",
]

_KV_BLOCK = 16  # the engine's cache granularity (engine_sim.kv.BLOCK_SIZE)


def needed_replicas(
    trace: Sequence[TraceRequest], per_replica_qps: float, interval_s: float, min_replicas: int = 0
) -> list[int]:
    """Replicas each interval needs at ``per_replica_qps``, over ``[0, last arrival]``."""
    if per_replica_qps <= 0 or interval_s <= 0:
        raise ValueError("per_replica_qps and interval_s must be positive")
    if not trace:
        return []
    counts = [0] * (int(max(r.t for r in trace) // interval_s) + 1)
    for r in trace:
        counts[int(r.t // interval_s)] += 1
    per_interval = per_replica_qps * interval_s
    return [max(min_replicas, math.ceil(c / per_interval - 1e-9)) for c in counts]


def lookahead(needed: Sequence[int], interval_s: float, lead_s: float) -> list[int]:
    """Per interval i: the largest need of intervals i .. i + ceil(lead_s / interval_s): what must be running
    during interval i so that every interval gets its need when capacity takes ``lead_s`` to start."""
    if interval_s <= 0 or lead_s < 0:
        raise ValueError("interval_s must be positive and lead_s non-negative")
    ahead = math.ceil(lead_s / interval_s - 1e-9)
    return [max(needed[i : i + ahead + 1]) for i in range(len(needed))]


def clairvoyant_replica_seconds(
    needed: Sequence[int], interval_s: float, cold_start_s: float, initial: int = 0
) -> float:
    """The fewest replica-seconds that give every interval its ``needed`` replicas (see the module docstring)."""
    total = 0.0
    for k in range(1, max(needed, default=0) + 1):
        runs: list[tuple[int, int]] = []  # [start, end) in intervals where at least k replicas are needed
        for i, n in enumerate(needed):
            if n >= k:
                if runs and runs[-1][1] == i:
                    runs[-1] = (runs[-1][0], i + 1)
                else:
                    runs.append((i, i + 1))
        previous_end: float | None = 0.0 if k <= initial else None  # a replica running at t=0
        for start, end in runs:
            begin = start * interval_s
            if previous_end is None:
                total += cold_start_s
            else:
                total += min(begin - previous_end, cold_start_s)
            total += (end - start) * interval_s
            previous_end = end * interval_s
    return total


def clairvoyant_paid_gpu_seconds(
    needed: Sequence[int], interval_s: float, lead_s: float, paid_gpus: Callable[[int], int]
) -> float:
    """The fewest paid GPU-seconds that give every interval its ``needed`` replicas, capacity ordered ``lead_s``
    ahead; ``paid_gpus(replicas)`` is what the pool pays while that many run (see the module docstring)."""
    return sum(paid_gpus(n) * interval_s for n in lookahead(needed, interval_s, lead_s))


def infinite_cache_hit_rate(trace: Sequence[TraceRequest]) -> float:
    """Prompt tokens an infinite shared prefix cache would serve from cache / all prompt tokens (a salted request's
    chain starts from its salt, as the engine's: it reuses only prefixes sent with the same salt)."""
    seen: set[int] = set()
    hits = total = 0
    for r in sorted(trace, key=lambda r: r.t):
        chain, matched, missed = hash(("cache_salt", r.cache_salt)) if r.cache_salt else 0, 0, False
        for block in r.prefix_blocks:
            chain = hash((chain, block))
            if not missed and chain in seen:
                matched += 1
            else:
                missed = True
            seen.add(chain)
        cap = (r.prompt_tokens - 1) // _KV_BLOCK * _KV_BLOCK
        hits += min(matched * PREFIX_BLOCK_TOKENS, cap)
        total += r.prompt_tokens
    return hits / total if total else 0.0
