"""An engine's refusal of a new request, through an in-process gateway in front of fake engines on loopback.

vLLM 0.32 draining with ``--shutdown-timeout`` answers every new request HTTP 500 ``cannot schedule new futures
after shutdown`` while its ``/health`` stays 200 (shared/research/real_vllm/REPORT.md): the gateway reads that as a
refusal (`gateway.errors.UpstreamDraining`), like a 503, and another replica answers; a plain 500 is the engine's
answer to the request, relayed as it came.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.errors import UpstreamDraining, UpstreamStatus, UpstreamUnavailable
from gateway.proxy import Timeouts, open_stream, send_json
from gateway.service import Gateway
from tests.gateway.builders import counted
from tests.gateway.conftest import _site, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

GOLD = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
PROBES = {"/health", "/metrics", "/v1/models"}  # what the gateway's own refresher asks every engine
ROUND_ROBIN = {"gateway.routing.picker": {"name": "round-robin"}}
# vLLM 0.32's answer to a request that arrives while it drains, byte for byte.
DRAINING = b'{"error":{"message":"cannot schedule new futures after shutdown","type":"InternalServerError","param":null,"code":500}}'  # noqa: E501
BROKEN = b'{"error":{"message":"EngineCore encountered an issue","type":"InternalServerError","param":null,"code":500}}'
CHUNK = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [
    {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
]}  # fmt: skip
WHOLE = {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


@dataclass
class FakeEngine:
    """An engine whose ``/health`` is 200 and which answers every completion with ``status`` and ``body`` (a 200
    answers a chat completion, whole or streamed as asked); ``served`` records the completions it was sent."""

    status: int = 200
    body: bytes = b""
    served: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path in PROBES:
            return web.Response(text="" if request.path != "/v1/models" else json.dumps({"data": []}))
        self.served.append(request.path)
        if self.status != 200:
            return web.Response(status=self.status, body=self.body, content_type="application/json")
        if not (await request.json()).get("stream"):
            return web.json_response(WHOLE)
        usage = {"choices": [], "usage": WHOLE["usage"]}
        events = [f"data: {json.dumps(CHUNK)}", f"data: {json.dumps(usage)}", "data: [DONE]"]
        return web.Response(body="".join(e + "\n\n" for e in events), content_type="text/event-stream")


@contextlib.asynccontextmanager
async def fake_engines(*engines: FakeEngine) -> AsyncIterator[list[str]]:
    runners: list[web.AppRunner] = []
    try:
        for engine in engines:
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", engine.handle)
            runners.append(web.AppRunner(app, access_log=None))
        yield [await _site(runner) for runner in runners]
    finally:
        for runner in runners:
            await runner.cleanup()


def _routable(gateway: Gateway, n: int) -> bool:
    return gateway.endpoints.routable("qwen-7b") == n


async def _chat(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    async with session.post(url + "/v1/chat/completions", json=body, headers=GOLD) as resp:
        return resp.status, await resp.read()


def _requests(gateway: Gateway, status: str) -> float:
    return counted(gateway, "llmfleet_gateway_requests_total", {"model": MODEL, "status": status})


@pytest.mark.parametrize(
    ("status", "body", "raised"),
    [
        pytest.param(500, DRAINING, UpstreamDraining, id="vLLM draining 500"),
        pytest.param(503, b"", UpstreamUnavailable, id="503"),
        pytest.param(500, BROKEN, UpstreamStatus, id="plain 500"),
        pytest.param(400, b'{"error":{"code":400}}', UpstreamStatus, id="400"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_engines_answer_is_classified_where_it_is_read(
    status: int, body: bytes, raised: type[Exception], stream: bool
) -> None:
    timeouts = Timeouts(connect_s=2, first_token_s=5, total_s=5)
    async with fake_engines(FakeEngine(status, body)) as [engine], aiohttp.ClientSession() as session:
        url, payload = engine + "/v1/chat/completions", b"{}"
        with pytest.raises(raised) as info:
            if stream:
                await open_stream(session, url, payload, {}, timeouts, hide_usage=True)
            else:
                await send_json(session, url, payload, {}, timeouts)
    assert type(info.value) is raised  # not only a subclass: a plain 500 is no UpstreamDraining
    assert info.value.retryable is (raised is not UpstreamStatus)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_draining_vllms_500_is_retried_on_another_replica_and_is_no_fault_of_it(stream: bool) -> None:
    draining, good = FakeEngine(500, DRAINING), FakeEngine()
    async with fake_engines(draining, good) as urls, serve(settings_for(urls, **ROUND_ROBIN)) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway, 2), timeout_s=10, what="both replicas routable")
        async with aiohttp.ClientSession() as session:
            statuses = []
            for _ in range(4):  # round-robin: the first or the second request goes to the draining replica first
                statuses.append((await _chat(session, url, stream))[0])
                if draining.served:
                    break
        members = {ep.url: ep for ep in gateway.endpoints.members("qwen-7b")}
        refused = len(draining.served)
        assert set(statuses) == {200} and refused >= 1
        assert len(good.served) == len(statuses)  # each answered by the good replica, the refused ones too
        retried = {"model": MODEL, "reason": "UpstreamDraining"}
        assert counted(gateway, "llmfleet_gateway_retries_total", retried) == refused
        assert _requests(gateway, "200") == len(statuses) and _requests(gateway, "500") == 0
        # A refusal, not a fault: the replica is not counted towards ejection, and leaves rotation until its next
        # good probe (a draining vLLM's /health stays 200: the refresher may have put it back already).
        assert members[urls[0]].failures == 0 and counted(gateway, "llmfleet_gateway_ejections_total", {}) == 0


async def test_when_every_replica_is_draining_the_client_gets_the_gateways_503_not_the_engines_500() -> None:
    engines = [FakeEngine(500, DRAINING), FakeEngine(500, DRAINING)]
    async with fake_engines(*engines) as urls, serve(settings_for(urls, **ROUND_ROBIN)) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway, 2), timeout_s=10, what="both replicas routable")
        async with aiohttp.ClientSession() as session:
            status, body = await _chat(session, url, stream=False)
        assert status == 503
        error: dict[str, Any] = json.loads(body)["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", 503)
        assert "futures" not in error["message"]  # the gateway's own words, not the engine's
        assert [len(e.served) for e in engines] == [1, 1]  # each tried once
        retried = {"model": MODEL, "reason": "UpstreamDraining"}
        assert counted(gateway, "llmfleet_gateway_retries_total", retried) == 1
        assert _requests(gateway, "503") == 1 and _requests(gateway, "500") == 0


async def test_a_plain_500_is_the_engines_answer_relayed_as_it_came_and_counted_as_a_fault() -> None:
    broken, good = FakeEngine(500, BROKEN), FakeEngine()
    async with fake_engines(broken, good) as urls, serve(settings_for(urls, **ROUND_ROBIN)) as (url, gateway):
        await async_wait_for(functools.partial(_routable, gateway, 2), timeout_s=10, what="both replicas routable")
        async with aiohttp.ClientSession() as session:
            answers = []
            while not broken.served:  # round-robin: the first or the second request goes to the broken replica
                answers.append(await _chat(session, url, stream=False))
        assert answers[-1] == (500, BROKEN)
        assert counted(gateway, "llmfleet_gateway_retries_total", {"model": MODEL, "reason": "UpstreamStatus"}) == 0
        (failed,) = [ep for ep in gateway.endpoints.members("qwen-7b") if ep.url == urls[0]]
        assert failed.failures == 1
