"""SLIs: what the gateways report about each pool's answers, summed over a window, as a canary's `Side`.

Gateways send, per pool and report, the answers since their previous report (`fleet.protocol.wire.PoolOutcomes`: counts
by outcome, TTFT and TPOT bucket counts). `SliLedger` keeps those deltas with the time they arrived and sums a
pool's over any window ``[since, now]``; the p99s come from the summed buckets, linear inside the bucket the
quantile falls in (as Prometheus' ``histogram_quantile``), the top bucket read as its lower edge.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from fleet.protocol.wire import LATENCY_EDGES_S, PoolOutcomes
from rollout.canary import Side

__all__ = ["SliLedger", "bucket_quantile"]


def bucket_quantile(counts: Sequence[int], q: float, edges: Sequence[float] = LATENCY_EDGES_S) -> float | None:
    """The ``q`` quantile of bucketed samples (``counts[i]`` in ``(edges[i-1], edges[i]]``, the last above
    ``edges[-1]``); None when there are none."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(edges):
                return edges[-1]
            low = edges[i - 1] if i > 0 else 0.0
            return low + (edges[i] - low) * (rank - seen) / count
        seen += count
    return edges[-1]


def _add(a: list[int], b: Sequence[int]) -> list[int]:
    if not b:
        return a
    if not a:
        return list(b)
    return [x + y for x, y in zip(a, b, strict=True)]


class SliLedger:
    """Every pool's reported answers, in arrival order, until `trim` drops them."""

    def __init__(self) -> None:
        self._entries: dict[str, deque[tuple[float, PoolOutcomes]]] = {}

    def record(self, pool: str, outcomes: PoolOutcomes, now: float) -> None:
        if outcomes.answered:
            self._entries.setdefault(pool, deque()).append((now, outcomes))

    def trim(self, before: float) -> None:
        """Forget what arrived before ``before`` (no window that starts earlier will be asked for)."""
        for entries in self._entries.values():
            while entries and entries[0][0] < before:
                entries.popleft()

    def window(self, pool: str, since: float) -> Side:
        """``pool``'s answers reported at or after ``since``: requests (every answer), 5xx, and p99s."""
        requests = errors = 0
        ttft: list[int] = []
        tpot: list[int] = []
        for at, o in self._entries.get(pool, ()):
            if at < since:
                continue
            requests += o.answered
            errors += o.errors
            ttft, tpot = _add(ttft, o.ttft), _add(tpot, o.tpot)
        return Side(requests, errors, bucket_quantile(ttft, 0.99), bucket_quantile(tpot, 0.99))
