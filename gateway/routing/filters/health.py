"""Health filters: keep replicas that are ready, not ejected, and whose metrics are fresh.

* ``ready``: the replica answers its health check and is not draining (draining replicas leave at once).
* ``not-ejected``: drops replicas under passive outlier ejection (consecutive failures, growing backoff).
  The gateway adds it when the config leaves it out, so ejection always applies.
* ``fresh-metrics``: drops replicas whose last successful scrape is older than ``maxAgeS`` (default 5 s, > 0).
  Fails open: when no replica has fresh metrics, all pass (stale load beats no service).

Example: ``filters: [{name: ready}, {name: fresh-metrics, params: {maxAgeS: 2}}]``
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from fleet.spec.plugins import PluginParams
from gateway.routing.base import EndpointView, Filter, RequestInfo

__all__ = ["FreshMetrics", "NotEjected", "Ready"]


class Ready(Filter, name="ready"):
    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
        del request  # Unused.
        return [e for e in endpoints if e.ready]


class NotEjected(Filter, name="not-ejected"):
    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
        del request  # Unused.
        return [e for e in endpoints if not e.ejected]


class FreshMetrics(Filter, name="fresh-metrics"):
    class Params(PluginParams):
        max_age_s: float = Field(default=5.0, gt=0.0)
        """Metrics older than this (seconds) drop the replica."""

    def __init__(self, params: Params | None = None) -> None:
        self.max_age_s = (params or self.Params()).max_age_s

    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]:
        del request  # Unused.
        fresh = [e for e in endpoints if e.metrics_age_s is not None and e.metrics_age_s <= self.max_age_s]
        return fresh or endpoints
