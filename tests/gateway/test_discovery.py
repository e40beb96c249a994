"""Discovery from the real control plane: draining replicas leave at once, a dead control plane changes nothing;
and a client that goes away frees its engine slot."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from fleet.protocol.promtext import EngineMetrics
from gateway.settings import GatewaySettings
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

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


async def test_control_plane_discovery_drain_and_outage(
    sims: SimFactory, start_control_plane: Callable[[Path], Proc], tmp_path: Path
) -> None:
    (sim,) = sims([])
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", autoscaling={"actuator": "local", "dryRun": True})
    cp = start_control_plane(stack)
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

        async def routable(count: int) -> None:
            await async_wait_for(
                lambda: gw.endpoints.routable("qwen-7b") == count, timeout_s=10, what=f"{count} routable replica(s)"
            )

        await report("ready")
        await routable(1)
        assert await chat() == 200
        await report("draining")
        await routable(0)
        await report("ready")
        await routable(1)
        cp.kill()  # the control plane dies: the last known replicas keep serving
        rounds = gw.refresher.rounds
        await async_wait_for(lambda: gw.refresher.rounds >= rounds + 2, timeout_s=10, what="two refresh rounds")
        assert gw.endpoints.routable("qwen-7b") == 1 and await chat() == 200


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

        async def stopped() -> bool:
            return await running() == 0

        await async_wait_for(stopped, timeout_s=10, what="the engine to stop generating for a client that left")
