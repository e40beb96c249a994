"""OpenAI bodies: hypothesis strategies for chat-completions, completions, embeddings, Responses and Anthropic
Messages request bodies, right and wrong.

The fields are those of the OpenAI API's request schemas (``CreateChatCompletionRequest``,
``CreateCompletionRequest``) plus the vLLM extras the simulator reads (``ignore_eos``, ``add_generation_prompt``,
``continue_final_message``, ``stream_options.continuous_usage_stats``), each present or absent. A body is drawn in
one of two modes (`Mode`):

* well-formed: every field from its valid values (any text, all the prompt and content-part forms), so most
  such bodies are answered with a completion or a stream;
* hostile: each field at times from its boundaries (0, -1, 2**63, an empty list, a name no pool serves) or from
  any JSON value at all: wrong types, nulls, huge and negative numbers, NaN and Infinity, half a surrogate pair,
  nesting; and now and then without the required fields.

Unknown fields are added at times. `request_bytes` is what a client puts on the wire: mostly such a body as JSON
(non-ASCII escaped or raw), sometimes bytes that are no JSON object (truncated, not UTF-8, arbitrary, nested past
any parser's limit, another JSON type). `CONTENT_TYPES` is the header sent with it: JSON, at times with a
charset (one that does not exist among them) or another media type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

__all__ = [
    "ANY_JSON",
    "CONTENT_TYPES",
    "TEXT",
    "Kind",
    "Mode",
    "chat_bodies",
    "completion_bodies",
    "count_bodies",
    "message_bodies",
    "request_bytes",
    "response_bodies",
]

Kind = Literal["chat", "completion", "embedding", "response", "message", "count"]
Strategy = st.SearchStrategy[Any]
Fields = dict[str, Strategy]


def _rarely(usual: Strategy, rare: Strategy, one_in: int) -> Strategy:
    """``rare`` once in ``one_in`` draws, else ``usual`` (one_of would draw each about as often)."""
    return st.integers(1, one_in).flatmap(lambda i: rare if i == 1 else usual)


# Text, at times holding half a surrogate pair, which JSON can escape but no engine can encode.
TEXT = _rarely(
    st.text(max_size=24),  # any code point but surrogates: non-ASCII, controls, NULs
    st.lists(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=6).map("".join),
    one_in=6,
)
_HUGE = [2**31, 2**53 + 1, 2**63, 2**64, 10**30, -(2**63) - 1, -(10**30)]
NUMBERS = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, -0.0, 0.5, 1e308, -1e308, 5e-324, *_HUGE])
    | st.floats()  # NaN and +-Infinity included: json.dumps writes them as Python's json.loads reads them
)
# Any JSON value: the "wrong type" of every field.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)


@dataclass(frozen=True)
class Mode:
    """How a body's fields are drawn: only valid values, or (``hostile``) at times boundaries and any JSON."""

    hostile: bool

    @property
    def text(self) -> Strategy:
        return TEXT if self.hostile else st.text(max_size=24)

    def field(self, valid: Strategy, *boundaries: Any) -> Strategy:
        """A field's value; when hostile, valid three times in five, else a boundary or any JSON value."""
        if not self.hostile:
            return valid
        edge = st.sampled_from(boundaries) if boundaries else ANY_JSON
        return st.integers(0, 4).flatmap(lambda i: valid if i < 3 else edge if i == 3 else ANY_JSON)

    def count(self, low: int, high: int, *boundaries: Any) -> Strategy:
        edges = (low - 1, -1, 0, high + 1, *_HUGE, 1.5, "1", True, None, *boundaries)
        return self.field(st.integers(low, high), *edges)

    def unit(self, low: float, high: float) -> Strategy:
        edges = (low - 0.5, high + 0.5, 1e308, float("nan"), float("inf"), "0.5", None)
        return self.field(st.floats(low, high), *edges)


_JSON_SCHEMA = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={"properties": st.dictionaries(st.text(max_size=6), st.just({"type": "string"}), max_size=2)},
)


def _message(m: Mode) -> Strategy:
    part = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": m.field(m.text, None, 7)}),
        st.fixed_dictionaries(
            {"type": st.just("image_url"), "image_url": st.just({"url": "data:image/png;base64,"})},
        ),
        st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": st.just({"data": "", "format": "wav"})}),
        st.fixed_dictionaries({"type": m.text}),
    )
    tool_call = st.fixed_dictionaries(
        {
            "id": m.text,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": m.text, "arguments": m.text}),
        }
    )
    roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
    return st.fixed_dictionaries(
        {
            "role": m.field(roles, "", "function", "robot"),
            "content": m.field(m.text | st.lists(part, max_size=3), None, [], ""),
        },
        optional={
            "name": m.field(m.text),
            "tool_call_id": m.field(m.text),
            "tool_calls": m.field(st.lists(tool_call, max_size=2), []),
        },
    )


def _common(m: Mode) -> Fields:
    """Fields both requests take (sampling, streaming, penalties, identity, vLLM's extras)."""
    stream_options = st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    )
    logit_bias = st.dictionaries(st.integers(0, 151_000).map(str), st.integers(-100, 100), max_size=3)
    return {
        "max_tokens": m.count(1, 12, 8192, 10**6),
        "temperature": m.unit(0.0, 2.0),
        "top_p": m.unit(0.0, 1.0),
        "n": m.count(1, 1, 2, 128),
        "stop": m.field(m.text | st.lists(m.text, max_size=4), None, [], [""], ["a"] * 5),
        "stream": m.field(st.booleans(), None, 0, 1, "true"),
        "stream_options": m.field(stream_options, None, {}, {"include_usage": "yes"}, []),
        "seed": m.count(-(2**63), 2**63 - 1),
        "presence_penalty": m.unit(-2.0, 2.0),
        "frequency_penalty": m.unit(-2.0, 2.0),
        "logit_bias": m.field(logit_bias, {"x": 1}, {"1": 10**30}, {"-1": 0}),
        "user": m.field(m.text),
        "ignore_eos": m.field(st.booleans(), "yes"),
        "min_tokens": m.count(0, 4),
        "top_k": m.count(-1, 50),
    }


def _chat_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    tool = st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": m.text}, optional={"description": m.text, "parameters": _JSON_SCHEMA}
            ),
        }
    )
    named_tool = st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": m.text})}
    )
    response_format = st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
        st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries({"name": m.text, "schema": _JSON_SCHEMA}),
            }
        ),
    )
    required = {
        "model": m.field(st.just(model), "", "no-such-model", "Qwen/Qwen2.5-7B-Instruct", model.upper()),
        "messages": m.field(st.lists(_message(m), min_size=1, max_size=3), [], [{}], [[]], [None]),
    }
    optional = {
        **_common(m),
        "max_completion_tokens": m.count(1, 12, 8192, 10**6),
        "logprobs": m.field(st.booleans()),
        "top_logprobs": m.count(0, 20),
        "tools": m.field(st.lists(tool, max_size=2), []),
        "tool_choice": m.field(st.sampled_from(["none", "auto", "required"]) | named_tool, "sometimes"),
        "parallel_tool_calls": m.field(st.booleans()),
        "response_format": m.field(response_format, {"type": "xml"}, {}),
        "add_generation_prompt": m.field(st.booleans(), "no"),
        "continue_final_message": m.field(st.booleans(), "yes"),
    }
    return required, optional


def _completion_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    token_id = st.integers(0, 150_999)
    prompts = (
        m.text
        | st.lists(m.text, min_size=1, max_size=3)
        | st.lists(token_id, min_size=1, max_size=12)
        | st.lists(st.lists(token_id, min_size=1, max_size=6), min_size=1, max_size=3)
    )
    bad_prompts = ("", [], [[]], [""], [-1], [2**40], [0, "a"], [True], [[1], "a"], [1.5])
    required = {
        "model": m.field(st.just(model), "", "no-such-model", "Qwen/Qwen2.5-7B-Instruct"),
        "prompt": m.field(prompts, *bad_prompts),
    }
    optional = {
        **_common(m),
        "best_of": m.count(1, 1, 2, 0),
        "echo": m.field(st.booleans()),
        "suffix": m.field(m.text),
        "logprobs": m.count(0, 5),
    }
    return required, optional


def _embedding_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    required, _ = _completion_fields(m, model)
    required = {"model": required["model"], "input": required["prompt"]}  # the same four shapes as a prompt
    optional = {
        "encoding_format": m.field(st.sampled_from(["float", "base64"]), "binary", "", 7),
        "dimensions": m.count(1, 4096),
        "user": m.field(m.text),
        "add_special_tokens": m.field(st.booleans()),
    }
    return required, optional


def _response_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    """OpenAI's ``CreateResponse``: ``input`` a string or message items, and the fields a follow-up names."""
    content = m.text | st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": m.field(m.text, None)}),
        min_size=1,
        max_size=2,
    )
    item = st.fixed_dictionaries(
        {"role": m.field(st.sampled_from(["user", "assistant", "system", "developer"]), "robot"), "content": content},
        optional={"type": m.field(st.just("message"), "function_call_output")},
    )
    required = {
        "model": m.field(st.just(model), "", "no-such-model"),
        "input": m.field(m.text | st.lists(item, min_size=1, max_size=3), [], [{}], 7, None),
    }
    optional = {
        "instructions": m.field(m.text, 7, []),
        "max_output_tokens": m.count(1, 12, 8192, 10**6),
        "previous_response_id": m.field(st.just("resp_nothing"), "", 7, "resp_a.b"),
        "store": m.field(st.booleans(), "yes"),
        "background": m.field(st.just(False), True, "yes"),
        "stream": m.field(st.booleans(), None, 1),
        "temperature": m.unit(0.0, 2.0),
        "top_p": m.unit(0.0, 1.0),
        "metadata": m.field(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2), []),
        "user": m.field(m.text),
    }
    return required, optional


def _message_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    """Anthropic's ``MessageCreateParams``: ``max_tokens`` required, content strings or text blocks."""
    block = st.fixed_dictionaries({"type": m.field(st.just("text"), "image"), "text": m.field(m.text, None)})
    message = st.fixed_dictionaries(
        {
            "role": m.field(st.sampled_from(["user", "assistant"]), "robot", "system"),
            "content": m.field(m.text | st.lists(block, min_size=1, max_size=2), [], None),
        }
    )
    required = {
        "model": m.field(st.just(model), "", "no-such-model"),
        "max_tokens": m.count(1, 12, 8192, 10**6),
        "messages": m.field(st.lists(message, min_size=1, max_size=3), [], [{}]),
    }
    optional = {
        "system": m.field(m.text | st.lists(block, max_size=2), 7),
        "stream": m.field(st.booleans(), None, 1),
        "temperature": m.unit(0.0, 1.0),
        "top_p": m.unit(0.0, 1.0),
        "top_k": m.count(0, 50),
        "stop_sequences": m.field(st.lists(m.text, max_size=2), "x"),
        "metadata": m.field(st.fixed_dictionaries({}, optional={"user_id": m.text}), []),
    }
    return required, optional


def _count_fields(m: Mode, model: str) -> tuple[Fields, Fields]:
    """Anthropic's token count: a Messages body without ``max_tokens`` (nor ``stream``)."""
    required, optional = _message_fields(m, model)
    del required["max_tokens"], optional["stream"]
    return required, optional


def _body(required: Fields, optional: Fields) -> Strategy:
    """The fields, the optional ones each present or not, plus at times unknown ones (never a known name)."""
    known = set(required) | set(optional)
    extra = st.dictionaries(TEXT.filter(lambda k: k not in known), ANY_JSON, max_size=2)
    body = st.fixed_dictionaries(required, optional=optional)
    return _rarely(body, st.tuples(body, extra).map(lambda pair: {**pair[1], **pair[0]}), one_in=4)


def _bodies(fields: Any, model: str) -> st.SearchStrategy[dict[str, Any]]:
    well_formed = _body(*fields(Mode(hostile=False), model))
    required, optional = fields(Mode(hostile=True), model)
    # Without a model or messages at times: both are required, and their absence must be a 4xx too.
    hostile = _rarely(_body(required, optional), _body({}, {**required, **optional}), one_in=8)
    return st.one_of(well_formed, hostile)


def chat_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """``POST /v1/chat/completions`` bodies for a server that serves ``model``."""
    return _bodies(_chat_fields, model)


def completion_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """``POST /v1/completions`` bodies for a server that serves ``model``."""
    return _bodies(_completion_fields, model)


def embedding_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """``POST /v1/embeddings`` bodies for a pooling server that serves ``model``."""
    return _bodies(_embedding_fields, model)


def response_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """``POST /v1/responses`` bodies for a server that serves ``model``."""
    return _bodies(_response_fields, model)


def message_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """Anthropic ``POST /v1/messages`` bodies for a server that serves ``model``."""
    return _bodies(_message_fields, model)


def count_bodies(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """Anthropic ``POST /v1/messages/count_tokens`` bodies for a server that serves ``model``."""
    return _bodies(_count_fields, model)


def _not_an_object(body: bytes) -> st.SearchStrategy[bytes]:
    """Bytes a JSON parser refuses, or reads as something else than an object, or cannot read at all."""
    deep = st.sampled_from([64, 999, 1001, 1500, 1900]).map(lambda n: b'{"model":"m","messages":' + b"[" * n + b"]" * n)
    return st.one_of(
        st.integers(0, max(0, len(body) - 1)).map(lambda cut: body[:cut]),  # truncated
        st.integers(0, len(body)).map(lambda at: body[:at] + b"\xff\xfe" + body[at:]),  # not UTF-8
        st.binary(max_size=64),
        deep.map(lambda raw: raw + b"}"),
        st.sampled_from([b"", b"null", b"[]", b'"text"', b"1e999", b"NaN", b"{", b'{"model":}', b"\x00"]),
    )


def request_bytes(kind: Kind, model: str) -> st.SearchStrategy[bytes]:
    """What a client sends for ``kind``: a generated body as JSON (nine times in ten), else malformed bytes."""
    strategies = {
        "chat": chat_bodies,
        "completion": completion_bodies,
        "embedding": embedding_bodies,
        "response": response_bodies,
        "message": message_bodies,
        "count": count_bodies,
    }
    bodies = strategies[kind](model)
    # Non-ASCII as \u escapes, or as raw UTF-8 (where half a surrogate pair becomes bytes no UTF-8 decoder takes).
    encoded = st.tuples(bodies, _rarely(st.just(True), st.just(False), one_in=4)).map(
        lambda pair: json.dumps(pair[0], ensure_ascii=pair[1]).encode("utf-8", "surrogatepass")
    )
    return _rarely(encoded, encoded.flatmap(_not_an_object), one_in=10)


CONTENT_TYPES = _rarely(
    st.just("application/json"),
    st.sampled_from(
        [
            "application/json; charset=utf-8",
            "application/json; charset=utf-16",
            "application/json; charset=no-such-charset",
            "text/plain",
            "application/x-www-form-urlencoded",
            "",
        ]
    ),
    one_in=8,
)
