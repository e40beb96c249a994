"""ErrorBudgets: the control plane's error budget per pool, read from a budget source, and the freeze check.

    saw_gateway(gateway, metrics_url, now)   a gateway reported; the local source scrapes its admin /metrics
    await current(pool, now) -> PoolBudgets  the last budgets, read again first when older than ``refresh_s``
    refresh_later(now)                       the same refresh as a background task (never blocks the caller)
    decide(pool, change) -> (bool, reason)   may a risky change go ahead (`fleet.slo.budget.allows`)

Counts are read for every pool at once, at most every ``refresh_s``: on each lease call or budget read that finds
them older, and in the background on gateway reports (about once a second per gateway), so the local source
scrapes at a steady pace while gateways serve. A source that fails keeps the last budgets and records its error;
with none computed yet a change is allowed and the reason says the budget is unknown: an unreadable metric
store must not stop the fleet's maintenance. A prefill role pool has a budget of its own, read with its model's
counts as its decode pool's is (the sources count by model): restarting either role risks the same answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from control_plane.budget.sources import BudgetQuery, BudgetSource, BudgetSourceError, planned_intervals
from fleet.slo.budget import Budget, allows, pool_budgets
from fleet.spec.stack import FleetSpec

__all__ = ["ErrorBudgets", "PoolBudgets"]

log = logging.getLogger("llmfleet.autoscaler.budget")

GATEWAY_FORGET_S = 60.0  # a gateway that has not reported for this long is no longer scraped


@dataclass(frozen=True)
class PoolBudgets:
    at: float | None  # when the counts were read; None: never
    budgets: tuple[Budget, ...] = ()
    error: str | None = None  # the source's last failure, until a read succeeds


class ErrorBudgets:
    def __init__(self, spec: FleetSpec, source: BudgetSource, refresh_s: float = 15.0) -> None:
        self.spec = spec
        self.source = source
        self.refresh_s = refresh_s
        self.latest: dict[str, PoolBudgets] = {p.name: PoolBudgets(None) for p in spec.engine_pools}
        self._gateways: dict[str, tuple[str, float]] = {}  # gateway -> (admin metrics URL, last report)
        self._read_at = -math.inf
        self._lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None

    def saw_gateway(self, gateway: str, metrics_url: str, now: float) -> None:
        self._gateways[gateway] = (metrics_url, now)

    def query(self, pool: str, now: float) -> BudgetQuery:
        spec = self.spec.pool(pool)
        since = now - spec.slo.budget_window_s
        gateways = sorted({url for url, seen in self._gateways.values() if now - seen < GATEWAY_FORGET_S})
        return BudgetQuery(
            pool=pool,
            model=spec.served_name,
            slo=spec.slo,
            now=now,
            planned=planned_intervals(spec, since, now),
            gateways=tuple(gateways),
        )

    async def refresh(self, now: float) -> None:
        """Read every pool's counts from the source (one reader at a time)."""
        async with self._lock:
            if now - self._read_at < self.refresh_s:
                return  # another caller read them while this one waited
            self._read_at = now
            for pool in self.spec.engine_pools:
                try:
                    observed = await self.source.observe(self.query(pool.name, now))
                except BudgetSourceError as exc:
                    previous = self.latest[pool.name]
                    if previous.error is None:
                        log.warning("error budget of %s not read from %s: %s", pool.name, self.source.name, exc)
                    self.latest[pool.name] = PoolBudgets(previous.at, previous.budgets, str(exc))
                    continue
                self.latest[pool.name] = PoolBudgets(now, tuple(pool_budgets(pool.slo, observed)))

    async def current(self, pool: str, now: float) -> PoolBudgets:
        if self._background is not None and not self._background.done():
            await asyncio.shield(self._background)  # a read under way: its counts, not the ones before it
        if now - self._read_at >= self.refresh_s:
            await self.refresh(now)
        return self.latest[pool]

    def refresh_later(self, now: float) -> None:
        if now - self._read_at < self.refresh_s or (self._background is not None and not self._background.done()):
            return
        self._background = asyncio.get_running_loop().create_task(self.refresh(now))

    def decide(self, pool: str, change: str) -> tuple[bool, str]:
        """Whether ``change`` may go ahead on ``pool`` given the last budgets read (no I/O)."""
        known = self.latest[pool]
        if known.at is None and known.error is not None:
            return True, f"{change} allowed on {pool}: its error budget is unknown ({known.error})"
        return allows(pool, self.spec.pool(pool).slo, known.budgets, change)

    async def close(self) -> None:
        if self._background is not None:
            await asyncio.gather(self._background, return_exceptions=True)
