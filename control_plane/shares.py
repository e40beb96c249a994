"""Shares: divide a pool's admission capacity among the gateways in front of it.

Each gateway admits up to its share of the pool's capacity (ready replicas x (maxNumSeqs +
queue.perReplicaThreshold)), so N gateways together put no more into the engines than one gateway would, and the
engines' own first-come queues stay short: priority and tenant fairness are decided in the gateways' queues.

    admission_shares(demands, reserve=0.1) -> {gateway: fraction}

The division, for gateways g with demand d_g(p) (requests in flight or waiting at priority p):
* every gateway keeps ``reserve``/N of the capacity, so one that was idle can admit at once when traffic moves to
  it (no gateway is ever left at zero);
* the rest, 1 - ``reserve``, is filled band by band from the highest priority down: a band whose total demand fits
  is served whole; the first band that does not fit is split in proportion to each gateway's demand in it, and
  lower bands get nothing. So high-priority requests waiting at one gateway take capacity from low-priority ones at
  another, as they would in one shared queue;
* what no band asked for is split evenly.
The fractions sum to 1. Demand is measured in requests against a capacity in requests, so ``capacity`` is needed
to know what "fits"; with no capacity (no ready replica) the split is even. The function is pure: the control
plane calls it with the gateways' latest non-stale reports, and tests call it with made-up ones.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["admission_shares"]


def admission_shares(demands: Mapping[str, Mapping[int, int]], capacity: int, reserve: float = 0.1) -> dict[str, float]:
    """Gateway id -> its fraction of ``capacity`` (summing to 1); {} without gateways. ``demands``: gateway id ->
    {priority: requests in flight or waiting}; ``reserve`` in [0, 1]."""
    if not demands:
        return {}
    n = len(demands)
    if capacity <= 0:
        return {g: 1.0 / n for g in demands}
    alloc = {g: capacity * reserve / n for g in demands}
    remaining = capacity * (1.0 - reserve)
    for priority in sorted({p for d in demands.values() for p in d}, reverse=True):
        if remaining <= 0:
            break
        want = {g: max(0, d.get(priority, 0)) for g, d in demands.items()}
        total = sum(want.values())
        if total == 0:
            continue
        granted = min(1.0, remaining / total)
        for g, w in want.items():
            alloc[g] += w * granted
        remaining -= total * granted
    if remaining > 0:
        for g in alloc:
            alloc[g] += remaining / n
    return {g: a / capacity for g, a in alloc.items()}


def grantable(gateway: str, target: float, held: Mapping[str, float]) -> float:
    """``target`` (from `admission_shares`) capped by what the other gateways still hold: ``held`` maps each live
    gateway to the larger of its last granted share and its reported in-flight / capacity.

    Each gateway learns its share when it reports, so shares move one gateway at a time: granting a growing share
    at once, while the others still admit by their older, larger ones (or still hold requests above their new
    ones), would let the gateways together admit more than the pool. Capped, a share grows only into capacity the
    others have released, and their in-flight requests drain as they finish, so the cap always lifts."""
    others = sum(h for g, h in held.items() if g != gateway)
    return max(0.0, min(target, 1.0 - others))
