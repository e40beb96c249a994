"""Anthropic's Messages API through the gateway: the real ``anthropic`` client with a tenant's key as
``x-api-key``, over a simulator process; whole and streamed answers, the tokens counted, and the gateway's own
refusals in Anthropic's error shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.gateway.builders import counted
from tests.gateway.conftest import SimFactory, serve, settings_for
from tests.support.stacks import KEYS, MODEL


async def test_the_anthropic_client_creates_and_streams_messages_with_a_tenant_key(sims: SimFactory) -> None:
    (sim,) = sims([])
    async with serve(settings_for([sim.url])) as (url, gateway):
        client = anthropic.AsyncAnthropic(base_url=url, api_key=KEYS["gold"], max_retries=0)
        try:
            whole = await client.messages.create(
                model=MODEL, max_tokens=5, system="Be brief.", messages=[{"role": "user", "content": "name a tide"}]
            )
            token_count = await client.messages.count_tokens(
                model=MODEL, system="Be brief.", messages=[{"role": "user", "content": "name a tide"}]
            )
            async with client.messages.stream(
                model=MODEL, max_tokens=7, messages=[{"role": "user", "content": "and the next?"}]
            ) as stream:
                text = "".join([t async for t in stream.text_stream])
                streamed = await stream.get_final_message()
        finally:
            await client.close()
    assert whole.type == "message" and whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 5
    assert token_count.input_tokens == whole.usage.input_tokens  # the same prompt, counted by an engine
    assert streamed.usage.output_tokens == 7 and text == streamed.content[0].text and text
    labels = {"tenant": "gold", "model": MODEL}
    assert counted(gateway, "llmfleet_gateway_requests", {**labels, "status": "200"}) == 3  # the count too
    assert counted(gateway, "llmfleet_gateway_tokens", {**labels, "direction": "out"}) == 5 + 7
    assert counted(gateway, "llmfleet_gateway_tokens", {**labels, "direction": "in"}) > 0


async def test_the_gateways_refusals_on_messages_are_anthropic_errors(sims: SimFactory) -> None:
    (sim,) = sims([])
    async with serve(settings_for([sim.url])) as (url, _):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-nobodys", max_retries=0)
        try:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()
        bronze = anthropic.AsyncAnthropic(base_url=url, api_key=KEYS["bronze"], max_retries=0)
        try:
            with pytest.raises(anthropic.NotFoundError):
                await bronze.messages.create(
                    model="nobodys-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
                )
        finally:
            await bronze.close()
        async with httpx.AsyncClient(base_url=url) as raw:
            no_limit = await raw.post(
                "/v1/messages",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-api-key": KEYS["gold"]},
            )
            keyless = await raw.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
            )
            twice = await raw.post(
                "/v1/messages",
                json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                headers=[("x-api-key", KEYS["gold"]), ("x-api-key", KEYS["bronze"])],
            )
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    assert no_limit.status_code == 400
    assert no_limit.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"},
    }
    assert keyless.status_code == 401 and "x-api-key" in keyless.json()["error"]["message"]
    assert twice.status_code == 400 and twice.json()["error"]["type"] == "invalid_request_error"


async def test_a_tenant_over_its_token_quota_gets_anthropics_rate_limit_error_and_responses_count_too(
    sims: SimFactory,
) -> None:
    (sim,) = sims([])
    async with serve(settings_for([sim.url], **{"tenants.0.tokensPerMinute": 300})) as (url, gateway):
        claude = anthropic.AsyncAnthropic(base_url=url, api_key=KEYS["gold"], max_retries=0)
        ask = {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}]}
        try:
            first = await claude.messages.create(**ask)  # type: ignore[arg-type]
            with pytest.raises(anthropic.RateLimitError) as over:  # the minute's tokens are spent
                await claude.messages.create(**ask)  # type: ignore[arg-type]
        finally:
            await claude.close()
        async with httpx.AsyncClient(base_url=url) as raw:
            response = await raw.post(
                "/v1/responses",
                json={"model": MODEL, "input": "hi", "max_output_tokens": 200},
                headers={"Authorization": f"Bearer {KEYS['gold']}"},
            )
    assert first.usage.output_tokens == 200
    assert over.value.status_code == 429 and over.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert response.status_code == 429 and list(response.json()) == ["error"]  # OpenAI's shape on its route
    assert counted(gateway, "llmfleet_gateway_requests", {"tenant": "gold", "model": MODEL, "status": "429"}) == 2
