"""Fault injection: the pure policy, and each fault through the HTTP server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from engine_sim.faults import FaultPolicy, FaultSpec
from tests.engine_sim.builders import make_request, make_scheduler, run_until_idle
from tests.engine_sim.conftest import StartSim
from tests.support.wait import async_wait_for

CHAT = "/v1/chat/completions"
BODY = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (FaultSpec(), ["ok", "ok", "ok"]),
        (FaultSpec(crash_after_requests=2), ["ok", "ok", "crash"]),
        (FaultSpec(error_rate=1.0, error_status=503), ["503", "503", "503"]),
    ],
)
def test_policy_decides_per_request(spec: FaultSpec, expected: list[str]) -> None:
    policy = FaultPolicy(spec, seed=1)
    seen = []
    for _ in expected:
        action = policy.on_request()
        seen.append("crash" if action.crash else str(action.error.status) if action.error else "ok")
    assert seen == expected


def test_error_rate_is_seeded_and_close_to_the_fraction() -> None:
    policy, again = FaultPolicy(FaultSpec(error_rate=0.3), seed=5), FaultPolicy(FaultSpec(error_rate=0.3), seed=5)
    a = [policy.on_request().error is not None for _ in range(2000)]
    b = [again.on_request().error is not None for _ in range(2000)]
    assert a == b and 0.25 < sum(a) / len(a) < 0.35


def test_slowdown_multiplies_engine_time() -> None:
    ends = []
    for slowdown in (1.0, 3.0):
        sched = make_scheduler(slowdown=slowdown)
        sched.add(make_request(200, max_tokens=20), 0.0)
        ends.append(run_until_idle(sched)[0])
    assert ends[1] == pytest.approx(3 * ends[0])


async def test_error_rate_fails_requests_with_the_configured_status(start_sim: StartSim) -> None:
    sim = await start_sim(faults=FaultSpec(error_rate=1.0, error_status=429))
    response = await sim.client.post(CHAT, json=BODY)
    assert response.status_code == 429 and response.json()["error"]["code"] == 429


async def test_crash_after_requests_kills_the_engine(start_sim: StartSim) -> None:
    sim = await start_sim(faults=FaultSpec(crash_after_requests=1))
    assert (await sim.client.post(CHAT, json=BODY)).status_code == 200
    crashed = await sim.client.post(CHAT, json=BODY)
    assert crashed.status_code == 500 and crashed.json()["error"]["type"] == "InternalServerError"
    assert (await sim.client.get("/health")).status_code == 503
    assert sim.crashes == ["x"]


async def test_crash_fails_in_flight_streams_in_band(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=1.0, faults=FaultSpec(crash_after_requests=1))
    body = {**BODY, "max_tokens": 2000, "stream": True}
    lines: list[str] = []

    async def read() -> None:
        async with sim.client.stream("POST", CHAT, json=body) as response:
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)

    reader = asyncio.create_task(read())
    await async_wait_for(lambda: len(lines) >= 2, timeout_s=10, interval_s=0.005, what="two streamed lines")
    await sim.client.post(CHAT, json=BODY)  # the second request crashes the engine
    await asyncio.wait_for(reader, 5)
    assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2]


async def test_hang_accepts_and_never_answers(start_sim: StartSim) -> None:
    sim = await start_sim(faults=FaultSpec(hang=True))
    with pytest.raises(httpx.ReadTimeout):
        await sim.client.get("/health", timeout=0.3)
