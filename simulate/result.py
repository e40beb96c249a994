"""Result: what one simulated run measured (requests, latencies, replica and paid GPU time, a per-tick timeline)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Result", "busy_spread", "quantile"]


@dataclass
class Result:
    name: str
    requests: int = 0
    completed: int = 0
    unrouted: int = 0
    rejected: int = 0  # gateway queue full (429) or timed out (503)
    ttfts: array[float] = field(default_factory=lambda: array("d"))
    # TTFTs of the requests that could meet the SLO (not in the TTFT floor); with ``floor_requests`` the share
    # of those within the SLO, the scaler's and router's part apart from the floor
    feasible_ttfts: array[float] = field(default_factory=lambda: array("d"))
    floor_requests: int = 0  # arrivals whose prefill alone on an idle replica exceeds the SLO
    itls: array[float] = field(default_factory=lambda: array("d"))
    replica_s: float = 0.0
    busy_s: float = 0.0
    # (engine busy seconds, seconds launched) of each replica: the load spread between them (`busy_spread`)
    replica_busy: list[tuple[float, float]] = field(default_factory=list)
    # what is paid (`simulate.billing`): node-seconds of the pool's GPU group and paid GPU-seconds, integrated
    # over the replicas billed at each control tick; GPUs per replica, for engine busy time per paid GPU
    node_s: float = 0.0
    paid_gpu_s: float = 0.0
    gpus_per_replica: int = 1
    preemptions: int = 0
    peak_replicas: int = 0
    actions: int = 0
    wakes: int = 0  # sleeping replicas woken (sleep mode): each serves a wake, not a cold start, after its decision
    wall_s: float = 0.0
    initial_age_s: float = 0.0  # uptime of the replicas ready at the start (`simulate.week`)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prefix-cache hits at each request's first admission
    end_s: float = 0.0  # virtual time the last request finished
    # (t, replicas billed, gateway queue, TTFT p99 of the last interval) per control tick, for the plot
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank); NaN when empty."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def busy_spread(replica_busy: Sequence[tuple[float, float]]) -> float:
    """Load spread: the busiest replica's busy share (engine busy / time launched) over the mean share, 1.0 when
    even; NaN without a replica. On a fixed pool, the hottest replica's busy time over the mean."""
    shares = [busy / alive for busy, alive in replica_busy if alive > 0]
    mean = sum(shares) / len(shares) if shares else 0.0
    return max(shares) / mean if mean > 0 else math.nan
