"""Anthropic's ``/v1/messages`` on the simulator as vLLM 0.33 serves it, for the real ``anthropic`` client: whole
and streamed answers, the usage, and the two error shapes."""

from __future__ import annotations

import anthropic
import pytest

from tests.engine_sim.conftest import SimHandle, StartSim, sse_events


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
        "error": {"type": "NotFoundError", "message": "The model `other` does not exist. Valid aliases: qwen."},
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


# Bodies vLLM 0.32's request schema refuses, with what it answered (its pydantic models and validation handler,
# `vllm/entrypoints/serve/exception_handling/handlers/validation.py`, run on each body).
MISSING = "{'type': 'missing', 'loc': 'body.%s', 'msg': 'Field required', 'input': '<dict of %d items>'}"
SCHEMA_FAILURES = [
    pytest.param(
        {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
        "body.max_tokens",
        "1 validation error:\n  " + MISSING % ("max_tokens", 2),
        id="max_tokens missing",
    ),
    pytest.param(
        {"model": "qwen", "max_tokens": 8, "messages": "not a list"},
        "body.messages",
        "1 validation error:\n  {'type': 'list_type', 'loc': 'body.messages', 'msg': 'Input should be a valid list', "
        "'input': 'not a list'}",
        id="messages not a list",
    ),
    pytest.param(
        {"model": "qwen"},
        "body.messages",
        "2 validation errors:\n  " + MISSING % ("messages", 1) + "\n  " + MISSING % ("max_tokens", 1),
        id="two fields missing",
    ),
    pytest.param(
        {"max_tokens": 8, "messages": [{"role": "bot", "content": "hi"}]},
        "body.model",
        "2 validation errors:\n  " + MISSING % ("model", 2) + "\n  {'type': 'literal_error', 'loc': "
        "'body.messages.0.role', 'msg': \"Input should be 'user', 'assistant' or 'system'\", 'input': 'bot', 'ctx': "
        "{'expected': \"'user', 'assistant' or 'system'\"}}",
        id="unknown role",
    ),
    pytest.param(
        {"model": "qwen", "max_tokens": "x", "messages": [{"content": "hi"}, 3]},
        "body.messages.0.role",
        "3 validation errors:\n  {'type': 'missing', 'loc': 'body.messages.0.role', 'msg': 'Field required', "
        "'input': '<dict of 1 items>'}\n  {'type': 'model_type', 'loc': 'body.messages.1', 'msg': 'Input should be a "
        "valid dictionary or instance of AnthropicMessage', 'input': '3', 'ctx': {'class_name': 'AnthropicMessage'}}"
        "\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be a valid integer, unable to "
        "parse string as an integer', 'input': 'x'}",
        id="bad items and max_tokens",
    ),
    pytest.param(
        {"model": "qwen", "max_tokens": 8.5, "messages": [{"role": "user", "content": 5}]},
        "body.messages.0.content",
        "3 validation errors:\n  {'type': 'string_type', 'loc': 'body.messages.0.content', 'msg': 'Input should be a "
        "valid string', 'input': '5'}\n  {'type': 'list_type', 'loc': 'body.messages.0.content', 'msg': 'Input should "
        "be a valid list', 'input': '5'}\n  {'type': 'int_from_float', 'loc': 'body.max_tokens', 'msg': 'Input should "
        "be a valid integer, got a number with a fractional part', 'input': '8.5'}",
        id="content of neither kind",
    ),
]


@pytest.mark.parametrize(("body", "param", "message"), SCHEMA_FAILURES)
async def test_a_body_the_schema_refuses_gets_vllms_validation_error_word_for_word(
    start_sim: StartSim, body: dict[str, object], param: str, message: str
) -> None:
    sim = await start_sim()
    answer = await sim.client.post("/v1/messages", json=body)
    assert answer.status_code == 400
    assert answer.json() == {"error": {"message": message, "type": "Bad Request", "param": param, "code": 400}}


async def test_a_stream_ends_with_a_null_stop_sequence_in_its_message_delta(start_sim: StartSim) -> None:
    sim = await start_sim()
    body = {"model": "qwen", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    events = await sse_events(sim.client, "/v1/messages", body)
    (delta,) = [e for e in events if e.get("type") == "message_delta"]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
