"""The resume logic on its own: which requests can be continued, the continuation request, and the rewriting of
a resumed engine's events into the first stream (ids, role delta, usage), with in-band engine errors spotted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.body import parse_body
from gateway.continuation import continuation, continuation_body
from gateway.resume import Transcript

USER = {"role": "user", "content": "Tell me about caches."}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], "stream": True, **extra}


def _event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(content: str | None, *, rid: str = "chatcmpl-1", created: int = 100, **delta: Any) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }


def _transcript(body: dict[str, Any], kind: str = "chat") -> Transcript:
    found = Transcript.for_request(parse_body(json.dumps(body).encode(), kind))
    assert found is not None
    return found


def _continued(body: dict[str, Any], texts: list[str], kind: str = "chat") -> dict[str, Any] | None:
    """The continuation of ``body`` after the engine streamed ``texts`` (one token each)."""
    parsed = parse_body(json.dumps(body).encode(), kind)
    transcript = Transcript.for_request(parsed)
    assert transcript is not None
    if kind == "chat":
        events = [_chunk("", role="assistant"), *(_chunk(t) for t in texts)]
    else:
        events = [{"id": "cmpl-1", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in texts]
    transcript.relay(b"".join(_event(e) for e in events))
    found = continuation_body(parsed, parsed.upstream_body(), transcript)
    return None if found is None else json.loads(found)


@pytest.mark.parametrize(
    ("name", "body", "kind", "expected"),
    [
        (
            "chat",
            _chat(max_tokens=10),
            "chat",
            {
                "messages": [USER, {"role": "assistant", "content": " the cache"}],
                "continue_final_message": True,
                "add_generation_prompt": False,
                "max_tokens": 8,
            },
        ),
        ("max-completion-tokens", _chat(max_completion_tokens=5, min_tokens=3), "chat",
         {"max_completion_tokens": 3, "min_tokens": 1}),
        (
            "client-prefill",
            _chat(
                messages=[USER, {"role": "assistant", "content": "Sure:"}],
                continue_final_message=True,
                add_generation_prompt=False,
            ),
            "chat",
            {"messages": [USER, {"role": "assistant", "content": "Sure: the cache"}]},
        ),
        ("completion", {"model": "m", "prompt": "Once", "stream": True, "max_tokens": 3}, "completion",
         {"prompt": "Once the cache", "max_tokens": 1}),
        ("completion-list", {"model": "m", "prompt": ["Once"], "stream": True}, "completion",
         {"prompt": ["Once the cache"]}),
    ],
)  # fmt: skip
def test_the_continuation_carries_the_text_sent_and_the_tokens_left(
    name: str, body: dict[str, Any], kind: str, expected: dict[str, Any]
) -> None:
    continued = _continued(body, [" the", " cache"], kind)
    assert continued is not None, name
    assert {key: continued.get(key) for key in expected} == expected
    assert continued["stream_options"] == {"include_usage": True}  # the gateway still reads the usage


def test_no_continuation_once_max_tokens_are_all_sent_and_the_same_request_before_any_text() -> None:
    assert _continued(_chat(max_tokens=2), [" the", " cache"]) is None
    body = _chat(max_tokens=2)
    parsed = parse_body(json.dumps(body).encode(), "chat")
    transcript = _transcript(body)
    transcript.relay(_event(_chunk("", role="assistant")))
    assert continuation_body(parsed, parsed.upstream_body(), transcript) == parsed.upstream_body()


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        pytest.param({"model": "m", "prompt": [1, 2, 3], "stream": True}, "completion", id="token-id-prompt"),
        pytest.param({"model": "m", "prompt": ["a", "b"], "stream": True}, "completion", id="two-prompts"),
        pytest.param({"model": "m", "prompt": "a", "stream": True, "echo": True}, "completion", id="echo"),
        pytest.param(_chat(n=2), "chat", id="two-choices"),
        pytest.param(
            _chat(
                messages=[USER, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}],
                continue_final_message=True,
            ),
            "chat",
            id="prefill-in-content-parts",
        ),
    ],
)
def test_requests_that_cannot_be_continued_from_text_are_not_resumed(body: dict[str, Any], kind: str) -> None:
    assert Transcript.for_request(parse_body(json.dumps(body).encode(), kind)) is None


def test_a_resumed_engine_reads_as_the_first_stream() -> None:
    transcript = _transcript(_chat())
    first = [_chunk("", role="assistant"), _chunk(" the"), _chunk(" cache")]
    sent, failure = transcript.relay(b"".join(_event(e) for e in first))
    assert failure is None and sent == b"".join(_event(e) for e in first)  # the first engine's bytes, untouched
    transcript.begin_resumed_part()
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 2,
        "total_tokens": 32,
        "prompt_tokens_details": {"cached_tokens": 29},
    }
    second = [
        _chunk("", role="assistant", rid="chatcmpl-2", created=200),
        _chunk(" is", rid="chatcmpl-2", created=200),
        {**_chunk(" fast", rid="chatcmpl-2", created=200)},
        {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 200, "model": "m", "choices": [],
         "usage": usage},
    ]  # fmt: skip
    second[2]["choices"][0]["finish_reason"] = "length"
    sent, failure = transcript.relay(b"".join(_event(e) for e in second) + b"data: [DONE]\n\n")
    assert failure is None and transcript.done
    events = [json.loads(line[6:]) for line in sent.decode().split("\n\n")[:-2]]
    assert [(e["id"], e["created"]) for e in events] == [("chatcmpl-1", 100)] * 3
    assert all("role" not in c["delta"] for e in events[:2] for c in e["choices"])  # no second role delta
    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == [" is", " fast"]
    # The engine counted the 2 tokens sent back as prompt: they are completion.
    assert events[2]["usage"] == {
        "prompt_tokens": 28,
        "completion_tokens": 4,
        "total_tokens": 32,
        "prompt_tokens_details": {"cached_tokens": 28},
    }
    assert transcript.text == " the cache is fast" and transcript.tokens == 4


@pytest.mark.parametrize(
    ("code", "failure", "resumable"),
    [(500, True, True), (None, True, True), (400, False, False)],
    ids=["engine-500", "no-code", "request-400"],
)
def test_an_engine_error_event_is_a_failure_and_a_request_error_is_relayed(
    code: int | None, failure: bool, resumable: bool
) -> None:
    transcript = _transcript(_chat())
    error = {"error": {"message": "EngineCore died", "type": "x", "param": None, "code": code}}
    stream = _event(_chunk(" the")) + _event(error) + b"data: [DONE]\n\n"
    sent, found = transcript.relay(stream)
    assert (found is not None) is failure
    assert sent == (_event(_chunk(" the")) if failure else stream)  # at a failure, nothing after it goes out
    assert transcript.resumable is resumable


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(_chunk(None, tool_calls=[{"index": 0, "id": "t"}]), id="tool-call"),
        pytest.param(_chunk(None, reasoning_content="hmm"), id="reasoning"),
        pytest.param({**_chunk(" a"), "choices": [{"index": 1, "delta": {"content": " a"}}]}, id="second-choice"),
    ],
)
def test_deltas_that_are_not_plain_text_stop_resuming(event: dict[str, Any]) -> None:
    transcript = _transcript(_chat())
    transcript.relay(_event(_chunk(" the")) + _event(event))
    assert not transcript.can_continue


def test_a_finished_generation_is_not_continued() -> None:
    transcript = _transcript(_chat())
    finished = _chunk(" the")
    finished["choices"][0]["finish_reason"] = "stop"
    transcript.relay(_event(finished))
    assert not transcript.can_continue


def _aborted(content: str | None) -> dict[str, Any]:
    event = _chunk(content)
    event["choices"][0]["finish_reason"] = "abort"
    return event


@pytest.mark.parametrize(("content", "relayed"), [(None, ""), (" cache", " cache")], ids=["bare", "with-text"])
def test_an_engine_abort_is_a_failure_and_its_text_goes_on_without_the_finish(
    content: str | None, relayed: str
) -> None:
    # vLLM ends what is unfinished at its --shutdown-timeout with finish_reason "abort": the drain of a scale-down
    transcript = _transcript(_chat())
    stream = _event(_chunk(" the")) + _event(_aborted(content)) + b"data: [DONE]\n\n"
    sent, found = transcript.relay(stream)
    assert found is not None and "abort" in found
    events = [json.loads(e[5:]) for e in sent.split(b"\n\n") if e]
    assert events == [
        _chunk(" the"),
        *([_chunk(relayed)] if relayed else []),
    ]  # no finish, no [DONE]: the resume ends it
    assert transcript.can_continue and transcript.text == " the" + relayed


def test_an_abort_on_a_stream_that_cannot_be_continued_is_relayed_as_is() -> None:
    transcript = _transcript(_chat())
    transcript.relay(_event(_chunk(None, tool_calls=[{"index": 0, "id": "t"}])))  # no longer a text prefix
    stream = _event(_aborted(None)) + b"data: [DONE]\n\n"
    assert transcript.relay(stream) == (stream, None)


# -- resume by token ids ---------------------------------------------------------------------------------------------

PROMPT_IDS = [1, 2, 3]


def _ids_chunk(content: str | None, ids: list[int] | None, **top: Any) -> dict[str, Any]:
    """A vLLM chat chunk asked for ``return_token_ids``: the delta's ids in the choice, the prompt's at the top."""
    chunk = _chunk(content)
    chunk["choices"][0]["token_ids"] = ids
    return {**chunk, **top}


def _ids_stream(pieces: list[tuple[str, list[int] | None]]) -> bytes:
    role = _chunk("", role="assistant")
    role["prompt_token_ids"] = PROMPT_IDS
    return b"".join(_event(e) for e in [role, *(_ids_chunk(t, ids) for t, ids in pieces)])


def _continuation(body: dict[str, Any], stream: bytes, kind: str = "chat") -> tuple[Transcript, Any]:
    parsed = parse_body(json.dumps(body).encode(), kind)
    transcript = Transcript.for_request(parsed)
    assert transcript is not None
    first = transcript.request_body(parsed.upstream_body())
    transcript.relay(stream)
    return transcript, continuation(parsed, first, transcript)


def test_a_resumable_stream_asks_for_token_ids_and_its_client_sees_none_it_did_not_ask_for() -> None:
    transcript = _transcript(_chat(max_tokens=10))
    parsed = parse_body(json.dumps(_chat(max_tokens=10)).encode(), "chat")
    assert json.loads(transcript.request_body(parsed.upstream_body()))["return_token_ids"] is True
    sent, failure = transcript.relay(_ids_stream([(" st", [7]), ("orage", [8])]))
    events = [json.loads(e[5:]) for e in sent.split(b"\n\n") if e]
    assert failure is None and events[0]["prompt_token_ids"] is None  # null: what vLLM sends without the flag
    assert [e["choices"][0].get("token_ids") for e in events] == [None, None, None]
    assert transcript.prompt_ids == PROMPT_IDS and transcript.ids == [7, 8] and transcript.has_ids


def test_a_client_that_asked_for_token_ids_gets_them_and_its_body_is_left_alone() -> None:
    body = _chat(max_tokens=10, return_token_ids=True)
    parsed = parse_body(json.dumps(body).encode(), "chat")
    transcript = _transcript(body)
    assert transcript.request_body(parsed.upstream_body()) == parsed.upstream_body()
    stream = _ids_stream([(" st", [7])])
    assert transcript.relay(stream) == (stream, None)


def test_a_chat_resumes_on_completions_with_the_prompt_ids_and_the_generated_ids() -> None:
    body = _chat(max_completion_tokens=10, min_tokens=4, temperature=0, seed=3, top_k=5, stop_token_ids=[9])
    transcript, continued = _continuation(body, _ids_stream([(" st", [7]), ("orage", [8]), ("", [11])]))
    assert continued is not None and continued.path == "/v1/completions" and continued.completions_for_chat
    assert continued.sent == 2  # the id whose text was not shown yet (half a character) is generated again
    sent = json.loads(continued.body)
    assert sent == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "seed": 3,
        "top_k": 5,
        "stop_token_ids": [9],
        "min_tokens": 2,
        "max_tokens": 8,
        "prompt": [*PROMPT_IDS, 7, 8],
        "return_token_ids": True,
    }


@pytest.mark.parametrize(
    ("name", "body", "ids"),
    [
        ("no-ids", _chat(max_tokens=10), False),
        ("no-limit", _chat(), True),
        ("stop-strings", _chat(max_tokens=10, stop=["\n"]), True),
        ("tools", _chat(max_tokens=10, tools=[{"type": "function", "function": {"name": "f"}}]), True),
        ("json", _chat(max_tokens=10, response_format={"type": "json_object"}), True),
        ("logprobs", _chat(max_tokens=10, logprobs=True), True),
        ("image", _chat(max_tokens=10, messages=[{"role": "user", "content": [{"type": "image_url"}]}]), True),
    ],
)  # fmt: skip
def test_a_stream_falls_back_to_text_resume_where_token_ids_cannot_carry_it(
    name: str, body: dict[str, Any], ids: bool
) -> None:
    pieces: list[tuple[str, list[int] | None]] = [(" the", [7] if ids else None), (" cache", [8] if ids else None)]
    _, continued = _continuation(body, _ids_stream(pieces))
    assert continued is not None and continued.path is None and not continued.keeps_ids, name
    messages = json.loads(continued.body)["messages"]
    assert messages[-1] == {"role": "assistant", "content": " the cache"}, name


def test_a_completions_stream_resumes_by_ids_in_its_own_shape() -> None:
    body = {"model": "m", "prompt": "Once", "stream": True, "temperature": 0}
    chunks = [
        {"id": "cmpl-1", "choices": [{"index": 0, "text": " upon", "prompt_token_ids": PROMPT_IDS, "token_ids": [7]}]},
        {"id": "cmpl-1", "choices": [{"index": 0, "text": " a", "prompt_token_ids": None, "token_ids": [8]}]},
    ]
    _, continued = _continuation(body, b"".join(_event(c) for c in chunks), "completion")
    assert continued is not None and continued.path == "/v1/completions" and not continued.completions_for_chat
    sent = json.loads(continued.body)
    assert sent["prompt"] == [*PROMPT_IDS, 7, 8] and sent["max_tokens"] == 14  # vLLM's default of 16, less 2


def test_completions_chunks_continuing_a_chat_read_as_its_chat_chunks() -> None:
    transcript, continued = _continuation(_chat(max_tokens=10), _ids_stream([(" st", [7]), ("orage", [8])]))
    transcript.begin_resumed_part(continued)
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    second = [
        {"id": "cmpl-2", "object": "text_completion", "created": 200, "model": "m",
         "choices": [{"index": 0, "text": "st", "logprobs": None, "finish_reason": None, "stop_reason": None,
                      "prompt_token_ids": [*PROMPT_IDS, 7, 8], "token_ids": [7]}]},
        {"id": "cmpl-2", "object": "text_completion", "created": 200, "model": "m",
         "choices": [{"index": 0, "text": "orage", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                      "prompt_token_ids": None, "token_ids": [8]}]},
        {"id": "cmpl-2", "object": "text_completion", "created": 200, "model": "m", "choices": [], "usage": usage},
    ]  # fmt: skip
    sent, failure = transcript.relay(b"".join(_event(e) for e in second) + b"data: [DONE]\n\n")
    events = [json.loads(e[5:]) for e in sent.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert failure is None and transcript.done and transcript.text == " storagestorage"
    assert [(e["id"], e["object"], e["created"]) for e in events] == [("chatcmpl-1", "chat.completion.chunk", 100)] * 3
    assert [e["choices"] for e in events[:2]] == [
        [{"index": 0, "delta": {"content": "st"}, "logprobs": None, "finish_reason": None, "token_ids": None}],
        [{"index": 0, "delta": {"content": "orage"}, "logprobs": None, "finish_reason": "length", "stop_reason": None,
          "token_ids": None}],
    ]  # fmt: skip
    assert events[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert transcript.ids == [7, 8, 7, 8]


def test_a_stream_resumed_by_ids_resumes_by_ids_again_and_one_resumed_by_text_does_not() -> None:
    transcript, continued = _continuation(_chat(max_tokens=10), _ids_stream([(" st", [7])]))
    transcript.begin_resumed_part(continued)
    more = {"id": "cmpl-2", "choices": [{"index": 0, "text": "orage", "finish_reason": None, "token_ids": [8]}]}
    transcript.relay(_event(more))
    parsed = parse_body(json.dumps(_chat(max_tokens=10)).encode(), "chat")
    again = continuation(parsed, transcript.request_body(parsed.upstream_body()), transcript)
    assert again is not None and json.loads(again.body)["prompt"] == [*PROMPT_IDS, 7, 8]
    assert json.loads(again.body)["max_tokens"] == 8
    text_only = _transcript(_chat(max_tokens=10))
    text_only.relay(_event(_chunk(" the")))
    text_only.begin_resumed_part()
    assert not text_only.has_ids
