"""The gateway's HTTP API against real simulator processes: every status code from a realistic request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict

from fleet.protocol.keys import hash_api_key
from tests.gateway.conftest import SimFactory, serve, serve_with_admin, settings_for
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, stack_document
from tests.support.wait import async_wait_for

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}
GOLD = {"Authorization": f"Bearer {KEYS['gold']}"}


async def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, CIMultiDict[str], Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        sent = {"Content-Type": "application/json", **(headers or {})}
        async with session.post(url + "/v1/chat/completions", data=data, headers=sent) as resp:
            text = await resp.read()
            return resp.status, CIMultiDict(resp.headers), json.loads(text) if text else None


@pytest.mark.parametrize(
    ("name", "body", "headers", "status"),
    [
        ("ok", CHAT, GOLD, 200),
        ("bad-json", b"{nope", GOLD, 400),
        ("bad-param", {**CHAT, "max_tokens": -1}, GOLD, 400),
        ("no-key", CHAT, {}, 401),
        ("unknown-key", CHAT, {"Authorization": "Bearer sk-wrong"}, 401),
        ("model-not-allowed", {**CHAT, "model": "small-model"}, {"Authorization": f"Bearer {KEYS['bronze']}"}, 403),
        ("unknown-model", {**CHAT, "model": "gpt-17"}, GOLD, 404),
        ("too-large", {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}, GOLD, 413),
        ("not-json-content-type", CHAT, {**GOLD, "Content-Type": "application/x-www-form-urlencoded"}, 415),
        ("pool-at-zero", {**CHAT, "model": "small-model"}, GOLD, 503),
    ],
)
async def test_status_codes(shared_sim: Proc, name: str, body: Any, headers: dict[str, str], status: int) -> None:
    async with serve(settings_for([shared_sim.url])) as (url, _):
        got, response_headers, payload = await _post(url, body, {**headers, "x-request-id": f"req-{name}"})
    assert got == status, payload
    assert response_headers["x-request-id"] == f"req-{name}"
    if status != 200:
        assert set(payload["error"]) >= {"message", "type", "code"}
    if status == 503:
        assert int(response_headers["Retry-After"]) >= 1  # retryable, never a 404 for a pool at zero


async def test_quota_429_with_retry_after(shared_sim: Proc) -> None:
    sim = shared_sim
    async with serve(settings_for([sim.url], **{"tenants.0.requestsPerSecond": 1})) as (url, _):
        first = await _post(url, CHAT, GOLD)
        second = await _post(url, CHAT, GOLD)
    assert (first[0], second[0]) == (200, 429)
    assert second[2]["error"]["type"] == "rate_limit_error" and int(second[1]["Retry-After"]) >= 1


async def test_queue_full_429_and_queue_timeout_503(sims: SimFactory) -> None:
    (slow,) = sims([], time_scale=1.0, max_num_seqs=1)
    settings = settings_for(
        [slow.url],
        **{
            "gateway.queue": {"perReplicaThreshold": 0, "maxWaiting": 1, "timeoutS": 1.0},
            "pools.0.engine": {"kind": "sim", "maxNumSeqs": 1},
        },
    )
    long = {**CHAT, "max_tokens": 3000, "stream": True}
    async with serve(settings) as (url, gw):
        admission = gw.admission["qwen-7b"]
        holder = asyncio.create_task(_post(url, long, GOLD))  # occupies the only slot
        await async_wait_for(lambda: admission.in_flight == 1, timeout_s=10, interval_s=0.005, what="slot taken")
        waiter = asyncio.create_task(_post(url, CHAT, GOLD))  # queues (the one waiting place)
        await async_wait_for(lambda: admission.waiting == 1, timeout_s=10, interval_s=0.005, what="one waiting")
        full = await _post(url, CHAT, GOLD)
        timed_out = await waiter
        holder.cancel()
    assert full[0] == 429 and "Retry-After" in full[1]
    assert timed_out[0] == 503 and "Retry-After" in timed_out[1]


async def test_openai_client_models_chat_stream_and_completions(shared_sim: Proc) -> None:
    sim = shared_sim
    async with serve(settings_for([sim.url])) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0)
        bronze = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["bronze"], max_retries=0)
        try:
            assert sorted(m.id for m in (await client.models.list()).data) == [MODEL, "small-model"]
            assert [m.id for m in (await bronze.models.list()).data] == [MODEL]
            chat = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
            )
            assert chat.usage is not None and chat.usage.completion_tokens == 5
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True
            )
            chunks = [c async for c in stream]
            assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for stays hidden
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            with_usage = await client.completions.create(
                model=MODEL, prompt="once upon", max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
            usage = [c.usage async for c in with_usage if c.usage is not None]
            assert usage and usage[-1].completion_tokens == 4
        finally:
            await client.close()
            await bronze.close()


async def test_stack_keys_are_hashes_and_client_tenant_headers_are_ignored(shared_sim: Proc) -> None:
    sim = shared_sim
    assert hash_api_key(KEYS["bronze"]) in stack_document("gateway")["config"]["llmfleet:tenants"][1]["apiKeyHashes"]
    headers = {"Authorization": f"Bearer {KEYS['bronze']}", "x-tenant": "gold", "x-priority": "9"}
    async with serve(settings_for([sim.url])) as (url, gw):
        status, _, _ = await _post(url, {**CHAT, "model": "small-model"}, headers)
        assert status == 403  # still bronze
        await _post(url, CHAT, headers)
        text = gw.metrics.render().decode()
    assert 'tenant="bronze"' in text and 'llmfleet_gateway_requests_total{model="' + MODEL in text


async def test_readiness_and_metrics_answer_on_the_admin_port_only(shared_sim: Proc) -> None:
    sim = shared_sim
    public = [("/healthz", 200), ("/readyz", 404), ("/metrics", 404), ("/nope", 404)]
    admin = [("/healthz", 200), ("/readyz", 200), ("/metrics", 200), ("/v1/models", 404)]
    async with serve_with_admin(settings_for([sim.url])) as (url, admin_url, _):
        async with aiohttp.ClientSession() as session:
            for base, path, status in [(url, *case) for case in public] + [(admin_url, *case) for case in admin]:
                async with session.get(base + path) as resp:
                    assert resp.status == status, (base, path)
                    assert resp.headers["x-request-id"]
            async with session.get(admin_url + "/readyz") as resp:
                assert (await resp.json())["routable_replicas"] == {"qwen-7b": 1, "small": 0}


async def test_a_dead_quota_redis_shows_on_the_admin_metrics_and_fail_open_still_answers(shared_sim: Proc) -> None:
    dead = "redis://127.0.0.1:9/0"  # the discard port: nothing listens
    settings = settings_for([shared_sim.url], **{"gateway.quotaBackend": "redis", "gateway.redisUrl": dead})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"Authorization": f"Bearer {KEYS['gold']}"}
    async with serve_with_admin(settings) as (url, admin, gateway), aiohttp.ClientSession() as session:
        await async_wait_for(lambda: gateway.endpoints.routable("qwen-7b") == 1, timeout_s=10, what="routable")
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
        async with session.get(admin + "/metrics") as resp:
            text = await resp.text()
    assert "llmfleet_gateway_quota_store_up 0.0" in text
    assert 'llmfleet_gateway_quota_store_down_requests_total{decision="local"} 1.0' in text


async def test_only_streamed_answers_are_timed_as_a_first_token(shared_sim: Proc) -> None:
    """A whole answer arrives at once: timing it as a first token would make the TTFT SLI burn on e2e latency."""
    async with serve_with_admin(settings_for([shared_sim.url])) as (url, admin_url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0)
        try:
            await client.chat.completions.create(**CHAT)
            await client.chat.completions.create(**CHAT)
            async for _ in await client.chat.completions.create(**CHAT, stream=True):
                pass
        finally:
            await client.close()
        async with aiohttp.ClientSession() as session, session.get(admin_url + "/metrics") as resp:
            text = await resp.text()
    counts = {
        line.split("{")[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(("llmfleet_gateway_ttft_seconds_count", "llmfleet_gateway_e2e_seconds_count"))
    }
    assert counts == {"llmfleet_gateway_ttft_seconds_count": 1.0, "llmfleet_gateway_e2e_seconds_count": 3.0}


async def test_request_counters_start_at_zero_so_a_first_burst_of_errors_shows_in_rate(shared_sim: Proc) -> None:
    async with serve_with_admin(settings_for([shared_sim.url])) as (_, admin_url, _gateway):
        async with aiohttp.ClientSession() as session, session.get(admin_url + "/metrics") as resp:
            text = await resp.text()
    for tenant in ("gold", "bronze"):
        for status in ("200", "502", "503", "504"):
            line = f'llmfleet_gateway_requests_total{{model="{MODEL}",status="{status}",tenant="{tenant}"}} 0.0'
            assert line in text
