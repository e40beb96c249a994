"""Reporter: scrape the engine's ``/metrics`` about once a second and push load reports to the control plane.

Load derivation (`LoadTracker`, pure): gauges are read as-is; ``tokens_per_s`` is the generation-token counter
delta over the time between two scrapes; ``ttft_p99_s`` is the p99 of the TTFT histogram's bucket deltas over
the last ``ttft_window_s`` (recent, not lifetime), and so is ``prefix_hit_rate`` (prefix-cache hit tokens over
queried tokens, from vLLM's ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` counters). A failed
scrape yields a load of all None, never zeros, and a counter that went backwards (engine restarted) restarts the
deltas. Pushing runs in its own task (`fleet.protocol.push.push_loop`): an unreachable control plane is retried
with the shared exponential backoff (`fleet.protocol.push.Backoff`, at most ``backoff_max_s``) while the agent keeps
serving and scraping.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from agent.control import ControlClient, ControlPlaneUnavailable
from agent.engine_client import EngineClient
from agent.metrics import AgentMetrics
from fleet.protocol.clock import Clock
from fleet.protocol.promtext import EngineMetrics, diff_buckets, histogram_quantile
from fleet.protocol.push import Backoff, push_loop
from fleet.protocol.wire import LoadReport

__all__ = ["NO_LOAD", "Load", "LoadTracker", "Reporter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Load:
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    ttft_p99_s: float | None = None
    tokens_per_s: float | None = None
    prefix_hit_rate: float | None = None  # prompt tokens served from the prefix cache / prompt tokens, recent
    scraped_at: float | None = None  # monotonic time of the scrape; None when it failed

    @property
    def in_flight(self) -> float | None:
        if self.running is None or self.waiting is None:
            return None
        return self.running + self.waiting


NO_LOAD = Load()


class LoadTracker:
    """Turns successive scrapes into loads; keeps the recent scrapes the deltas need."""

    def __init__(self, ttft_window_s: float = 30.0) -> None:
        self.ttft_window_s = ttft_window_s
        self._history: deque[tuple[float, EngineMetrics]] = deque()

    def observe(self, now: float, metrics: EngineMetrics | None) -> Load:
        if metrics is None:
            return NO_LOAD
        previous = self._history[-1] if self._history else None
        if previous is not None and metrics.generation_tokens < previous[1].generation_tokens:
            self._history.clear()  # counters reset: a new engine process
            previous = None
        tokens_per_s = None
        if previous is not None and now > previous[0]:
            tokens_per_s = (metrics.generation_tokens - previous[1].generation_tokens) / (now - previous[0])
        while self._history and self._history[0][0] < now - self.ttft_window_s:
            self._history.popleft()
        ttft = hit_rate = None
        if self._history:
            oldest = self._history[0][1]
            recent = diff_buckets(metrics.ttft_buckets, oldest.ttft_buckets)
            ttft = histogram_quantile(recent, 0.99)
            queried = metrics.prefix_queries - oldest.prefix_queries
            hit_rate = (metrics.prefix_hits - oldest.prefix_hits) / queried if queried > 0 else None
            # A prefix counter reset between scrapes can take the ratio out of [0, 1], which reports may not say.
            hit_rate = None if hit_rate is None else min(1.0, max(0.0, hit_rate))
        self._history.append((now, metrics))
        return Load(
            waiting=metrics.waiting,
            running=metrics.running,
            kv_usage=min(1.0, max(0.0, metrics.kv_usage)),  # a fraction, as reports must say
            ttft_p99_s=ttft,
            tokens_per_s=tokens_per_s,
            prefix_hit_rate=hit_rate,
            scraped_at=now,
        )


class Reporter:
    """Two loops: scrape every ``interval_s`` into ``last_load``; push ``make_report(last_load)`` likewise."""

    def __init__(
        self,
        engine: Callable[[], EngineClient | None],
        control: ControlClient,
        make_report: Callable[[Load], LoadReport],
        clock: Clock,
        metrics: AgentMetrics,
        interval_s: float = 1.0,
        backoff_max_s: float = 10.0,
        ttft_window_s: float = 30.0,
    ) -> None:
        self._engine = engine
        self._control = control
        self._make_report = make_report
        self._clock = clock
        self._metrics = metrics
        self.interval_s = interval_s
        self.backoff = Backoff(interval_s, backoff_max_s)
        self.tracker = LoadTracker(ttft_window_s)
        self.last_load = NO_LOAD
        self.last_report: LoadReport | None = None
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Push as soon as possible (a state change the control plane and gateways should learn now)."""
        self._kick.set()

    async def scrape_once(self) -> Load:
        engine = self._engine()
        metrics: EngineMetrics | None = None
        if engine is not None:
            try:
                metrics = EngineMetrics.from_text(await engine.metrics())
                self._metrics.scrapes.labels("ok").inc()
            except Exception as exc:  # any failure means "load unknown", reported as None
                log.debug("engine scrape failed: %s", exc)
                self._metrics.scrapes.labels("error").inc()
        self.last_load = self.tracker.observe(self._clock.monotonic(), metrics)
        return self.last_load

    @property
    def consecutive_push_failures(self) -> int:
        return self.backoff.failures

    async def push_once(self) -> bool:
        report = self._make_report(self.last_load)
        try:
            await self._control.report(report)
        except ControlPlaneUnavailable as exc:
            self.backoff.record(False)
            failures = self.backoff.failures
            self._metrics.reports.labels("error").inc()
            if failures in (1, 10) or failures % 60 == 0:
                log.warning("load report not delivered (%d in a row): %s", failures, exc)
            return False
        failures = self.backoff.record(True)
        if failures:
            log.info("load reports delivered again after %d failures", failures)
        self.last_report = report
        self._metrics.reports.labels("ok").inc()
        return True

    async def scrape_loop(self) -> None:
        while True:
            await self.scrape_once()
            await self._clock.sleep(self.interval_s)

    async def push_loop(self) -> None:
        if self._control.base_url is None:
            return
        await push_loop(self.push_once, self.backoff, self._clock, wake=self._kick)

    async def run(self) -> None:
        await asyncio.gather(self.scrape_loop(), self.push_loop())
