"""What a gateway exchanges with the control plane for canary rollouts: the alias weights it reads and applies,
and the per-pool answers it reports, none lost or counted twice when a report fails."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fleet.protocol.clock import SystemClock
from fleet.protocol.wire import LATENCY_EDGES_S, GatewayReport, PoolOutcomes
from gateway.admission import Admission
from gateway.alias_sync import AliasSync
from gateway.reporting import GatewayReporter, PoolTraffic
from gateway.routing.aliases import AliasTable


@dataclass
class FakeControlPlane:
    """Serves ``aliases`` at GET /v1/aliases and answers gateway reports with ``status``, keeping each body."""

    url: str = ""
    aliases: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    reports: list[GatewayReport] = field(default_factory=list)


@pytest.fixture
async def control_plane() -> AsyncIterator[FakeControlPlane]:
    fake = FakeControlPlane()

    async def aliases(request: web.Request) -> web.Response:
        del request  # Unused.
        return web.json_response({"aliases": fake.aliases, "generated_at": 1.0})

    async def report(request: web.Request) -> web.Response:
        fake.reports.append(GatewayReport.model_validate_json(await request.read()))
        return web.json_response({"accepted": True, "stale_after_s": 5.0}, status=fake.status)

    app = web.Application()
    app.router.add_get("/v1/aliases", aliases)
    app.router.add_post("/v1/gateway-reports", report)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


def chat(v1: int, v2: int) -> dict[str, Any]:
    return {"chat": {"pools": {"qwen-v1": v1, "qwen-v2": v2}, "fallback": None, "sticky": "session"}}


class Applied:
    """A gateway's `set_aliases`: keeps each table, refuses one naming a pool outside ``known``."""

    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.tables: list[AliasTable] = []

    def __call__(self, table: AliasTable) -> None:
        if any(p not in self.known for alias in table for p in alias.pools):
            raise ValueError("unknown pool")
        self.tables.append(table)


async def test_changed_weights_are_applied_once_and_a_refused_table_leaves_the_last(
    control_plane: FakeControlPlane,
) -> None:
    applied = Applied({"qwen-v1", "qwen-v2"})
    async with aiohttp.ClientSession() as session:
        sync = AliasSync(control_plane.url, session, applied, interval_s=1.0)
        control_plane.aliases = chat(90, 10)
        assert await sync.sync_once()
        assert not await sync.sync_once()  # unchanged: not applied again
        control_plane.aliases = chat(50, 50)
        assert await sync.sync_once()
        control_plane.aliases = {"chat": {"pools": {"nope": 1}, "fallback": None, "sticky": "none"}}
        assert not await sync.sync_once()
    assert [dict(t.aliases["chat"].weights) for t in applied.tables] == [
        {"qwen-v1": 90, "qwen-v2": 10},
        {"qwen-v1": 50, "qwen-v2": 50},
    ]


async def test_an_unreachable_control_plane_keeps_the_table_in_use() -> None:
    applied = Applied({"qwen-v1"})
    async with aiohttp.ClientSession() as session:
        sync = AliasSync("http://127.0.0.1:9", session, applied, interval_s=1.0, timeout_s=0.5)
        assert not await sync.sync_once()
    assert applied.tables == []


def test_pool_traffic_counts_outcomes_and_latency_buckets_until_reported() -> None:
    traffic = PoolTraffic()
    traffic.answered(200, 0.04, 0.012)
    traffic.answered(503, None, None)
    traffic.answered(429, None, None)
    sent = traffic.unreported()
    assert (sent.ok, sent.errors, sent.client_errors) == (1, 1, 1)
    assert sent.ttft[LATENCY_EDGES_S.index(0.05)] == 1 and sent.tpot[LATENCY_EDGES_S.index(0.015)] == 1
    traffic.answered(200, 0.04, None)
    traffic.reported(sent)
    after = traffic.unreported()
    assert (after.ok, after.errors, after.answered, after.tpot) == (1, 0, 1, [])  # only the one since the report


async def test_a_failed_report_leaves_its_answers_for_the_next(control_plane: FakeControlPlane) -> None:
    traffic = {"qwen-v1": PoolTraffic()}
    admission = {"qwen-v1": Admission(10, 1.0, SystemClock())}
    async with aiohttp.ClientSession() as session:
        reporter = GatewayReporter(control_plane.url, session, admission, traffic, SystemClock(), credential=None)
        traffic["qwen-v1"].answered(500, None, None)
        control_plane.status = 503
        assert not await reporter.push_once()
        traffic["qwen-v1"].answered(200, 0.1, None)
        control_plane.status = 200
        assert await reporter.push_once()
        assert await reporter.push_once()
    counts = [(r.outcomes.ok, r.outcomes.errors) for r in control_plane.reports]
    assert counts == [(0, 1), (1, 1), (0, 0)]  # the failed one's error came again, once; then nothing new
    assert control_plane.reports[1].outcomes.ttft[LATENCY_EDGES_S.index(0.1)] == 1


def test_bucket_counts_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="latency bucket"):
        PoolOutcomes.model_validate({"ok": 1, "ttft": [1, 2]})
