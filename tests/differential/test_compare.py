"""The comparison finds what differs and only that: values that cannot match are compared by kind, structure and
everything else exactly, and a stream by its runs of events."""

from __future__ import annotations

from typing import Any

from tests.differential.compare import compare
from tests.differential.exchange import Exchange, parse_sse
from tests.differential.known import BEGIN, END, check, documented_keys, render_section


def _json(body: Any, status: int = 200) -> Exchange:
    return Exchange("p", status, "application/json", "json", body)


def _keys(real: Exchange, sim: Exchange) -> list[str]:
    return [d.key for d in compare(real, sim)]


def test_same_answers_with_other_text_ids_and_floats_do_not_differ() -> None:
    real = {"id": "a", "created": 1, "choices": [{"text": "x", "logprobs": {"token_logprobs": [-0.5]}}], "n": 3}
    sim = {"id": "b", "created": 2, "choices": [{"text": "yy", "logprobs": {"token_logprobs": [-1.25]}}], "n": 3}
    assert _keys(_json(real), _json(sim)) == []


def test_a_value_a_kind_a_missing_and_an_extra_field_each_differ() -> None:
    real = {"usage": {"prompt_tokens": 7}, "finish_reason": "length", "stop_reason": None, "text": "a"}
    sim = {"usage": {"prompt_tokens": 8}, "finish_reason": None, "text": 3, "extra": 1}
    assert _keys(_json(real), _json(sim)) == [
        "p | body.usage.prompt_tokens | value",
        "p | body.finish_reason | kind",
        "p | body.stop_reason | missing in the simulator",
        "p | body.text | kind",  # a varying value is still compared by kind
        "p | body.extra | only in the simulator",
    ]


def test_status_media_type_and_list_length_differ() -> None:
    real, sim = _json({"data": [1, 2]}, 200), Exchange("p", 400, "text/plain", "json", {"data": [1]})
    assert _keys(real, sim) == ["p | status | status", "p | media type | value", "p | body.data | length"]


def test_a_stream_is_compared_by_its_runs_of_events() -> None:
    def stream(chunks: int, usage: bool, done: bool = True) -> Exchange:
        text = "".join(f'data: {{"choices": [{{"text": "t{i}", "finish_reason": null}}]}}\n\n' for i in range(chunks))
        text += 'data: {"choices": [{"text": "", "finish_reason": "length"}]}\n\n'
        text += 'data: {"choices": [], "usage": {"total_tokens": 9}}\n\n' if usage else ""
        text += "data: [DONE]\n\n" if done else ""
        return Exchange("p", 200, "text/event-stream", "sse", parse_sse(text))

    assert _keys(stream(3, True), stream(8, True)) == []  # more chunks of the same shape: no difference
    assert "p | events | length" in _keys(stream(3, True), stream(3, False))
    assert "p | events | length" in _keys(stream(3, True), stream(3, True, done=False))


def test_named_events_keep_their_names_and_order() -> None:
    a = parse_sse("event: start\ndata: {}\n\nevent: stop\ndata: {}\n\n")
    b = parse_sse("event: stop\ndata: {}\n\nevent: start\ndata: {}\n\n")
    sse = [Exchange("p", 200, "text/event-stream", "sse", x) for x in (a, b)]
    assert _keys(*sse) == ["p | events[0].event | value", "p | events[1].event | value"]


def test_an_unlisted_difference_fails_the_check_and_so_does_a_stale_entry(monkeypatch: Any) -> None:
    from tests.differential import known

    found = compare(_json({"a": 1}), _json({"a": 2}))
    assert check(found) and "new difference: p | body.a | value" in check(found)[0]
    monkeypatch.setattr(known, "KNOWN", (known.Known("p | body.a | *", "the reason"),))
    assert check(found) == []
    assert "listed but not seen" in check([])[0]


def test_the_generated_list_round_trips_its_keys() -> None:
    found = compare(_json({"a": 1, "b": "x|y"}), _json({"a": 2}))
    text = f"intro\n{render_section(found)}\noutro"
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert documented_keys(text) == [d.key for d in found]
