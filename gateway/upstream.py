"""Upstream: what a request's relay needs of the gateway to reach engines, and one attempt on one replica.

`StreamSession` (`gateway.streams`) reads the gateway only through the `Upstream` protocol: the routers and the
endpoint set, the HTTP session, the timeouts and the retry budget, and three verbs (begin an attempt, account a
failure, wait for the pool to change). `gateway.service.Gateway` is the one implementation; the relay module
imports this one, never the service, so the two form no import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import aiohttp

from fleet.spec.stack import GatewaySpec, PoolSpec
from gateway.endpoints import Endpoint, EndpointSet
from gateway.errors import UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.outcome import Outcome
from gateway.proxy import Timeouts
from gateway.retries import RetryBudget
from gateway.routing.base import EndpointView, Router

__all__ = ["Attempt", "Upstream"]


class Attempt:
    """One attempt on one replica: holds the replica's lease (its in-flight counts) from the start until `close`
    (idempotent), and adds the time in between to ``out.upstream_s``."""

    def __init__(
        self,
        endpoints: EndpointSet,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        view: EndpointView,
        pool: PoolSpec,
        out: Outcome,
    ) -> None:
        self._lease = endpoints.lease(view)
        self.ep = self._lease.__enter__()
        self._clock, self._out = clock, out
        self._gauge = metrics.child(metrics.in_flight, pool.name, self.ep.id)
        self._gauge.inc()
        self._started = clock()
        self._open = True
        out.attempts += 1
        out.replica = self.ep.id
        metrics.child(metrics.routed, pool.served_name, self.ep.id).inc()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._out.upstream_s += self._clock() - self._started
            self._gauge.dec()
            self._lease.__exit__(None, None, None)


class Upstream(Protocol):
    """The engines as one request's relay sees them (`gateway.service.Gateway` implements it)."""

    @property
    def config(self) -> GatewaySpec: ...
    @property
    def session(self) -> aiohttp.ClientSession: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def endpoints(self) -> EndpointSet: ...
    @property
    def routers(self) -> Mapping[str, Router]: ...
    @property
    def budget(self) -> RetryBudget: ...
    @property
    def timeouts(self) -> Timeouts: ...

    def begin_attempt(self, view: EndpointView, pool: PoolSpec, out: Outcome) -> Attempt:
        """Lease the replica behind ``view`` for one attempt."""
        ...

    def account(self, ep: Endpoint, exc: UpstreamError) -> None:
        """Count a failed attempt against ``ep`` (health ejection, metrics)."""
        ...

    async def pool_changed(self, pool: str, timeout_s: float) -> None:
        """Return when ``pool``'s replicas change, or after ``timeout_s``."""
        ...
