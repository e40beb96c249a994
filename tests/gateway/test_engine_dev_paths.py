"""The engines' development paths are never forwarded, and a sleeping engine gets no request."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gateway.app import ENGINE_DEV_PATHS
from gateway.service import Gateway
from tests.gateway.conftest import _site, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
PROBES = {"/health", "/metrics", "/v1/models"}  # what the gateway's own refresher asks every engine


@dataclass
class FakeEngine:
    """An engine that records every path it is sent and answers completions; ``asleep`` sets its sleep gauge."""

    asleep: bool = False
    paths: list[str] = field(default_factory=list)
    health_delay_s: float = 0.0  # /health answers this late (a starved API server)
    health_status: int = 200

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if request.path == "/health":
            await asyncio.sleep(self.health_delay_s)
            return web.Response(status=self.health_status)
        if request.path == "/metrics":
            awake = 0.0 if self.asleep else 1.0
            text = "".join(
                f'vllm:engine_sleep_state{{engine="0",model_name="{MODEL}",sleep_state="{state}"}} {value}\n'
                for state, value in (("awake", awake), ("weights_offloaded", 1.0 - awake), ("discard_all", 0.0))
            )
            return web.Response(text=text)
        body = {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
        return web.json_response(body)

    @property
    def served(self) -> list[str]:
        return [p for p in self.paths if p not in PROBES]


@contextlib.asynccontextmanager
async def fake_engine(engine: FakeEngine) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", engine.handle)
    runner = web.AppRunner(app, access_log=None)
    url = await _site(runner)
    try:
        yield url
    finally:
        await runner.cleanup()


def _routable(gateway: Gateway, n: int) -> bool:
    return gateway.endpoints.routable("qwen-7b") == n


@pytest.mark.parametrize("path", [*ENGINE_DEV_PATHS, "/sleep/extra", "/wake_up/"])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT"])
async def test_a_client_request_to_an_engine_dev_path_is_404_and_never_reaches_the_engine(
    path: str, method: str
) -> None:
    engine = FakeEngine()
    async with fake_engine(engine) as engine_url, serve(settings_for([engine_url])) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway, 1), timeout_s=10, what="the replica routable")
        async with aiohttp.ClientSession() as session:
            async with session.request(method, url + path + "?level=1", headers=GOLD, data=b"{}") as resp:
                status, body = resp.status, json.loads(await resp.read())
    assert status == 404
    assert body["error"]["type"] == "not_found_error" and body["error"]["code"] == 404 and body["error"]["message"]
    assert engine.served == []


async def test_a_sleeping_static_engine_is_not_routed_to_until_it_is_awake() -> None:
    engine = FakeEngine(asleep=True)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with fake_engine(engine) as engine_url:
        settings = settings_for([engine_url])
        async with serve(settings) as (url, gateway), aiohttp.ClientSession() as session:
            await gateway.refresher.refresh_once()
            assert gateway.endpoints.routable("qwen-7b") == 0
            async with session.post(url + "/v1/chat/completions", json=chat, headers=GOLD) as resp:
                assert resp.status == 503
            assert engine.served == []
            engine.asleep = False
            await gateway.refresher.refresh_once()
            assert gateway.endpoints.routable("qwen-7b") == 1
            async with session.post(url + "/v1/chat/completions", json=chat, headers=GOLD) as resp:
                assert resp.status == 200
            assert engine.served == ["/v1/chat/completions"]


async def test_a_static_engine_whose_probes_time_out_leaves_rotation_only_after_three_but_a_refusal_at_once() -> None:
    # A starved engine (vLLM on a saturated CPU) answers late, not wrongly: one late probe used to empty its pool.
    engine = FakeEngine(asleep=False)
    async with fake_engine(engine) as engine_url:
        async with serve(settings_for([engine_url])) as (_, gateway):
            refresher = gateway.refresher
            await async_wait_for(lambda: _routable(gateway, 1), timeout_s=10, what="routable")
            engine.health_delay_s = 5.0  # past any probe timeout (at most 2 s)
            slow_from = refresher.rounds
            await async_wait_for(lambda: refresher.rounds >= slow_from + 2, timeout_s=20, what="two late probes")
            assert _routable(gateway, 1)  # at most two late probes so far
            await async_wait_for(lambda: _routable(gateway, 0), timeout_s=20, what="out of rotation")
            assert refresher.rounds >= slow_from + 3
            engine.health_delay_s = 0.0
            await async_wait_for(lambda: _routable(gateway, 1), timeout_s=20, what="back once it answers in time")
            engine.health_status = 503  # an answer: out at the next probe
            answered_from = refresher.rounds
            await async_wait_for(lambda: _routable(gateway, 0), timeout_s=20, what="out on a 503")
            assert refresher.rounds <= answered_from + 2
