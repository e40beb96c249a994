"""Continuing a generation: vLLM's continue_final_message / add_generation_prompt, and position-aware text that
a continuation picks up exactly where it stopped (no gap, no repeat), with the same natural end."""

from __future__ import annotations

from typing import Any

import pytest

from engine_sim.tokenizer import chat_prompt_ids, encode, filler_ids, filler_text, strip_generated, token_text
from tests.engine_sim.conftest import SimHandle, StartSim, sse_events

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about caches."}]


def _words(text: str) -> list[str]:
    """The generated text's tokens (each filler word is one token)."""
    return [token_text(i) for i in encode(text)]


async def _chat(sim: SimHandle, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = await sim.client.post(CHAT, json={"model": "qwen", "messages": messages, **extra})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _messages_with(prefix: str) -> list[dict[str, Any]]:
    return [*MESSAGES, {"role": "assistant", "content": prefix}]


@pytest.mark.parametrize("cut", [1, 13, 39])
async def test_a_continued_chat_answer_goes_on_where_it_stopped(start_sim: StartSim, cut: int) -> None:
    sim = await start_sim()
    whole = await _chat(sim, MESSAGES, max_tokens=40)
    words = _words(whole["choices"][0]["message"]["content"])
    assert len(words) == 40
    prefix = "".join(words[:cut])
    rest = await _chat(
        sim, _messages_with(prefix), max_tokens=40 - cut, continue_final_message=True, add_generation_prompt=False
    )
    assert rest["choices"][0]["message"]["content"] == "".join(words[cut:])
    assert rest["choices"][0]["finish_reason"] == "length"
    # The continued text is prompt: the original prompt plus the cut.
    assert rest["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + cut
    assert rest["usage"]["completion_tokens"] == 40 - cut


async def test_a_continuation_without_max_tokens_stops_where_the_whole_answer_stops(start_sim: StartSim) -> None:
    sim = await start_sim(time_scale=200.0)
    whole = await _chat(sim, MESSAGES)
    words = _words(whole["choices"][0]["message"]["content"])
    assert whole["choices"][0]["finish_reason"] == "stop" and 16 <= len(words) <= 512
    cut = len(words) // 2
    events = await sse_events(
        sim.client,
        CHAT,
        {
            "model": "qwen",
            "messages": _messages_with("".join(words[:cut])),
            "continue_final_message": True,
            "add_generation_prompt": False,
            "stream": True,
        },
    )
    chunks = [e for e in events[:-1] if e["choices"]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "".join(words[cut:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_completion_prompt_ending_in_generated_text_is_continued(start_sim: StartSim) -> None:
    sim = await start_sim()
    prompt = "Write about queues:"
    whole = (
        await sim.client.post("/v1/completions", json={"model": "qwen", "prompt": prompt, "max_tokens": 30})
    ).json()
    words = _words(whole["choices"][0]["text"])
    body = {"model": "qwen", "prompt": prompt + "".join(words[:11]), "max_tokens": 19}
    rest = (await sim.client.post("/v1/completions", json=body)).json()
    assert rest["choices"][0]["text"] == "".join(words[11:])
    assert rest["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + 11


async def test_without_a_generation_prompt_the_template_is_closed(start_sim: StartSim) -> None:
    sim = await start_sim()
    opened = await _chat(sim, MESSAGES, max_tokens=1)
    closed = await _chat(sim, MESSAGES, max_tokens=1, add_generation_prompt=False)
    # The assistant header "<|im_start|>assistant\n" is 4 tokens: marker, "assist", "ant", newline.
    assert opened["usage"]["prompt_tokens"] - closed["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize(
    ("extra", "messages", "param", "message"),
    [
        pytest.param(
            {"continue_final_message": True, "add_generation_prompt": True},
            _messages_with(" the"),
            None,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            id="both-true",
        ),
        pytest.param(
            {"continue_final_message": True},
            _messages_with(" the"),
            "add_generation_prompt",
            "not compatible",
            id="generation-prompt-left-at-its-default",
        ),
        pytest.param(
            {"continue_final_message": True, "add_generation_prompt": False},
            MESSAGES,
            "messages",
            "final message to be an assistant message",
            id="last-message-not-assistant",
        ),
        pytest.param(
            {"continue_final_message": "yes", "add_generation_prompt": False},
            _messages_with(" the"),
            "continue_final_message",
            "must be a boolean",
            id="not-a-boolean",
        ),
    ],
)
async def test_continue_final_message_is_refused_like_vllm(
    start_sim: StartSim, extra: dict[str, Any], messages: list[dict[str, Any]], param: str | None, message: str
) -> None:
    sim = await start_sim()
    for stream in (False, True):  # a streaming request is refused before its stream opens, as plain JSON
        body = {"model": "qwen", "messages": messages, "max_tokens": 4, "stream": stream, **extra}
        response = await sim.client.post(CHAT, json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["code"], error["param"], error["type"]) == (400, param, "BadRequestError")
        assert message in error["message"]


def test_generated_text_round_trips_to_its_own_ids() -> None:
    ids = filler_ids(seed=0, start=57, count=300)
    assert encode(filler_text(ids)) == ids
    assert strip_generated([1, 2, 3, *ids]) == [1, 2, 3]


def test_an_open_final_message_is_the_closed_prompt_plus_its_text() -> None:
    text = filler_text(filler_ids(seed=0, start=0, count=9))
    prompt = chat_prompt_ids(MESSAGES)
    continued = chat_prompt_ids(_messages_with(text), add_generation_prompt=False, continue_final=True)
    assert continued == prompt + encode(text)


async def test_return_token_ids_gives_the_ids_and_a_prompt_of_them_continues_the_answer_exactly(
    start_sim: StartSim,
) -> None:
    # vLLM's return_token_ids: the prompt's ids in a chat stream's first chunk (top level) or a completion's first
    # choice, each chunk's ids in its choice; a completion whose prompt is those ids continues the chat's answer.
    sim = await start_sim(time_scale=200.0)
    body = {"model": "qwen", "messages": MESSAGES, "max_tokens": 12, "return_token_ids": True}
    whole = await _chat(sim, body["messages"], max_tokens=12, return_token_ids=True)
    prompt_ids, ids = whole["prompt_token_ids"], whole["choices"][0]["token_ids"]
    assert len(ids) == 12 and prompt_ids == chat_prompt_ids(MESSAGES)
    events = await sse_events(sim.client, CHAT, {**body, "stream": True})
    chunks = [e for e in events[:-1] if e["choices"]]
    assert chunks[0]["prompt_token_ids"] == prompt_ids and "token_ids" not in chunks[0]["choices"][0]
    assert [i for c in chunks[1:] for i in c["choices"][0]["token_ids"]] == ids
    assert all("prompt_token_ids" not in c for c in chunks[1:])  # a chat stream has them in its role chunk only
    completion = {"model": "qwen", "prompt": prompt_ids + ids[:5], "max_tokens": 7, "return_token_ids": True}
    rest = await sse_events(sim.client, "/v1/completions", {**completion, "stream": True})
    choices = [e["choices"][0] for e in rest[:-1] if e["choices"]]
    assert choices[0]["prompt_token_ids"] == prompt_ids + ids[:5]
    assert all(c["prompt_token_ids"] is None for c in choices[1:])  # vLLM sends null after the first chunk
    assert [c["token_ids"] for c in choices] == [[i] for i in ids[5:]]
    assert "".join(c["text"] for c in choices) == filler_text(ids[5:])
    plain = await sim.client.post("/v1/completions", json=completion)
    assert plain.json()["choices"][0]["token_ids"] == ids[5:]
    assert plain.json()["choices"][0]["prompt_token_ids"] == prompt_ids + ids[:5]
