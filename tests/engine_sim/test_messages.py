"""Anthropic's ``/v1/messages`` on the simulator as vLLM 0.33 serves it, for the real ``anthropic`` client: whole
and streamed answers, the usage, and the two error shapes."""

from __future__ import annotations

import anthropic
import pytest

from tests.engine_sim.conftest import SimHandle, StartSim


def _client(sim: SimHandle) -> anthropic.AsyncAnthropic:
    # vLLM checks only a Bearer key (--api-key); the simulator here has none, so any key passes.
    return anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="x", max_retries=0)


async def test_create_answers_a_message_with_text_stop_reason_and_usage(start_sim: StartSim) -> None:
    sim = await start_sim()
    client = _client(sim)
    try:
        message = await client.messages.create(
            model="qwen", max_tokens=5, system="Be brief.", messages=[{"role": "user", "content": "name a tide"}]
        )
    finally:
        await client.close()
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("chatcmpl-")
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    assert message.usage.input_tokens > 0 and message.content[0].type == "text" and message.content[0].text
    raw = await sim.client.post(
        "/v1/messages", json={"model": "qwen", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert "stop_sequence" not in raw.json()  # vLLM leaves out what is null


async def test_a_stream_is_anthropics_event_sequence_and_its_text_adds_up(start_sim: StartSim) -> None:
    sim = await start_sim()
    client = _client(sim)
    try:
        async with client.messages.stream(
            model="qwen", max_tokens=7, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
    finally:
        await client.close()
    raw = [k for k in kinds if not k.startswith(("text", "content_block_delta"))]  # the helper adds text events
    assert raw == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("content_block_delta") == 7
    assert final.usage.output_tokens == 7 and final.stop_reason == "max_tokens" and final.content[0].text


async def test_an_error_of_the_handler_is_anthropic_shaped_and_validation_is_openai_shaped(
    start_sim: StartSim,
) -> None:
    sim = await start_sim()
    client = _client(sim)
    try:
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="other", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    unknown = await sim.client.post(
        "/v1/messages", json={"model": "other", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert unknown.json() == {
        "type": "error",
        "error": {"type": "NotFoundError", "message": "The model `other` does not exist."},
    }
    missing = await sim.client.post(
        "/v1/messages", json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "body.max_tokens"
    zero = await sim.client.post(
        "/v1/messages", json={"model": "qwen", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert zero.status_code == 400


async def test_count_tokens_answers_the_prompt_a_message_would_run_without_running_it(start_sim: StartSim) -> None:
    sim = await start_sim()
    client = _client(sim)
    try:
        counted = await client.messages.count_tokens(
            model="qwen", system="Be brief.", messages=[{"role": "user", "content": "name a tide"}]
        )
        message = await client.messages.create(
            model="qwen", max_tokens=1, system="Be brief.", messages=[{"role": "user", "content": "name a tide"}]
        )
    finally:
        await client.close()
    assert counted.input_tokens == message.usage.input_tokens > 0
    missing = await sim.client.post("/v1/messages/count_tokens", json={"model": "qwen"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "body.messages"
