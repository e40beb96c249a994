"""Gateway reports at the control plane: staleness (unknown, never zero), aggregation over gateways, the
scale-down block, and the endpoint over real HTTP feeding the decision inputs."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.loop import gateway_demand
from control_plane.reports import GatewayRegistry
from control_plane.scaling.guardrails import GuardrailState, apply_guardrails
from control_plane.scaling.policies import Proposal
from tests.control_plane.builders import autoscaling, context, gateway_report, ready, report
from tests.control_plane.conftest import Served

POOL = "qwen-7b"
STALE_S = 5.0


@pytest.mark.parametrize(
    ("case", "gateways", "expected"),
    [
        ("none ever reported: unknown", [], (None, None, 0)),
        ("fresh", [("a", 1.0, 7, 12.5)], (7.0, 12.5, 0)),
        ("two fresh gateways add up", [("a", 1.0, 7, 12.5), ("b", 4.9, 3, 2.5)], (10.0, 15.0, 0)),
        ("stale: unknown, not zero", [("a", 6.0, 7, 12.5)], (None, None, 1)),
        ("one stale of two: a lower bound, flagged", [("a", 1.0, 7, 12.5), ("b", 6.0, 50, 99.0)], (7.0, 12.5, 1)),
        ("long silent: forgotten", [("a", 20 * STALE_S + 1, 7, 12.5)], (None, None, 0)),
    ],
)
def test_gateway_staleness_table(
    case: str, gateways: list[tuple[str, float, int, float]], expected: tuple[Any, Any, int]
) -> None:
    registry = GatewayRegistry(STALE_S)
    now = 1000.0
    for name, age, waiting, rate in gateways:
        registry.record(gateway_report(name, waiting=waiting, arrived_per_s=rate, ts=0.0), now - age)
    assert gateway_demand(registry.seen(POOL, now)) == expected, case
    assert gateway_demand(registry.seen("other-pool", now)) == (None, None, 0)


@pytest.mark.parametrize(("stale", "target"), [(0, 2), (1, 3)])
def test_a_stale_gateway_blocks_scale_down(stale: int, target: int) -> None:
    ctx = context(*[ready(n) for n in "abc"], gateways_stale=stale)
    cfg = autoscaling(scale_down_stabilization_s=0.0)
    verdict = apply_guardrails(ctx, Proposal(1.0, "idle"), cfg, GuardrailState(below_since=0.0))
    assert verdict.target == target
    assert ("gateway report(s) stale" in verdict.reason) == bool(stale)


async def post_gateway(s: Served, **load: Any) -> None:
    body = gateway_report(ts=s.clock.now, **load).model_dump(mode="json")
    response = await s.http.post("/v1/gateway-reports", json=body)
    assert response.status_code == 200, response.text


async def post_replica(s: Served, replica: str, **load: Any) -> None:
    response = await s.http.post("/v1/reports", json=report(replica, ts=s.clock.now, **load).model_dump(mode="json"))
    assert response.status_code == 200, response.text


async def test_gateway_queue_reaches_decisions_then_goes_stale(served: Served) -> None:
    await post_replica(served, "a", waiting=2, running=8)
    await post_gateway(served, waiting=30, in_flight=10, arrived_per_s=5.0, admitted_per_s=4.0)
    [decision] = await served.loop.tick()
    assert decision.kind == "scale-up"  # (2 + 30) waiting / 4 per replica: the gateway's queue counts
    logged = (await served.http.get("/v1/decisions", params={"pool": POOL})).json()["decisions"][-1]
    assert logged["inputs"]["gateway_waiting"] == 30 and logged["inputs"]["queue_depth"] == 32
    assert logged["inputs"]["request_rate"] == 5.0 and logged["inputs"]["per_replica_qps"] > 0
    assert logged["inputs"]["gateways_stale"] == 0

    served.clock.now += STALE_S + 1  # the gateway goes silent; the replica keeps reporting
    await post_replica(served, "a", waiting=0, running=1)
    [decision] = await served.loop.tick()
    inputs = decision.inputs
    assert inputs["gateway_waiting"] is None and inputs["request_rate"] is None and inputs["gateways_stale"] == 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (
            {
                "gateway": "g",
                "pool": "nope",
                "waiting": 0,
                "in_flight": 0,
                "arrived_per_s": 0,
                "admitted_per_s": 0,
                "ts": 0,
            },
            404,
        ),
        (
            {
                "gateway": "g",
                "pool": POOL,
                "waiting": -1,
                "in_flight": 0,
                "arrived_per_s": 0,
                "admitted_per_s": 0,
                "ts": 0,
            },
            400,
        ),
        ({"gateway": "g", "pool": POOL}, 400),
    ],
)
async def test_gateway_report_errors_use_openai_error_json(served: Served, body: dict[str, Any], status: int) -> None:
    response = await served.http.post("/v1/gateway-reports", json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == status


async def test_each_gateway_is_answered_with_its_share_of_the_pools_admission_capacity(served: Served) -> None:
    async def share(gateway: str, **load: Any) -> tuple[float | None, int]:
        body = gateway_report(gateway, ts=served.clock.now, **load).model_dump(mode="json")
        answer = (await served.http.post("/v1/gateway-reports", json=body)).json()
        return answer["admission_share"], answer["gateways"]

    assert await share("gw-a", demand={5: 100}) == (None, 1)  # no ready replica: no capacity to divide yet
    for replica in ("r1", "r2"):
        await post_replica(served, replica)
    # Two ready replicas x (maxNumSeqs 64 + perReplicaThreshold 16) = 160: each gateway keeps 8 in reserve, gw-a's
    # 100 requests fit in the 144 left, and the last 44 are split evenly.
    assert await share("gw-b") == (pytest.approx(30 / 160), 2)
    assert await share("gw-a", demand={5: 100}) == (pytest.approx(130 / 160), 2)
    served.clock.now += STALE_S + 1  # gw-b goes silent: gw-a gets the whole pool
    await post_replica(served, "r1")
    await post_replica(served, "r2")
    assert await share("gw-a", demand={5: 100}) == (pytest.approx(1.0), 1)
