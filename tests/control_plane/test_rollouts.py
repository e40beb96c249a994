"""Canary rollouts in the control plane over real HTTP: started by an operator, judged each tick on what the
gateways report, rolled back or promoted on their own, the weights served to gateways, the baseline then sized
down to no replica; refused while the baseline's error budget is exhausted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from control_plane.actuators import ActuatorEnv, DryRun
from control_plane.api.app import create_app
from control_plane.loop import ControlLoop
from control_plane.plane import ControlPlane
from fleet.protocol.control_api import ApiServer, bind
from fleet.protocol.control_auth import ControlAuth, SharedSecret
from fleet.protocol.wire import LATENCY_EDGES_S, PoolOutcomes
from tests.control_plane.builders import gateway_report, report
from tests.control_plane.conftest import Clock, GatewayAdmin, ReportedOnly
from tests.support import stacks
from tests.support.stacks import MODEL

ROLLOUT = {"steps": [10, 50, 100], "bakeS": 3, "minSamples": 20, "tolerance": 0.1}


def latencies(value_s: float, count: int) -> list[int]:
    counts = [0] * (len(LATENCY_EDGES_S) + 1)
    counts[next(i for i, edge in enumerate(LATENCY_EDGES_S) if value_s <= edge)] = count
    return counts


def answers(ok: int, errors: int = 0, ttft_s: float = 0.05, tpot_s: float = 0.02) -> PoolOutcomes:
    return PoolOutcomes(ok=ok, errors=errors, ttft=latencies(ttft_s, ok), tpot=latencies(tpot_s, ok))


@dataclass
class Canary:
    cp: ControlPlane
    loop: ControlLoop
    clock: Clock
    http: httpx.AsyncClient
    dry: DryRun

    async def start(self, **headers: str) -> httpx.Response:
        return await self.http.post("/v1/rollouts", json={"alias": "chat", "candidate": "qwen-v2"}, headers=headers)

    async def gateways_saw(self, pool: str, outcomes: PoolOutcomes) -> None:
        body = gateway_report(pool=pool, ts=self.clock.now, outcomes=outcomes).model_dump(mode="json")
        assert (await self.http.post("/v1/gateway-reports", json=body)).status_code == 200

    async def weights(self) -> dict[str, int]:
        body = (await self.http.get("/v1/aliases")).json()
        pools: dict[str, int] = body["aliases"]["chat"]["pools"]
        return pools

    async def status(self) -> dict[str, Any]:
        response = await self.http.get("/v1/rollouts/chat")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def rollout_log(self) -> list[dict[str, Any]]:
        return [d.__dict__ for d in self.loop.decisions if d.kind == "rollout"]

    async def bake(self, baseline: PoolOutcomes, candidate: PoolOutcomes) -> None:
        """One step's window: both pools answer, the bake time passes, the loop ticks."""
        await self.gateways_saw("qwen-v1", baseline)
        await self.gateways_saw("qwen-v2", candidate)
        self.clock.now += 3.5
        await self.loop.tick()


async def serve(auth: ControlAuth | None = None, **overrides: Any) -> AsyncIterator[Canary]:
    clock = Clock()
    settings = {"aliases.chat.rollout": ROLLOUT, "autoscaling.scaleDownStabilizationS": 5.0, **overrides}
    spec = stacks.spec("local-canary", **settings)
    dry = DryRun(ReportedOnly(spec, ActuatorEnv(stack="local-canary", control_plane_url="http://unused")))
    cp = ControlPlane.build(spec, clock, dry)
    loop = cp.loop
    assert loop is not None
    server = ApiServer(create_app(cp, auth), bind("127.0.0.1", 0))
    await server.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5.0) as http:
        yield Canary(cp, loop, clock, http, dry)
    await cp.close()
    await dry.close()
    await server.stop()


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    async for served in serve():
        yield served


async def test_start_sets_the_first_step_and_gateways_read_the_weights(canary: Canary) -> None:
    assert await canary.weights() == {"qwen-v1": 95, "qwen-v2": 5}  # the stack's, before any rollout
    response = await canary.start()
    assert response.status_code == 200, response.text
    assert (response.json()["weight"], response.json()["phase"], response.json()["baseline"]) == (
        10,
        "baking",
        "qwen-v1",
    )
    assert await canary.weights() == {"qwen-v1": 90, "qwen-v2": 10}
    [logged] = canary.rollout_log()
    assert (logged["action"], logged["pool"], logged["weight_to"]) == ("start", "qwen-v2", 10)
    again = await canary.start()
    assert again.status_code == 409 and "is running" in again.json()["error"]["message"]


async def test_a_candidate_failing_a_fifth_of_its_requests_is_rolled_back_naming_the_error_rate(
    canary: Canary,
) -> None:
    await canary.start()
    await canary.bake(answers(200), answers(40, errors=10))
    status = await canary.status()
    assert status["phase"] == "rolled-back" and status["weight"] == 0
    assert await canary.weights() == {"qwen-v1": 100, "qwen-v2": 0}
    rollback = canary.rollout_log()[-1]
    assert rollback["action"] == "rollback"
    assert "error rate 20.00% on qwen-v2 against 0.00% on qwen-v1" in rollback["reason"]
    decisions = (await canary.http.get("/v1/decisions", params={"pool": "qwen-v2"})).json()["decisions"]
    rollouts = [d for d in decisions if d["kind"] == "rollout"]
    assert rollouts[-1]["action"] == "rollback" and rollouts[-1]["weights"] == {"qwen-v1": 100, "qwen-v2": 0}
    metrics = (await canary.http.get("/metrics")).text  # what a dashboard or an alert follows
    assert 'llmfleet_alias_weight{alias="chat",pool="qwen-v2"} 0.0' in metrics
    assert 'llmfleet_alias_weight{alias="chat",pool="qwen-v1"} 100.0' in metrics
    assert 'llmfleet_rollout_phase{alias="chat",candidate="qwen-v2",phase="rolled-back"} 1.0' in metrics
    assert 'llmfleet_rollout_phase{alias="chat",candidate="qwen-v2",phase="baking"} 0.0' in metrics


async def test_a_slower_candidate_is_rolled_back_naming_tpot(canary: Canary) -> None:
    await canary.start()
    await canary.bake(answers(200, tpot_s=0.02), answers(40, tpot_s=0.04))
    assert "TPOT p99" in canary.rollout_log()[-1]["reason"]
    assert (await canary.status())["phase"] == "rolled-back"


async def test_a_quiet_step_holds_and_says_how_many_requests_it_lacks(canary: Canary) -> None:
    await canary.start()
    await canary.bake(answers(200), answers(5))
    status = await canary.status()
    assert status["phase"] == "baking" and status["weight"] == 10
    assert "too few requests" in status["reason"] and "qwen-v2 5 of 20" in status["reason"]


async def test_a_good_candidate_is_promoted_and_the_baseline_scaled_down_to_no_replica(canary: Canary) -> None:
    await canary.start()
    await canary.bake(answers(200), answers(30))
    assert await canary.weights() == {"qwen-v1": 50, "qwen-v2": 50}
    await canary.bake(answers(100), answers(100))
    status = await canary.status()
    assert (status["phase"], status["weight"]) == ("promoted", 100)
    assert await canary.weights() == {"qwen-v1": 0, "qwen-v2": 100}
    assert [d["action"] for d in canary.rollout_log()] == ["start", "step", "promote"]

    # The baseline's idle replica: with replicas.min read as 0 it is drained once the stabilisation has passed.
    for _ in range(10):
        now = canary.clock.now
        canary.cp.registry.record(report("qwen-v1-0", pool="qwen-v1", model=MODEL, ts=now), now)
        await canary.gateways_saw("qwen-v1", PoolOutcomes())
        decisions = await canary.loop.tick()
        canary.clock.now += 1.0
    [baseline] = [d for d in decisions if d.pool == "qwen-v1"]
    downs = [d for d in canary.loop.decisions if d.pool == "qwen-v1" and d.kind == "scale-down"]
    assert downs and downs[-1].target == 0 and downs[-1].victims == ("qwen-v1-0",)  # type: ignore[attr-defined]
    assert baseline.target == 0


async def test_abort_takes_the_candidate_back_to_zero(canary: Canary) -> None:
    await canary.start()
    response = await canary.http.delete("/v1/rollouts/chat")
    assert response.status_code == 200 and response.json()["phase"] == "aborted"
    assert await canary.weights() == {"qwen-v1": 100, "qwen-v2": 0}
    assert (await canary.http.delete("/v1/rollouts/chat")).status_code == 409


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"alias": "nope", "candidate": "qwen-v2"}, 404, "alias"),
        ({"alias": "chat", "candidate": "nope"}, 400, "candidate"),
        ({"alias": "chat", "candidate": "qwen-small"}, 400, "candidate"),  # the alias's fallback
        ({"alias": "chat"}, 400, "candidate"),
    ],
)
async def test_a_rollout_that_cannot_run_is_refused_with_the_param_at_fault(
    canary: Canary, body: dict[str, str], status: int, param: str
) -> None:
    response = await canary.http.post("/v1/rollouts", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_starting_and_aborting_need_a_control_plane_credential() -> None:
    async for canary in serve(ControlAuth(SharedSecret("s3cret"))):
        assert (await canary.start()).status_code == 401
        assert (await canary.start(Authorization="Bearer gateway:s3cret")).status_code == 403
        assert (await canary.start(Authorization="Bearer control-plane:s3cret")).status_code == 200
        assert (await canary.http.delete("/v1/rollouts/chat")).status_code == 401
        assert (await canary.http.get("/v1/rollouts/chat")).status_code == 401  # reads need a credential too
        read = await canary.http.get("/v1/rollouts/chat", headers={"Authorization": "Bearer gateway:s3cret"})
        assert read.status_code == 200  # of any kind


async def test_an_exhausted_baseline_budget_refuses_the_start_and_logs_the_freeze(gateway_admin: GatewayAdmin) -> None:
    overrides = {"gateway.adminPort": gateway_admin.port, "pools.0.slo.budgetWindow": "1h"}
    async for canary in serve(**overrides):
        requests = gateway_admin.metrics.requests
        requests.labels("demo", MODEL, "200").inc(1000)
        await canary.gateways_saw("qwen-v1", PoolOutcomes())  # the control plane scrapes the gateways that report
        await canary.http.get("/v1/pools/qwen-v1/budget")
        canary.clock.now += 600
        requests.labels("demo", MODEL, "503").inc(500)
        await canary.gateways_saw("qwen-v1", PoolOutcomes())

        response = await canary.start()
        assert response.status_code == 409, response.text
        assert "error budget is exhausted" in response.json()["error"]["message"]
        assert await canary.weights() == {"qwen-v1": 95, "qwen-v2": 5}
        freezes = [d for d in canary.loop.decisions if d.kind == "freeze"]
        assert freezes and freezes[-1].pool == "qwen-v1"
