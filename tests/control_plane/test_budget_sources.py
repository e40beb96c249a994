"""Budget sources over real HTTP: ``prometheus`` against a loopback server answering in Prometheus' JSON shape,
``local`` against a gateway's admin /metrics; planned restart windows taken out of the counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from aiohttp import web

from control_plane.budget.sources import (
    BudgetQuery,
    BudgetSourceError,
    LocalSource,
    PrometheusSource,
    make_source,
    planned_intervals,
)
from fleet.slo.budget import pool_budgets
from fleet.spec.stack import SloSpec
from tests.control_plane.conftest import GatewayAdmin
from tests.support import stacks

MODEL = stacks.MODEL
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()
WINDOW_END = datetime(2026, 3, 10, 5, 0, tzinfo=UTC).timestamp()  # today's 03:00-05:00 restart window

# The window's counts, and those inside the restart window (what `increase(...[7200s] @ 05:00)` answers).
WINDOW = {"total": 10_000, "bad": 40, "0.25": 9000, "0.5": 9500, "+Inf": 9900}
PLANNED = {"total": 2000, "bad": 35, "0.25": 1500, "0.5": 1900, "+Inf": 1990}


def vector(*items: tuple[dict[str, str], float]) -> dict[str, object]:
    result = [{"metric": labels, "value": [NOW, str(value)]} for labels, value in items]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def answer(query: str) -> dict[str, object]:
    counts = PLANNED if " @ " in query else WINDOW
    if "by (le)" in query:
        return vector(*(({"le": le}, counts[le]) for le in ("0.25", "0.5", "+Inf")))
    for le in ("0.25", "0.5", "+Inf"):
        if f'le="{le}"' in query:
            return vector(({}, counts[le]))
    return vector(({}, counts["bad" if 'status=~"5.."' in query else "total"]))


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback Prometheus HTTP API answering instant queries from the tables above; yields (url, queries)."""
    queries: list[str] = []

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        text = str(form["query"])
        queries.append(text)
        if "broken" in text:
            error = {"status": "error", "errorType": "bad_data", "error": "parse error"}
            return web.json_response(error, status=400)
        assert float(str(form["time"])) == NOW
        return web.json_response(answer(text))

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", queries
    await runner.cleanup()


def windowed_pool_query(model: str = MODEL) -> BudgetQuery:
    pool = stacks.pool("local-sim", restartWindow={"enabled": True, "start": "03:00", "durationMinutes": 120})
    slo = SloSpec(budget_window="1d")
    return BudgetQuery(pool.name, model, slo, NOW, planned_intervals(pool, NOW - 86400, NOW))


async def test_prometheus_counts_leave_the_restart_window_out(prometheus: tuple[str, list[str]]) -> None:
    url, queries = prometheus
    query = windowed_pool_query()
    assert query.planned == ((WINDOW_END - 7200, WINDOW_END),)
    async with httpx.AsyncClient() as client:
        observed = await make_source("prometheus", {"url": url}, client).observe(query)

    assert f'sum(increase(llmfleet_gateway_requests_total{{model="{MODEL}"}}[86400s]))' in queries
    assert any(f"[7200s] @ {WINDOW_END:.3f}" in q for q in queries)
    budgets = {b.slo: b for b in pool_budgets(query.slo, observed)}
    # availability: 40 - 35 bad of 10,000 - 2,000: 0.0625% against 0.1%.
    assert (budgets["availability"].total, budgets["availability"].bad) == (8000, 5)
    assert budgets["availability"].spent == pytest.approx(0.625)
    assert budgets["availability"].status == "intervene"
    assert (budgets["availability"].excluded_requests, budgets["availability"].excluded_s) == (2000, 7200)
    # ttft at 300 ms, a fifth into (0.25, 0.5]: within 9000 + 100 of 9900 overall, 1500 + 80 of 1990 planned;
    # so 800 - 410 = 390 late of 7910, against 1%.
    assert budgets["ttft"].total == pytest.approx(7910)
    assert budgets["ttft"].bad == pytest.approx(390)
    assert budgets["ttft"].burn_rate == pytest.approx(390 / 7910 / 0.01)


async def test_prometheus_errors_name_the_query(prometheus: tuple[str, list[str]]) -> None:
    url, _ = prometheus
    async with httpx.AsyncClient() as client:
        source = make_source("prometheus", {"url": url}, client)
        with pytest.raises(BudgetSourceError, match="parse error"):
            await source.observe(windowed_pool_query(model="broken"))


async def test_an_unreachable_prometheus_is_a_source_error() -> None:
    async with httpx.AsyncClient() as client:
        source = PrometheusSource(PrometheusSource.Params(url="http://127.0.0.1:9", timeout_s=2), client)
        with pytest.raises(BudgetSourceError, match="127.0.0.1:9"):
            await source.observe(windowed_pool_query())


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("graphite", {}, "unknown budget source 'graphite'; sources: local, prometheus"),
        ("prometheus", {}, "parameters: timeoutS, url"),
        ("prometheus", {"url": "ftp://x"}, "should match pattern"),
        ("local", {"url": "http://x"}, "parameters: none"),
    ],
)
def test_an_unknown_source_or_parameter_lists_what_is_valid(name: str, params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make_source(name, params, httpx.AsyncClient())


async def test_local_counts_exclude_minutes_inside_a_planned_window(gateway_admin: GatewayAdmin) -> None:
    url = f"http://127.0.0.1:{gateway_admin.port}/metrics"
    requests, ttft = gateway_admin.metrics.requests, gateway_admin.metrics.ttft
    slo = SloSpec(budget_window="1h")
    t0 = 1_000_020.0
    planned = ((t0 + 60, t0 + 120),)  # the second scrape's minute falls inside

    def at(now: float) -> BudgetQuery:
        return BudgetQuery("qwen-7b", MODEL, slo, now, planned, (url,))

    async with httpx.AsyncClient() as client:
        source = LocalSource(LocalSource.Params(), client)
        requests.labels("demo", MODEL, "200").inc(100)  # before the baseline
        assert (await source.observe(at(t0))).covered_s == 0
        requests.labels("demo", MODEL, "503").inc(30)  # failures during the planned restart
        await source.observe(at(t0 + 60))
        requests.labels("demo", MODEL, "200").inc(999)
        requests.labels("demo", MODEL, "503").inc(1)
        for _ in range(10):
            ttft.labels("demo", MODEL).observe(0.4)
        observed = await source.observe(at(t0 + 180))

    availability = observed.tallies["availability"]
    assert (availability.window.total, availability.window.bad) == (1030, 31)
    assert (availability.excluded.total, availability.excluded.bad) == (30, 30)
    assert (observed.covered_s, observed.excluded_s) == (180, 60)
    late = observed.tallies["ttft"].window
    assert late.total == 10 and late.bad == pytest.approx(8)  # 300 ms is a fifth into (0.25, 0.5]: 2 of 10 within
    budgets = {b.slo: b for b in pool_budgets(slo, observed)}
    assert (budgets["availability"].total, budgets["availability"].bad) == (1000, 1)


async def test_local_counts_survive_a_gateway_restart(gateway_admin: GatewayAdmin) -> None:
    url = f"http://127.0.0.1:{gateway_admin.port}/metrics"
    requests = gateway_admin.metrics.requests
    slo = SloSpec(budget_window="1h")
    async with httpx.AsyncClient() as client:
        source = LocalSource(LocalSource.Params(), client)
        requests.labels("demo", MODEL, "200").inc(500)
        await source.observe(BudgetQuery("p", MODEL, slo, 1000.0, (), (url,)))
        requests.labels("demo", MODEL, "200").inc(100)
        await source.observe(BudgetQuery("p", MODEL, slo, 1060.0, (), (url,)))
        requests.clear()  # the gateway restarted: its counters start again from zero
        requests.labels("demo", MODEL, "503").inc(7)
        observed = await source.observe(BudgetQuery("p", MODEL, slo, 1120.0, (), (url,)))
    window = observed.tallies["availability"].window
    assert (window.total, window.bad) == (107, 7)
