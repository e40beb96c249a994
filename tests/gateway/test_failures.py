"""Failures with real simulator processes: retries before the first byte, in-band errors after it, ejection."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from fleet.protocol.promtext import counter_value, parse
from gateway.service import Gateway
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL
from tests.support.wait import async_wait_for

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0, timeout=30)


async def _stream_chat(client: openai.AsyncOpenAI, max_tokens: int) -> openai.AsyncStream[ChatCompletionChunk]:
    return await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,
    )


def _metric(gw: Gateway, name: str) -> float:
    samples = parse(gw.metrics.render().decode())
    try:
        return counter_value(samples, name)
    except KeyError:
        return 0.0


ROUND_ROBIN = {"gateway.routing.picker": {"name": "round-robin"}}


@pytest.mark.parametrize(
    "fault",
    [["--fault-die-mid-stream-after-tokens", "0"], ["--fault-error-rate", "1", "--fault-error-status", "503"]],
    ids=["killed-before-first-token", "engine-503"],
)
async def test_failure_before_the_first_byte_is_served_by_another_replica(sims: SimFactory, fault: list[str]) -> None:
    bad, good = sims(fault, [])
    async with serve(settings_for([bad.url, good.url], **ROUND_ROBIN)) as (url, gw):
        # Both probed healthy first (a probe that times out on a busy machine would leave the bad one out).
        await async_wait_for(lambda: gw.endpoints.routable("qwen-7b") == 2, timeout_s=10, what="both replicas routable")
        client = _client(url)
        try:
            for _ in range(2):  # round-robin: one of the first two requests is sent to the bad replica first
                stream = await _stream_chat(client, 12)
                chunks = [c async for c in stream]
                assert chunks[-1].choices[0].finish_reason == "length"
        finally:
            await client.close()
        assert _metric(gw, "llmfleet_gateway_retries") >= 1


async def test_engine_killed_mid_stream_ends_the_stream_with_an_error_event(sims: SimFactory) -> None:
    (dying,) = sims(["--fault-die-mid-stream-after-tokens", "5"], time_scale=5.0)
    async with serve(settings_for([dying.url])) as (url, gw):
        client = _client(url)
        received = ""
        try:
            stream = await _stream_chat(client, 200)
            with pytest.raises(openai.APIError, match="mid-stream|closed the stream"):
                async for chunk in stream:
                    received += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        finally:
            await client.close()
    assert received  # tokens arrived before the failure, then an explicit error (not a silent truncation)
    # The client saw 200 headers, but the request failed: the metrics the SLO rules read say so.
    samples = parse(gw.metrics.render().decode())
    assert counter_value(samples, "llmfleet_gateway_requests", {"status": "502"}) == 1
    assert counter_value(samples, "llmfleet_gateway_requests", {"status": "200"}) == 0


async def test_hung_engine_times_out_with_504_and_is_ejected(sims: SimFactory) -> None:
    hung, good = sims(["--fault-slowdown", "100000"], [])
    settings = settings_for([hung.url, good.url], **ROUND_ROBIN, **{"gateway.timeouts.firstTokenS": 1})
    async with serve(settings) as (url, gw):
        client = _client(url)
        statuses: list[int] = []
        try:
            for _ in range(8):
                try:
                    stream = await _stream_chat(client, 4)
                    _ = [c async for c in stream]
                    statuses.append(200)
                except openai.APIStatusError as exc:
                    statuses.append(exc.status_code)
        finally:
            await client.close()
        ejected = _metric(gw, "llmfleet_gateway_ejections")
    assert statuses.count(504) == 1 and statuses.count(200) == 7, statuses  # after one timeout it is out
    assert ejected == 1


async def test_when_every_attempt_fails_the_client_gets_one_503_after_max_attempts(sims: SimFactory) -> None:
    refusing = ["--fault-error-rate", "1", "--fault-error-status", "503"]
    replicas = sims(refusing, refusing, refusing)
    overrides = {**ROUND_ROBIN, "gateway.retries.maxAttempts": 2}
    async with serve(settings_for([r.url for r in replicas], **overrides)) as (url, gw):
        client = _client(url)
        try:
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        finally:
            await client.close()
        assert info.value.status_code == 503
        assert _metric(gw, "llmfleet_gateway_retries") == 1  # two attempts: the first and one retry, no third


async def test_an_engine_error_event_after_200_counts_as_a_failure_and_ejects_the_replica(sims: SimFactory) -> None:
    # The engine crashes while streaming (a second request kills it): it sends the stream an in-band error event and
    # [DONE], then exits.
    (crashing,) = sims(["--fault-crash-after-requests", "1", "--fault-exit-delay", "5"], time_scale=1.0)
    async with serve(settings_for([crashing.url])) as (url, gw):
        client = _client(url)
        try:
            stream = await _stream_chat(client, 2000)
            with pytest.raises(openai.APIError):
                async for _ in stream:
                    async with aiohttp.ClientSession() as session:  # straight to the engine: the fatal request
                        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
                        async with session.post(crashing.url + "/v1/completions", json=body) as resp:
                            await resp.read()
        finally:
            await client.close()
        (endpoint,) = gw.endpoints.members("qwen-7b")
        failures = endpoint.failures
    samples = parse(gw.metrics.render().decode())
    assert counter_value(samples, "llmfleet_gateway_requests", {"status": "502"}) == 1
    assert counter_value(samples, "llmfleet_gateway_requests", {"status": "200"}) == 0
    assert failures == 1
