"""A quota Redis killed under load and restarted on the same port, with gateways in front of a simulator.

fail-open: two gateway processes go on answering (never a 5xx), each admitting its half of the tenant's
concurrency, and are exact across both again once Redis is back. fail-closed: 503 in OpenAI's shape with
Retry-After, then 200 again. Each gateway logs one line when the store goes down and one when it is back.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest

from fleet.protocol import contract, promtext
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.gateway.quota.conftest import RedisServer
from tests.support.procs import Proc, Procs
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.redis

HEADERS = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
DOWN, BACK = "quota store down", "quota store answers again"
CONCURRENCY = 6  # the tenant's maxConcurrency: 3 per gateway while Redis is down


def _body(max_tokens: int) -> str:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})


async def _send(session: aiohttp.ClientSession, url: str, max_tokens: int = 40) -> tuple[int, str]:
    async with session.post(url + "/v1/chat/completions", data=_body(max_tokens), headers=HEADERS) as resp:
        return resp.status, await resp.text()


async def _wave(session: aiohttp.ClientSession, urls: Sequence[str], per_gateway: int) -> dict[str, list[int]]:
    """``per_gateway`` concurrent requests through each URL; statuses by URL."""
    sent = [(url, _send(session, url)) for url in urls for _ in range(per_gateway)]
    answers = await asyncio.gather(*(call for _, call in sent))
    statuses: dict[str, list[int]] = collections.defaultdict(list)
    for (url, _), (status, _) in zip(sent, answers, strict=True):
        statuses[url].append(status)
    return statuses


def _counts(statuses: list[int]) -> dict[int, int]:
    return dict(sorted(collections.Counter(statuses).items()))


async def _running(session: aiohttp.ClientSession, sim: Proc) -> bool:
    async with session.get(sim.url + "/metrics") as resp:
        return promtext.EngineMetrics.from_text(await resp.text()).running > 0


@pytest.mark.slow
async def test_fail_open_keeps_answering_through_a_redis_kill_and_is_exact_again_after_restart(
    redis_server: RedisServer,
    sims: SimFactory,
    procs: Procs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(contract.REDIS_URL_ENV, raising=False)  # it would override the stack's
    overrides = {
        "tenants.0.maxConcurrency": CONCURRENCY,
        "gateway.replicas": 2,
        "gateway.quotaBackend": "redis",
        "gateway.redisUrl": redis_server.url,
        "gateway.quotaStoreDown": "fail-open",
    }
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **overrides)
    (sim,) = sims([], time_scale=1.0, max_num_seqs=64)
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--no-access-log", "--replica", sim.url]
    gateways = [procs.start(argv, name=f"gateway-{i}") for i in range(2)]  # both start at once
    for gateway in gateways:
        gateway.wait_url("listening on")
    urls = [g.url for g in gateways]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        shared = await _wave(session, urls, per_gateway=12)
        assert _counts(shared[urls[0]] + shared[urls[1]]) == {200: CONCURRENCY, 429: 24 - CONCURRENCY}

        load = asyncio.ensure_future(_wave(session, urls, per_gateway=4))
        await async_wait_for(lambda: _running(session, sim), timeout_s=20, what="requests on the simulator")
        redis_server.kill()  # SIGKILL under load: admitted requests must still finish and release without a 5xx
        mid = await load
        assert all(s in (200, 429) for s in mid[urls[0]] + mid[urls[1]]), mid

        down = await _wave(session, urls, per_gateway=8)
        for url in urls:  # each gateway alone: its half of the tenant's concurrency
            assert _counts(down[url]) == {200: CONCURRENCY // 2, 429: 8 - CONCURRENCY // 2}, down

        redis_server.start()  # empty, on the same port
        for gateway in gateways:

            async def back(gateway: Proc = gateway) -> bool:
                status, text = await _send(session, gateway.url, max_tokens=1)
                assert status == 200, text
                return BACK in gateway.text()

            await async_wait_for(back, timeout_s=10, what=f"{gateway.name} using Redis again", interval_s=0.2)
        again = await _wave(session, urls, per_gateway=12)
        assert _counts(again[urls[0]] + again[urls[1]]) == {200: CONCURRENCY, 429: 24 - CONCURRENCY}
    for gateway in gateways:  # one line each way, not one per request
        assert (gateway.text().count(DOWN), gateway.text().count(BACK)) == (1, 1), gateway.tail()


async def test_fail_closed_answers_503_with_retry_after_until_redis_is_back(
    redis_server: RedisServer, sims: SimFactory
) -> None:
    (sim,) = sims([], time_scale=1.0, max_num_seqs=64)
    overrides = {
        "gateway.quotaBackend": "redis",
        "gateway.redisUrl": redis_server.url,
        "gateway.quotaStoreDown": "fail-closed",
    }
    async with serve(settings_for([sim.url], **overrides)) as (url, gateway), aiohttp.ClientSession() as session:
        load = asyncio.gather(*(_send(session, url) for _ in range(4)))
        await async_wait_for(lambda: _running(session, sim), timeout_s=20, what="requests on the simulator")
        redis_server.kill()
        assert [status for status, _ in await load] == [200] * 4  # admitted before the kill: they finish

        for _ in range(3):
            async with session.post(url + "/v1/chat/completions", data=_body(8), headers=HEADERS) as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "1"
                error = (await resp.json())["error"]
                assert error["code"] == 503 and error["type"] == "service_unavailable", error
                assert "quota store" in error["message"], error
        health = gateway.quota.health()
        assert health is not None and not health.up and health.refused == 3

        redis_server.start()

        async def answered() -> bool:
            status, _ = await _send(session, url, max_tokens=1)
            return status == 200

        await async_wait_for(answered, timeout_s=10, what="200 once Redis is back", interval_s=0.2)
        health = gateway.quota.health()
        assert health is not None and health.up
