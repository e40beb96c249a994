"""``/v1/responses`` on the simulator as vLLM 0.33 serves it: the real ``openai`` client's create (whole and
streamed), retrieve, follow-ups and cancel, the store switch and the errors."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from engine_sim.responses import store_enabled
from tests.engine_sim.conftest import SimHandle, StartSim


def _client(sim: SimHandle) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0)


async def test_create_answers_a_response_object_with_usage_and_the_store_keeps_it(start_sim: StartSim) -> None:
    sim = await start_sim(responses_store=True)
    client = _client(sim)
    try:
        first = await client.responses.create(model="qwen", input="name a tide", max_output_tokens=12)
        again = await client.responses.retrieve(first.id)
    finally:
        await client.close()
    assert first.id.startswith("resp_") and first.object == "response" and first.model == "qwen"
    assert first.status == "incomplete" and first.incomplete_details is not None  # it ran to max_output_tokens
    assert first.usage is not None and first.usage.output_tokens == 12 and first.usage.input_tokens > 0
    assert first.output_text and again.output_text == first.output_text and again.id == first.id


async def test_a_stream_runs_from_created_to_completed_numbered_and_without_done(start_sim: StartSim) -> None:
    sim = await start_sim()
    client = _client(sim)
    try:
        async with client.responses.stream(model="qwen", input="name a tide", max_output_tokens=6) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    finally:
        await client.close()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert kinds.count("response.output_text.delta") == 6
    assert final.usage is not None and final.usage.output_tokens == 6
    raw = await sim.client.post("/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 2})
    events = [block for block in raw.text.split("\n\n") if block]
    assert all(block.startswith("event: ") for block in events) and "[DONE]" not in raw.text
    assert '"sequence_number":0' in events[0]


async def test_a_follow_up_continues_the_stored_conversation_without_its_instructions(start_sim: StartSim) -> None:
    sim = await start_sim(responses_store=True)
    alone = await sim.client.post("/v1/responses", json={"input": "and the next?", "max_output_tokens": 4})
    first = await sim.client.post(
        "/v1/responses", json={"input": "name a tide", "instructions": "Be brief. " * 40, "max_output_tokens": 4}
    )
    follow = await sim.client.post(
        "/v1/responses",
        json={"input": "and the next?", "previous_response_id": first.json()["id"], "max_output_tokens": 4},
    )
    assert follow.status_code == 200, follow.text
    assert follow.json()["previous_response_id"] == first.json()["id"]
    prompts = [r.json()["usage"]["input_tokens"] for r in (alone, first, follow)]
    # The follow-up's prompt holds the first exchange but not its 40 instructions' worth of tokens.
    assert prompts[0] < prompts[2] < prompts[1]


async def test_without_the_store_a_response_is_not_kept_and_background_is_refused(start_sim: StartSim) -> None:
    sim = await start_sim()
    assert not store_enabled({}) and store_enabled({"VLLM_ENABLE_RESPONSES_API_STORE": "1"})
    made = (await sim.client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})).json()
    missing = await sim.client.get(f"/v1/responses/{made['id']}")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": f"Response with id '{made['id']}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    follow = await sim.client.post("/v1/responses", json={"input": "hi", "previous_response_id": made["id"]})
    assert follow.status_code == 404
    background = await sim.client.post("/v1/responses", json={"input": "hi", "background": True})
    assert (
        background.status_code == 400 and "VLLM_ENABLE_RESPONSES_API_STORE=1" in background.json()["error"]["message"]
    )


async def test_a_background_response_is_queued_then_completes_and_only_it_can_be_cancelled(
    start_sim: StartSim,
) -> None:
    sim = await start_sim(responses_store=True, time_scale=1.0)
    client = _client(sim)
    try:
        queued = await client.responses.create(model="qwen", input="hi", background=True, max_output_tokens=3)
        assert queued.status == "queued"
        async with asyncio.timeout(10):
            while (done := await client.responses.retrieve(queued.id)).status == "queued":
                await asyncio.sleep(0.02)
        assert done.status == "incomplete" and done.usage is not None and done.usage.output_tokens == 3
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            await client.responses.cancel(done.id)
        long = await client.responses.create(model="qwen", input="hi", background=True, max_output_tokens=4000)
        cancelled = await client.responses.cancel(long.id)
        assert cancelled.status == "cancelled"
        assert (await client.responses.retrieve(long.id)).status == "cancelled"
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_unknown")
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "body.input"),
        ({"input": 3}, 400, "input"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input"),
        ({"input": "hi", "model": "other"}, 404, "model"),
        ({"input": "hi", "background": True, "store": False}, 400, "background"),
        ({"input": " tide" * 9000}, 400, "input_tokens"),
    ],
)
async def test_a_bad_request_gets_vllms_error(
    start_sim: StartSim, body: dict[str, object], status: int, param: str
) -> None:
    sim = await start_sim()
    response = await sim.client.post("/v1/responses", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_a_streamed_background_response_replays_after_any_event_to_its_end(start_sim: StartSim) -> None:
    sim = await start_sim(responses_store=True, time_scale=2.0)
    client = _client(sim)
    try:
        live = await client.responses.create(
            model="qwen", input="name a tide", background=True, stream=True, max_output_tokens=5
        )
        seen = [event async for event in live]
        response_id = seen[0].response.id  # type: ignore[union-attr]
        replayed = await client.responses.retrieve(response_id, stream=True, starting_after=3)
        tail = [event async for event in replayed]
        unstreamed = await client.responses.create(model="qwen", input="hi", background=True, max_output_tokens=2)
        with pytest.raises(openai.BadRequestError, match="background and stream"):
            await client.responses.retrieve(unstreamed.id, stream=True)
    finally:
        await client.close()
    assert seen[0].type == "response.created" and seen[-1].type == "response.completed"
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert [e.sequence_number for e in tail] == list(range(4, len(seen)))  # after event 3, to the end
    assert tail[-1].type == "response.completed"


async def test_the_response_object_carries_every_field_vllm_dumps(start_sim: StartSim) -> None:
    """vLLM 0.32's fields beyond OpenAI's (null or zero for one plain turn), as the differential suite recorded."""
    sim = await start_sim()
    body = {"input": "hi", "max_output_tokens": 3, "presence_penalty": 0.5}
    answer = (await sim.client.post("/v1/responses", json=body)).json()
    assert answer["presence_penalty"] == 0.5 and answer["frequency_penalty"] == 0.0
    nulls = ("kv_transfer_params", "ec_transfer_params", "input_messages", "output_messages")
    assert all(name in answer and answer[name] is None for name in nulls)
    usage = answer["usage"]
    assert usage["input_tokens_details"] == {
        "cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []
    }  # fmt: skip
    assert usage["output_tokens_details"] == {
        "reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []
    }  # fmt: skip
    (item,) = answer["output"]
    assert item["phase"] is None and "summary" not in item and item["id"].startswith("msg_") and len(item["id"]) == 20


async def test_a_streamed_message_keeps_its_item_id_into_the_completed_response(start_sim: StartSim) -> None:
    sim = await start_sim()
    body = {"input": "hi", "stream": True, "max_output_tokens": 2}
    raw = await sim.client.post("/v1/responses", json=body)
    events = [json.loads(block.split("data: ", 1)[1]) for block in raw.text.split("\n\n") if block]
    by_type = {event["type"]: event for event in events}
    added, done = by_type["response.output_item.added"], by_type["response.output_item.done"]
    final = events[-1]["response"]
    assert added["item"]["id"] == done["item"]["id"] == final["output"][0]["id"]
    assert added["item"]["phase"] is None and "summary" not in done["item"]
    assert final["presence_penalty"] == 0.0 and final["output_messages"] is None
