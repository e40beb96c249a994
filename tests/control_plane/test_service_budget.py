"""Error budgets in the control plane over real HTTP: counted from a gateway's admin /metrics (the local source),
read at GET /v1/pools/{pool}/budget, and freezing planned-restart leases once exhausted, in the shape the agent
reads as "not now, retry later"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from agent.control import ControlClient, LeaseRefused
from control_plane.api.app import create_app
from control_plane.budget.budget import ErrorBudgets
from control_plane.budget.sources import PrometheusSource
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import ApiServer, bind
from fleet.protocol.wire import PoolBudget
from tests.control_plane.builders import gateway_report
from tests.control_plane.conftest import Clock, GatewayAdmin, build_control_plane
from tests.support.stacks import MODEL

POOL = "qwen-7b"


@dataclass
class Budgeted:
    cp: ControlPlane
    clock: Clock
    http: httpx.AsyncClient
    admin: GatewayAdmin

    def answered(self, status: str, count: int) -> None:
        self.admin.metrics.requests.labels("demo", MODEL, status).inc(count)

    async def gateway_reports(self) -> None:
        """The gateway's report (it sends one a second): the control plane scrapes the gateways that report."""
        report = gateway_report(ts=self.clock.now).model_dump(mode="json")
        assert (await self.http.post("/v1/gateway-reports", json=report)).status_code == 200

    async def budget(self) -> PoolBudget:
        response = await self.http.get(f"/v1/pools/{POOL}/budget")
        assert response.status_code == 200, response.text
        return PoolBudget.model_validate_json(response.content)


async def serve(admin: GatewayAdmin, freeze: bool) -> AsyncIterator[Budgeted]:
    clock = Clock()
    overrides = {
        "gateway.adminPort": admin.port,  # where the control plane scrapes the gateway that reports
        "pools.0.slo.budgetWindow": "1h",
        "pools.0.slo.freezeOnExhaustedBudget": freeze,
    }
    cp, _, dry = build_control_plane(clock, **overrides)
    server = ApiServer(create_app(cp), bind("127.0.0.1", 0))
    await server.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5.0) as http:
        yield Budgeted(cp, clock, http, admin)
    await cp.close()
    await dry.close()
    await server.stop()


@pytest.fixture
async def frozen(gateway_admin: GatewayAdmin) -> AsyncIterator[Budgeted]:
    async for served in serve(gateway_admin, freeze=True):
        yield served


@pytest.fixture
async def unfrozen(gateway_admin: GatewayAdmin) -> AsyncIterator[Budgeted]:
    async for served in serve(gateway_admin, freeze=False):
        yield served


async def spend_the_budget(s: Budgeted) -> None:
    """1,000 good answers, then 500 5xx: a third failed against 0.1% allowed, over 11 of the window's 60 minutes."""
    s.answered("200", 1000)  # before the first scrape: the baseline, not counted
    await s.gateway_reports()
    assert (await s.budget()).computed_at == s.clock.now  # the first scrape
    s.clock.now += 60
    s.answered("200", 1000)
    await s.gateway_reports()
    assert (await s.budget()).slos[0].total == 1000
    s.clock.now += 600
    s.answered("503", 500)
    await s.gateway_reports()


async def lease(s: Budgeted, replica: str) -> httpx.Response:
    return await s.http.post("/v1/leases/restart", json={"pool": POOL, "replica": replica})


async def test_a_lease_is_granted_while_budget_is_left(frozen: Budgeted) -> None:
    frozen.answered("200", 1000)
    await frozen.gateway_reports()
    await frozen.budget()
    frozen.clock.now += 30
    frozen.answered("200", 5000)
    frozen.answered("503", 1)  # 1 of 5,001: 0.02% against 0.1%, a fifth of the rate, for 30 s of an hour
    await frozen.gateway_reports()

    response = await lease(frozen, "a")
    assert response.status_code == 200, response.text
    budget = await frozen.budget()
    availability = budget.slos[0]
    assert (availability.slo, availability.total, availability.bad, availability.status) == (
        "availability",
        5001,
        1,
        "ok",
    )
    assert availability.burn_rate == pytest.approx(0.2 / 1.0005, rel=1e-3)
    assert availability.spent == pytest.approx(availability.burn_rate / 120, rel=1e-3)
    assert budget.allows_changes and budget.source == "local"


async def test_an_exhausted_budget_refuses_the_lease_with_a_reason_the_agent_retries_on(frozen: Budgeted) -> None:
    await spend_the_budget(frozen)

    response = await lease(frozen, "b")
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("conflict_error", 409, "pool")
    assert "error budget is exhausted" in error["message"] and "availability" in error["message"]

    async with httpx.AsyncClient() as client:
        with pytest.raises(LeaseRefused, match="error budget"):
            await ControlClient(client, str(frozen.http.base_url)).acquire_lease(POOL, "b", None)

    budget = await frozen.budget()
    by_slo = {b.slo: b for b in budget.slos}
    # 500 of 1,500 failed: 333x the allowed 0.1%, for 660 s of a 3,600 s window.
    assert by_slo["availability"].burn_rate == pytest.approx(1000 / 3, rel=1e-6)
    assert by_slo["availability"].spent == pytest.approx(1000 / 3 * 660 / 3600, rel=1e-6)
    assert by_slo["availability"].status == "exhausted" and not budget.allows_changes

    decisions = (await frozen.http.get("/v1/decisions", params={"pool": POOL})).json()["decisions"]
    freeze = decisions[-1]
    assert (freeze["kind"], freeze["change"], freeze["policy"]) == ("freeze", "restart", "error-budget")
    assert [d["kind"] for d in decisions].count("freeze") == 1  # refused twice, logged once
    assert "error budget is exhausted" in freeze["reason"]

    metrics = (await frozen.http.get("/metrics")).text
    assert f'llmfleet_error_budget_spent{{pool="{POOL}",slo="availability"}}' in metrics
    assert f'llmfleet_restart_leases_refused_total{{pool="{POOL}"}} 2.0' in metrics


async def test_freeze_off_grants_the_lease_despite_an_exhausted_budget(unfrozen: Budgeted) -> None:
    await spend_the_budget(unfrozen)
    response = await lease(unfrozen, "b")
    assert response.status_code == 200, response.text
    budget = await unfrozen.budget()
    assert budget.slos[0].status == "exhausted" and budget.allows_changes and not budget.freeze


async def test_budget_of_an_unknown_pool_is_404(frozen: Budgeted) -> None:
    response = await frozen.http.get("/v1/pools/nope/budget")
    assert response.status_code == 404 and response.json()["error"]["param"] == "pool"


async def test_a_rollout_asks_the_same_question_and_is_refused_the_same_way(frozen: Budgeted) -> None:
    await spend_the_budget(frozen)
    allowed, reason = await frozen.cp.budget_allows(POOL, "rollout")
    assert not allowed and reason.startswith(f"rollout refused on pool {POOL!r}: its error budget is exhausted")
    decisions = (await frozen.http.get("/v1/decisions", params={"pool": POOL})).json()["decisions"]
    assert (decisions[-1]["kind"], decisions[-1]["change"]) == ("freeze", "rollout")


async def test_a_source_that_cannot_be_read_leaves_changes_allowed_and_says_so() -> None:
    clock = Clock()
    async with httpx.AsyncClient() as client:
        dead = PrometheusSource(PrometheusSource.Params(url="http://127.0.0.1:9", timeout_s=2), client)
        cp, _, dry = build_control_plane(clock)
        cp.budgets = ErrorBudgets(cp.spec, dead)
        allowed, reason = await cp.budget_allows(POOL, "restart")
        await cp.close()
        await dry.close()
    assert allowed and "error budget is unknown" in reason and "127.0.0.1:9" in reason
    assert cp.budgets.latest[POOL].error is not None and cp.budgets.latest[POOL].at is None
