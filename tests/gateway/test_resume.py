"""The resume logic on its own: which requests can be continued, the continuation request, and the rewriting of
a resumed engine's events into the first stream (ids, role delta, usage), with in-band engine errors spotted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.body import parse_body
from gateway.resume import Transcript, continuation_body

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
