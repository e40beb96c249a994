"""Property: whatever body a client sends, parsing it is a result or a 400, never another exception."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from gateway.body import parse_body
from gateway.errors import BadRequest

# Text that may hold half a surrogate pair, which JSON can escape but no engine can encode.
TEXT = st.text() | st.lists(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=8
).map("".join)
# Any JSON value, including strings with escapes, deep-ish nesting and odd numbers.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool"]) | JSON,
        "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text()})) | JSON,
    },
)
# Bodies shaped like OpenAI requests, each field sometimes right and sometimes anything at all.
REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "model": st.text(max_size=40) | JSON,
        "messages": st.lists(MESSAGE, max_size=4) | JSON,
        "prompt": st.text()
        | st.lists(st.text(), max_size=3)
        | st.lists(st.integers(), max_size=8)
        | st.lists(st.lists(st.integers(), max_size=4), max_size=3)
        | JSON,
        "stream": st.booleans() | st.none() | JSON,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
        "max_tokens": st.integers(-5, 10**6) | JSON,
        "max_completion_tokens": st.integers(-5, 10**6) | JSON,
        "n": st.integers(-2, 8) | JSON,
    },
)


def _check(raw: bytes, kind: Any) -> None:
    try:
        parsed = parse_body(raw, kind)
    except BadRequest:
        return
    sent = json.loads(parsed.upstream_body("served-name"))
    assert isinstance(sent, dict) and sent["model"] == "served-name"
    json.dumps(sent, ensure_ascii=False).encode("utf-8")  # text an engine can decode: no lone surrogate passes
    assert parsed.reserve_tokens >= 1


@settings(max_examples=400, deadline=None)
@given(body=REQUEST, kind=st.sampled_from(["chat", "completion"]))
def test_an_openai_shaped_body_is_parsed_or_refused_with_a_400(body: dict[str, Any], kind: Any) -> None:
    _check(json.dumps(body).encode(), kind)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()),
    kind=st.sampled_from(["chat", "completion"]),
)
def test_any_bytes_at_all_are_parsed_or_refused_with_a_400(raw: bytes, kind: Any) -> None:
    _check(raw, kind)


@settings(max_examples=300, deadline=None)
@given(contents=st.lists(TEXT, min_size=1, max_size=3), stream=st.booleans() | st.none())
def test_a_well_formed_chat_body_with_any_text_is_accepted_unless_it_is_not_text(
    contents: list[str], stream: bool | None
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": c} for c in contents], "stream": stream}
    _check(json.dumps(body).encode(), "chat")
