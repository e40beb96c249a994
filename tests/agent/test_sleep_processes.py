"""Sleep mode with real processes: an agent and its simulated engine, the real control plane, a gateway."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from engine_sim.sleep import WakeTiming
from fleet.capacity.catalog import MODELS
from fleet.spec.loader import load_spec
from gateway.settings import GatewaySettings
from tests.agent.conftest import AgentProc
from tests.gateway.conftest import serve
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, write_stack as write_stack_file
from tests.support.wait import async_wait_for, wait_for

pytestmark = pytest.mark.slow

REPORT_INTERVAL_S = 1.0
SLEEPY = {
    "pools.0.engine.sleepMode": True,
    "pools.0.engine.sim": {"startupSeconds": 0.3, "timeScale": 1.0, "gpuProfile": "a100-80gb"},
    "pools.0.coldStartSeconds": 20,
    "pools.0.drain": {"graceSeconds": 12, "propagationSeconds": 0.5},
    "controlPlane.reportIntervalS": REPORT_INTERVAL_S,
}
# The simulator's calibrated level-1 wake of Qwen2.5-7B on an A100 at time scale 1 (docs/engine-simulator.md).
WAKE_S = WakeTiming(MODELS["Qwen/Qwen2.5-7B-Instruct"].parameters * 2, 22.8e9).move_s(copies_weights=True)
GOLD = {"Authorization": f"Bearer {KEYS['gold']}"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def finished_requests(engine_url: str) -> float:
    """Requests the engine finished, whatever their reason (``vllm:request_success_total``)."""
    text = httpx.get(f"{engine_url}/metrics", timeout=2.0, trust_env=False).text
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.MULTILINE))


def engine_asleep(engine_url: str) -> bool:
    """The engine says it sleeps, and its first sleep has finished (the weights are in host memory)."""
    if not httpx.get(f"{engine_url}/is_sleeping", timeout=2.0, trust_env=False).json()["is_sleeping"]:
        return False
    metrics = httpx.get(f"{engine_url}/metrics", timeout=2.0, trust_env=False).text
    return 'vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"} 1.0' in metrics


def state_is(agent: AgentProc, state: str) -> bool:
    return bool(agent.status()["state"] == state)


@pytest.fixture
def sleepy_stack(tmp_path: Path) -> Callable[..., Path]:
    def write(**overrides: Any) -> Path:
        return write_stack_file(tmp_path / "Pulumi.sleeptest.yaml", "gateway", **{**SLEEPY, **overrides})

    return write


async def test_a_sleeping_engine_gets_nothing_from_the_gateway_and_serves_again_soon_after_the_wake(
    sleepy_stack: Callable[..., Path], start_agent: Callable[..., AgentProc], start_control_plane: Callable[..., Proc]
) -> None:
    stack = sleepy_stack()
    cp = start_control_plane(stack)
    agent = await asyncio.to_thread(start_agent, stack, "r0", cp.url)
    status = agent.status()
    engine_url, argv = status["engine_url"], status["engine"]["argv"]
    assert "--enable-sleep-mode" in argv
    settings = GatewaySettings(spec=load_spec(stack).spec, control_plane=cp.url, access_log=False, routing_seed=1)
    async with serve(settings) as (url, gateway), aiohttp.ClientSession() as session:

        async def chat() -> int:
            async with session.post(url + "/v1/chat/completions", json=CHAT, headers=GOLD) as resp:
                await resp.read()
                return resp.status

        await async_wait_for(lambda: gateway.endpoints.routable("qwen-7b") == 1, timeout_s=20, what="routable")
        assert await chat() == 200
        assert agent.post("/sleep").status_code == 202
        await asyncio.to_thread(wait_for, lambda: state_is(agent, "sleeping"), timeout_s=5, what="sleeping")
        await asyncio.to_thread(
            wait_for, lambda: engine_asleep(engine_url), timeout_s=20, what="engine asleep", diagnostics=agent.tail
        )
        finished_asleep = finished_requests(engine_url)  # the clients' request and the check before the sleep
        assert gateway.endpoints.routable("qwen-7b") == 0
        statuses = [await chat() for _ in range(5)]
        assert all(s == 503 for s in statuses), statuses

        started = time.monotonic()
        assert agent.post("/wake").status_code == 202
        await asyncio.to_thread(
            wait_for, lambda: agent.readyz() == 200, timeout_s=10, interval_s=0.02, what="ready after the wake"
        )
        ready_s = time.monotonic() - started

        async def served() -> bool:
            return await chat() == 200

        await async_wait_for(served, timeout_s=WAKE_S + REPORT_INTERVAL_S + 1.0, interval_s=0.02, what="served")
        served_s = time.monotonic() - started
    # Asleep, nothing reached the engine; after the wake only the agent's check did, then the one served request.
    assert finished_requests(engine_url) == finished_asleep + 2
    assert WAKE_S <= ready_s <= WAKE_S + REPORT_INTERVAL_S, (ready_s, WAKE_S)
    assert served_s <= WAKE_S + REPORT_INTERVAL_S + settings.spec.gateway.routing.scrape_interval_s, served_s
    after = agent.status()
    assert after["engine_pid"] == status["engine_pid"] and after["restarts"] == 0
    events = [t["event"] for t in after["transitions"]]
    assert events[-3:] == ["sleep", "wake", "woken"]
    print(f"wake: ready {ready_s:.3f} s, served through the gateway {served_s:.3f} s, calibrated {WAKE_S:.3f} s")


def test_a_wake_whose_check_answers_other_tokens_restarts_the_engine_cold(
    sleepy_stack: Callable[..., Path], start_agent: Callable[..., AgentProc]
) -> None:
    agent = start_agent(sleepy_stack(), "r0", None, "--engine-arg=--fault-wake-changes-tokens")
    first = agent.status()
    assert agent.post("/sleep").status_code == 202
    wait_for(lambda: engine_asleep(first["engine_url"]), timeout_s=20, what="engine asleep", diagnostics=agent.tail)
    assert agent.post("/wake").status_code == 202

    def restarted() -> dict[str, Any] | None:
        status = agent.status()
        return status if status["state"] == "ready" and status["restarts"] == 1 else None

    second = wait_for(restarted, timeout_s=40, what="ready after a cold restart", diagnostics=agent.tail)
    assert second["engine_pid"] != first["engine_pid"]
    events = [t["event"] for t in second["transitions"]]
    assert "wake_failed" in events and events[-3:] == ["respawn", "healthy", "warmed"]
    assert 'llmfleet_agent_engine_restarts_total{reason="wake_mismatch"} 1.0' in agent.get("/metrics").text
    assert "wake mismatch" in second["last_error"]


def test_sleep_is_refused_with_409_when_the_pool_has_no_sleep_mode(
    sleepy_stack: Callable[..., Path], start_agent: Callable[..., AgentProc]
) -> None:
    agent = start_agent(sleepy_stack(**{"pools.0.engine.sleepMode": False}))
    refused = agent.post("/sleep")
    assert refused.status_code == 409 and "sleepMode" in refused.json()["error"]["message"]
    assert "--enable-sleep-mode" not in agent.status()["engine"]["argv"]
    assert agent.readyz() == 200
