"""The agent with real processes on loopback: a simulated engine, the real control plane, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.actuators.local_state import pid_alive
from tests.agent.conftest import AgentProc
from tests.support.procs import Proc
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
MODEL = "qwen2.5-7b-instruct"


def engine_health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code
    except httpx.HTTPError:
        return 0


def test_agent_is_ready_only_after_the_engine_warmed_up(write_stack: Callable[..., Path], start_agent) -> None:
    # A slowed engine makes the warm-up take long enough to watch /readyz stay 503 while /health is 200.
    stack = write_stack(**{"pools.0.engine.sim.startupSeconds": 1.0})
    agent: AgentProc = start_agent(stack, "r0", None, "--engine-arg=--fault-slowdown=150", wait_ready=False)
    samples: list[tuple[str, int, int]] = []

    def sample() -> bool:
        status = agent.status()
        health = engine_health(status["engine_url"]) if status["engine_pid"] else 0
        readyz = agent.get("/readyz")  # its body names the state the answer was made in
        samples.append((readyz.json()["state"], readyz.status_code, health))
        return readyz.status_code == 200

    wait_for(sample, timeout_s=40, interval_s=0.03, what="ready", diagnostics=agent.tail)
    states = [s for s, _, _ in samples]
    assert "starting" in states and "warming" in states
    assert all(code == 503 for state, code, _ in samples if state != "ready")
    assert any(state == "warming" and code == 503 and health == 200 for state, code, health in samples)
    status = agent.status()
    assert [t["event"] for t in status["transitions"]] == ["healthy", "warmed"]
    assert status["engine"]["kind"] == "sim" and status["model"] == MODEL and status["restarts"] == 0
    assert agent.get("/healthz").status_code == 200
    assert 'llmfleet_agent_state{state="ready"} 1.0' in agent.get("/metrics").text


async def _load(engine_url: str, stop: asyncio.Event, outcomes: list[str]) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=10.0, trust_env=False) as client:

        async def worker() -> None:
            while not stop.is_set():
                try:
                    r = await client.post(
                        "/v1/completions", json={"model": MODEL, "prompt": "hi " * 50, "max_tokens": 40}
                    )
                    outcomes.append(str(r.status_code))
                except httpx.HTTPError as exc:
                    outcomes.append(type(exc).__name__)
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(4)))


async def test_kill_9_under_load_restarts_the_engine_and_counts_it(write_stack, start_agent) -> None:
    agent: AgentProc = start_agent(write_stack())
    first = agent.status()
    stop, outcomes = asyncio.Event(), []
    load = asyncio.ensure_future(_load(first["engine_url"], stop, outcomes))
    await asyncio.to_thread(wait_for, lambda: outcomes.count("200") >= 4, timeout_s=20, what="load flowing")
    os.kill(first["engine_pid"], signal.SIGKILL)
    await asyncio.to_thread(wait_for, lambda: agent.readyz() != 200, timeout_s=10, what="not ready after the kill")

    def ready_again() -> dict[str, Any] | None:
        status = agent.status()
        return status if status["state"] == "ready" and status["restarts"] == 1 else None

    second = await asyncio.to_thread(
        wait_for, ready_again, timeout_s=40, what="ready again after the kill", diagnostics=agent.tail
    )
    stop.set()
    await load
    assert second["engine_pid"] != first["engine_pid"] and second["last_exit_code"] == -9
    events = [t["event"] for t in second["transitions"]]
    assert events[-4:] == ["engine_exited", "respawn", "healthy", "warmed"]
    assert 'llmfleet_agent_engine_restarts_total{reason="engine_exited"} 1.0' in agent.get("/metrics").text
    assert outcomes.count("200") >= 4


def test_crash_loop_ends_in_failed_until_an_operator_resets(write_stack, start_agent) -> None:
    stack = write_stack(**{"pools.0.engine.sim.startupSeconds": 0.2})
    # Every engine dies on its first request (the warm-up): a crash loop.
    agent: AgentProc = start_agent(
        stack, "r0", None, "--engine-arg=--fault-crash-after-requests=0", "--engine-arg=--fault-exit-delay=0.05",
        "--max-restarts", "2", "--crash-window", "120", wait_ready=False,
    )  # fmt: skip
    failed = wait_for(lambda: agent.status()["state"] == "failed", timeout_s=60, what="failed", diagnostics=agent.tail)
    assert failed
    status = agent.status()
    assert status["restarts"] == 2 and status["engine_pid"] is None and agent.readyz() == 503
    assert "llmfleet_agent_crash_loop 1.0" in agent.get("/metrics").text
    time.sleep(1.0)  # no further restarts while failed
    assert agent.status()["restarts"] == 2
    reset = agent.post("/reset")
    assert reset.status_code == 200
    wait_for(lambda: agent.status()["restarts"] == 3, timeout_s=20, what="restart after reset")
    refused = agent.post("/reset")
    if refused.status_code == 409:  # not failed (yet) again: an OpenAI-shaped error
        assert refused.json()["error"]["code"] == 409
    drain = agent.post("/drain")
    assert drain.status_code == 202 and drain.json()["accepted"] is True
    assert agent.wait(20) == 0


async def _stream(client: httpx.AsyncClient, first_chunk: asyncio.Event, counter: list[int]) -> list[str]:
    lines: list[str] = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 400, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                if not lines:
                    counter[0] += 1
                    if counter[0] == 20:
                        first_chunk.set()
                lines.append(line[6:])
    return lines


def _engine_client(engine_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=engine_url, timeout=30, limits=httpx.Limits(max_connections=40), trust_env=False)


async def _twenty_streams(client: httpx.AsyncClient) -> list[asyncio.Future[list[str]]]:
    """Twenty streams on the engine, returned once every one has started."""
    all_started, counter = asyncio.Event(), [0]
    streams = [asyncio.ensure_future(_stream(client, all_started, counter)) for _ in range(20)]
    await asyncio.wait_for(all_started.wait(), 20)
    return streams


async def test_sigterm_drains_twenty_streams_to_done_then_exits_zero(write_stack, start_agent) -> None:
    # grace 30 s -> the engine's --shutdown-timeout is 23 s: ample for streams of a few seconds on a slow machine
    stack = write_stack(**{"pools.0.drain": {"graceSeconds": 30, "propagationSeconds": 1.5}})
    agent: AgentProc = start_agent(stack)
    status = agent.status()
    async with _engine_client(status["engine_url"]) as client:
        streams = await _twenty_streams(client)
        running = [s for s in streams if not s.done()]
        assert len(running) == 20, "every stream must still be in flight at SIGTERM"
        agent.send(signal.SIGTERM)
        t0 = time.monotonic()
        await asyncio.to_thread(
            wait_for, lambda: agent.readyz() == 503, timeout_s=5, interval_s=0.01, what="readiness dropped"
        )
        assert time.monotonic() - t0 < 1.5  # inside the propagation delay: before the engine is told anything
        results = await asyncio.gather(*streams)
    for lines in results:
        assert lines[-1] == "[DONE]" and '"finish_reason":"length"' in "".join(lines).replace(" ", "")
    code = await asyncio.to_thread(agent.wait, 30)
    assert code == 0
    with pytest.raises(ProcessLookupError):
        os.kill(status["engine_pid"], 0)


async def test_kubernetes_termination_prestop_then_sigterm_drains_once_within_the_grace(
    write_stack, start_agent
) -> None:
    # The kubelet's order: the preStop hook (GET /prestop), then SIGTERM at once, SIGKILL at the grace.
    # grace 20 s, propagation 1 s -> the engine's --shutdown-timeout is 14 s; the drain must end inside 20 s.
    grace = 20.0
    stack = write_stack(**{"pools.0.drain": {"graceSeconds": grace, "propagationSeconds": 1.0}})
    agent: AgentProc = start_agent(stack)
    status = agent.status()
    async with _engine_client(status["engine_url"]) as client:
        streams = await _twenty_streams(client)
        t0 = time.monotonic()
        hook = agent.get("/prestop")
        assert hook.status_code == 200 and hook.json() == {"accepted": True, "state": "draining"}
        assert agent.readyz() == 503  # readiness fell with the hook, before SIGTERM
        agent.send(signal.SIGTERM)  # finds the drain under way: no second propagation wait
        results = await asyncio.gather(*streams)
        code = await asyncio.to_thread(agent.wait, grace)
    elapsed = time.monotonic() - t0
    assert code == 0
    assert elapsed < grace - 2, f"drain took {elapsed:.1f} s of a {grace:g} s grace"
    for lines in results:
        assert lines[-1] == "[DONE]"


def window_open_now() -> dict[str, Any]:
    start = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%H:%M")
    return {"enabled": True, "start": start, "durationMinutes": 60, "timezone": "UTC", "minUptimeHours": 0}


def test_three_agents_restart_in_turn_never_two_at_once(write_stack, start_agent, start_control_plane) -> None:
    pool = {
        "pools.0.restartWindow": {**window_open_now(), "maxUnavailable": 1},
        "pools.0.drain": {"graceSeconds": 10, "propagationSeconds": 0.3},
        "pools.0.replicas": {"min": 3, "max": 3},
    }
    stack = write_stack(**pool)
    cp: Proc = start_control_plane(stack)
    agents: list[AgentProc] = []
    for name in ("r0", "r1", "r2"):
        agents.append(start_agent(stack, name, cp.url, wait_ready=False))
    history: list[dict[str, Any]] = []
    holders_seen: list[list[str]] = []

    def all_restarted() -> bool:
        snapshot = cp.get("/v1/leases").json()
        holders_seen.append(sorted(snapshot["holders"].get("qwen-7b", {})))
        history[:] = snapshot["history"]
        statuses = [a.status() for a in agents]
        return all(s["restarts"] == 1 and s["state"] == "ready" for s in statuses) and not holders_seen[-1]

    wait_for(
        all_restarted,
        timeout_s=90,
        what="three planned restarts",
        diagnostics=lambda: "\n".join(a.tail(15) for a in agents),
    )
    assert max(len(h) for h in holders_seen) == 1
    assert all(len(event.get("holders", [])) <= 1 for event in history)
    grants = [e["replica"] for e in history if e["event"] == "grant"]
    assert sorted(grants) == ["r0", "r1", "r2"]
    # in turn: each grant is followed by that replica's release before the next grant
    order = [(e["event"], e["replica"]) for e in history if e["event"] in ("grant", "release")]
    assert order == [(kind, r) for g in grants for kind, r in (("grant", g), ("release", g))]


def test_control_plane_down_agent_keeps_serving_and_reporting_resumes(
    write_stack, start_agent, start_control_plane
) -> None:
    stack = write_stack()
    cp: Proc = start_control_plane(stack)
    agent: AgentProc = start_agent(stack, "r0", cp.url)

    def listed() -> bool:
        replicas = cp.get("/v1/pools/qwen-7b/replicas").json()["replicas"]
        return any(r["replica"] == "r0" and r["state"] == "ready" and not r["stale"] for r in replicas)

    wait_for(listed, timeout_s=20, what="first report")
    port = cp.port
    cp.kill()
    wait_for(
        lambda: agent.status()["control_plane"]["consecutive_report_failures"] >= 2,
        timeout_s=20,
        what="failed pushes",
    )
    assert agent.readyz() == 200
    engine_url = agent.status()["engine_url"]
    reply = httpx.post(
        f"{engine_url}/v1/completions", json={"model": MODEL, "prompt": "still there?", "max_tokens": 5}, timeout=10
    )
    assert reply.status_code == 200
    start_control_plane(stack, port)
    wait_for(listed, timeout_s=20, what="reports resumed")
    assert agent.status()["control_plane"]["consecutive_report_failures"] == 0


def test_an_engine_does_not_outlive_its_agent_killed_with_sigkill(write_stack, start_agent) -> None:
    agent: AgentProc = start_agent(write_stack())
    engine = int(agent.status()["engine_pid"])
    os.kill(agent.process.pid, signal.SIGKILL)  # no drain, no cleanup: the kernel tells the engine
    agent.process.wait(10)
    wait_for(lambda: not pid_alive(engine), timeout_s=20, what=f"engine {engine} gone", diagnostics=agent.tail)
