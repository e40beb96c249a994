"""Quota shared through Redis: exact across two gateway processes under 200 concurrent requests."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from fleet.protocol import contract
from gateway.body import parse_body
from gateway.errors import QuotaExceeded
from gateway.quota import QuotaLimits
from gateway.quota.redis import RedisQuota
from tests.gateway.conftest import SimFactory, admin_url
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.redis

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 45}


async def test_lua_acquire_is_all_or_nothing_and_release_refunds(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    quota = RedisQuota(client, prefix=f"test:{time.monotonic_ns()}")
    limits = QuotaLimits(requests_per_second=1000, tokens_per_minute=100, max_concurrency=2)
    try:
        first = await quota.acquire("t", limits, "1", 60)
        with pytest.raises(QuotaExceeded, match="tokens/min") as info:
            await quota.acquire("t", limits, "2", 60)
        assert info.value.retry_after is not None and info.value.retry_after > 0
        await quota.release(first, used_tokens=10)  # 50 come back
        await quota.acquire("t", limits, "3", 60)
        await quota.acquire("t", limits, "4", 1)
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await quota.acquire("t", limits, "5", 1)
    finally:
        await quota.close()


async def test_quota_is_exact_across_two_gateways(
    redis_url: str,
    sims: SimFactory,
    gateway_procs: Callable[..., Proc],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cost = parse_body(json.dumps(BODY).encode(), "chat").reserve_tokens
    allowed = 12  # the bucket refills one request's worth every 5 s: far longer than the burst takes
    # As in a cluster, the URL (with its password) comes from the environment, which overrides the stack's:
    # the stack's names a port where nothing listens.
    monkeypatch.setenv(contract.REDIS_URL_ENV, redis_url)
    overrides = {
        "tenants.0.tokensPerMinute": allowed * cost,
        "gateway.quotaBackend": "redis",
        "gateway.redisUrl": "redis://127.0.0.1:9/0",
        "gateway.queue.maxWaiting": 500,
        "gateway.queue.timeoutS": 30,
    }
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway", **overrides)
    (sim,) = sims([], time_scale=1.0, max_num_seqs=64)
    first, second = (gateway_procs(stack, [sim.url], "--no-access-log") for _ in range(2))
    headers = {"Authorization": f"Bearer {KEYS['gold']}", "Content-Type": "application/json"}
    data = json.dumps(BODY)

    async def send(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
        async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as resp:
            await resp.read()
            return resp.status, resp.headers.get("Retry-After")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def routable(url: str) -> bool:
            async with session.get(url + "/readyz") as resp:
                return bool((await resp.json())["routable_replicas"]["qwen-7b"] == 1)

        for url in (admin_url(first), admin_url(second)):  # both gateways see the replica before the burst
            await async_wait_for(functools.partial(routable, url), timeout_s=10, what=f"{url} routing to the replica")
        # The tenant's buckets start full: a run less than a minute ago on this Redis would have drained them.
        client = Redis.from_url(redis_url)
        await client.delete(*(f"llmfleet:quota:{{gold}}:{part}" for part in ("rps", "tpm", "conc")))
        await client.aclose()
        results = await asyncio.gather(*(send(session, (first.url, second.url)[i % 2]) for i in range(200)))
    statuses = [status for status, _ in results]
    assert statuses.count(200) == allowed, collections_summary(statuses)
    assert statuses.count(429) == 200 - allowed
    assert all(retry is not None and int(retry) >= 1 for status, retry in results if status == 429)


def collections_summary(statuses: list[int]) -> dict[int, int]:
    return {s: statuses.count(s) for s in sorted(set(statuses))}
