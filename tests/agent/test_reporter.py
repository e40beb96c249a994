"""Load derivation from scrapes (pure) and the push loop's behaviour when the control plane goes away."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from agent.control import ControlClient
from agent.metrics import AgentMetrics
from agent.reporter import NO_LOAD, Load, LoadTracker, Reporter
from fleet.protocol.promtext import EngineMetrics
from fleet.protocol.wire import LoadReport
from tests.agent.receiver import Receiver
from tests.support.wait import async_wait_for

BOUNDS = (0.05, 0.1, 0.5, 1.0, float("inf"))


def scrape(gen_tokens: float, ttft_counts: tuple[float, ...] = (0, 0, 0, 0, 0), running: float = 2) -> EngineMetrics:
    return EngineMetrics(
        running=running, waiting=1, kv_usage=0.25, preemptions=0, prompt_tokens=0,
        generation_tokens=gen_tokens, prefix_queries=0, prefix_hits=0,
        ttft_buckets=list(zip(BOUNDS, ttft_counts, strict=True)),
    )  # fmt: skip


def test_first_scrape_has_gauges_but_no_rates() -> None:
    load = LoadTracker().observe(10.0, scrape(100))
    assert (load.running, load.waiting, load.kv_usage) == (2, 1, 0.25)
    assert load.tokens_per_s is None and load.in_flight == 3


def test_tokens_per_second_from_counter_deltas() -> None:
    tracker = LoadTracker()
    tracker.observe(10.0, scrape(100))
    assert tracker.observe(12.0, scrape(400)).tokens_per_s == pytest.approx(150.0)


def test_counter_reset_restarts_the_deltas() -> None:
    tracker = LoadTracker()
    tracker.observe(10.0, scrape(1000))
    assert tracker.observe(11.0, scrape(5)).tokens_per_s is None
    assert tracker.observe(12.0, scrape(55)).tokens_per_s == pytest.approx(50.0)


def test_failed_scrape_is_unknown_not_zero() -> None:
    tracker = LoadTracker()
    tracker.observe(10.0, scrape(100))
    assert tracker.observe(11.0, None) == NO_LOAD
    assert NO_LOAD.running is None and NO_LOAD.in_flight is None


def test_the_prefix_hit_rate_is_hit_tokens_over_queried_tokens_in_the_recent_window() -> None:
    tracker = LoadTracker(ttft_window_s=30.0)

    def at(queries: float, hits: float) -> EngineMetrics:
        return dataclasses.replace(scrape(0), prefix_queries=queries, prefix_hits=hits)

    assert tracker.observe(0.0, at(1000, 0)).prefix_hit_rate is None  # nothing to compare with yet
    assert tracker.observe(10.0, at(3000, 1500)).prefix_hit_rate == pytest.approx(0.75)
    assert tracker.observe(20.0, at(3000, 1500)).prefix_hit_rate == pytest.approx(0.75)
    assert tracker.observe(45.0, at(3000, 1500)).prefix_hit_rate is None  # no prompt in the last 30 s


def test_ttft_p99_covers_only_the_recent_window() -> None:
    tracker = LoadTracker(ttft_window_s=30.0)
    tracker.observe(0.0, scrape(0, (100, 100, 100, 100, 100)))  # an old slow-free history: all <= 50 ms
    tracker.observe(40.0, scrape(0, (100, 100, 100, 100, 100)))
    # in the last 30 s: 10 new observations, all between 0.5 and 1.0 s
    load = tracker.observe(50.0, scrape(0, (100, 100, 100, 110, 110)))
    assert load.ttft_p99_s is not None and 0.5 < load.ttft_p99_s <= 1.0


def test_no_recent_requests_means_no_ttft() -> None:
    tracker = LoadTracker()
    tracker.observe(0.0, scrape(0, (5, 5, 5, 5, 5)))
    assert tracker.observe(1.0, scrape(0, (5, 5, 5, 5, 5))).ttft_p99_s is None


class TickClock:
    """Real asyncio sleeps, shortened: the push loop runs in real time, quickly."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return 1_790_000_000.0 + self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(seconds / 100)


def make_report(load: Load) -> LoadReport:
    return LoadReport(
        replica="r0", pool="p", engine_url="http://e", state="ready", running=load.running,
        model="m", engine_version="v", ts=0.0,
    )  # fmt: skip


async def test_reports_back_off_while_the_control_plane_is_down_and_resume(receiver: Receiver) -> None:
    async with httpx.AsyncClient() as http:
        reporter = Reporter(
            lambda: None, ControlClient(http, receiver.url, timeout_s=0.5), make_report, TickClock(),
            AgentMetrics("r0", "p"), interval_s=1.0, backoff_max_s=8.0,
        )  # fmt: skip
        task = asyncio.ensure_future(reporter.run())
        try:
            await async_wait_for(lambda: len(receiver.reports) >= 2, timeout_s=10, interval_s=0.01, what="two reports")
            assert receiver.reports[-1].running is None  # no engine: load unknown
            port = receiver.port
            await receiver.stop()
            await async_wait_for(
                lambda: reporter.consecutive_push_failures >= 4,
                timeout_s=10,
                interval_s=0.01,
                what="four failed pushes",
            )
            assert reporter.backoff.delay() == 8.0  # 1, 2, 4, then capped
            before = len(receiver.reports)
            await receiver.start(port)
            await async_wait_for(
                lambda: len(receiver.reports) > before, timeout_s=10, interval_s=0.01, what="a report after the restart"
            )
            await async_wait_for(
                lambda: reporter.consecutive_push_failures == 0,
                timeout_s=10,
                interval_s=0.01,
                what="pushes succeeding again",
            )
            assert reporter.backoff.delay() == 1.0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
