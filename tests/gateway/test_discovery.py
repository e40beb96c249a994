"""Discovery from the real control plane: draining replicas leave at once, a dead control plane changes nothing;
and a client that goes away frees its engine slot."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from fleet.ports import free_port
from fleet.promtext import EngineMetrics
from gateway.settings import GatewaySettings
from tests.gateway.builders import KEYS, MODEL
from tests.gateway.conftest import LLMFLEET, Proc, SimFactory, _start, serve, settings_for, write_stack

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def _report(replica: str, engine_url: str, state: str) -> dict[str, object]:
    return {
        "replica": replica,
        "pool": "qwen-7b",
        "engine_url": engine_url,
        "state": state,
        "waiting": 0,
        "running": 0,
        "kv_usage": 0.0,
        "model": MODEL,
        "engine_version": "0.33.0",
        "ts": time.time(),
    }


async def _until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_control_plane_discovery_drain_and_outage(sims: SimFactory, tmp_path: Path) -> None:
    (sim,) = sims([])
    stack = write_stack(tmp_path, autoscaling={"actuator": "local", "dryRun": True})
    port = str(free_port())  # the control plane reports the port it was given, so it gets a free one
    cp: Proc = _start(
        [*LLMFLEET, "control-plane", "--stack", str(stack), "--port", port, "--dry-run"],
        tmp_path / "cp.log",
        "listening on",
    )
    try:
        settings = settings_for([])
        settings = GatewaySettings(spec=settings.spec, control_plane=cp.url, access_log=False)
        async with aiohttp.ClientSession() as session, serve(settings) as (url, gw):

            async def report(state: str) -> None:
                async with session.post(cp.url + "/v1/reports", json=_report("r1", sim.url, state)) as resp:
                    assert resp.status < 300, await resp.text()

            async def chat() -> int:
                async with session.post(url + "/v1/chat/completions", data=CHAT, headers=GOLD) as resp:
                    await resp.read()
                    return resp.status

            await report("ready")
            await _until(lambda: gw.endpoints.routable("qwen-7b") == 1)
            assert await chat() == 200
            await report("draining")
            await _until(lambda: gw.endpoints.routable("qwen-7b") == 0)
            await report("ready")
            await _until(lambda: gw.endpoints.routable("qwen-7b") == 1)
            cp.kill()  # the control plane dies: the last known replicas keep serving
            rounds = gw.refresher.rounds
            await _until(lambda: gw.refresher.rounds >= rounds + 2)
            assert gw.endpoints.routable("qwen-7b") == 1 and await chat() == 200
    finally:
        cp.kill()


async def test_client_disconnect_cancels_the_engine_request(sims: SimFactory) -> None:
    (sim,) = sims([], time_scale=1.0)
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "stream": True}
    )
    async with serve(settings_for([sim.url])) as (url, _), aiohttp.ClientSession() as session:

        async def running() -> float:
            async with session.get(sim.url + "/metrics") as resp:
                return EngineMetrics.from_text(await resp.text()).running

        client = aiohttp.ClientSession()
        resp = await client.post(url + "/v1/chat/completions", data=body, headers=GOLD)
        await resp.content.readany()  # streaming has started
        assert await running() == 1
        resp.close()
        await client.close()
        deadline = time.monotonic() + 10
        while await running() != 0:
            assert time.monotonic() < deadline, "the engine kept generating for a client that left"
            await asyncio.sleep(0.05)
