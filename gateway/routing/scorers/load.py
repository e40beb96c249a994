"""Load scorers: queue-depth, kv-usage, in-flight.

* ``queue-depth``: q = max(engine ``num_requests_waiting``, gateway in-flight - maxNumSeqs), the requests
  waiting for a batch slot (the gateway's own count covers the time since the last scrape);
  score = (max q - q) / (max q - min q) over the candidates, 1 when all are equal.
* ``kv-usage``: score = 1 - ``kv_cache_usage_perc``.
* ``in-flight``: l = max(gateway in-flight, engine running + waiting); score = (max l - l) / (max l - min l).

Inputs: the `EndpointView` gauges. Example: ``scorers: [{name: queue-depth, weight: 2}, {name: kv-usage}]``
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import EndpointView, RequestInfo, Scorer, endpoint_load

__all__ = ["InFlight", "KvUsage", "QueueDepth", "spread"]


def spread(loads: Sequence[float]) -> list[float]:
    """Min-max normalised inverse load: the least loaded scores 1, the most loaded 0; all equal -> all 1."""
    low, high = min(loads), max(loads)
    if high <= low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


class QueueDepth(Scorer, name="queue-depth"):
    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        del request  # Unused.
        return spread([max(e.waiting, e.in_flight - e.max_num_seqs) for e in endpoints])


class KvUsage(Scorer, name="kv-usage"):
    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        del request  # Unused.
        return [1.0 - e.kv_usage for e in endpoints]


class InFlight(Scorer, name="in-flight"):
    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]:
        del request  # Unused.
        return spread([endpoint_load(e) for e in endpoints])
