"""The corpus: every route the gateway uses or relays, and the error cases it and its tests depend on.

Each probe is sent, in this order, to both engines. Greedy sampling and ``ignore_eos`` make the generated length
depend on ``max_tokens`` only, so token counts, finish reasons and the number of streamed chunks can match
although the texts (random weights against the simulator's filler) never do. A probe that follows up on an
earlier answer names it: ``"{id:<probe>}"`` in its body or path is that probe's ``id`` on the same engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.differential.exchange import Exchange

__all__ = ["CORPUS", "MODEL", "Probe"]

MODEL = "qwen2.5-7b-instruct"  # the served name both engines answer to
GREEDY = {"temperature": 0, "ignore_eos": True}
USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]
PROMPT = "The fleet runs engines on many nodes, and"
LONG_PROMPT = "word " * 2100  # past max_model_len (2048) in any tokenizer that keeps a word and its space together


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    raw: str | None = None  # a body sent as these bytes (bad JSON)
    auth: bool = True
    needs: tuple[str, ...] = field(default=())  # earlier probes whose ids this one uses

    def url_path(self, earlier: Mapping[str, Exchange]) -> str:
        return str(_resolve(self.path, earlier))

    def json_body(self, earlier: Mapping[str, Exchange]) -> Any:
        return None if self.body is None else _resolve(self.body, earlier)


def _resolve(value: Any, earlier: Mapping[str, Exchange]) -> Any:
    if isinstance(value, str) and "{id:" in value:
        head, _, rest = value.partition("{id:")
        name, _, tail = rest.partition("}")
        answer = earlier[name].body
        return head + (answer.get("id", "") if isinstance(answer, dict) else "") + tail
    if isinstance(value, dict):
        return {k: _resolve(v, earlier) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, earlier) for v in value]
    return value


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": 8, **GREEDY, **extra}


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, **GREEDY, **extra}


def _messages(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Name three rivers."}],
            "temperature": 0, **extra}  # fmt: skip


CORPUS: tuple[Probe, ...] = (
    # Plain routes.
    Probe("health", "GET", "/health", auth=False),
    Probe("ping", "GET", "/ping", auth=False),
    Probe("version", "GET", "/version"),
    Probe("load", "GET", "/load"),
    Probe("models", "GET", "/v1/models"),
    Probe("models without key", "GET", "/v1/models", auth=False),
    # Chat.
    Probe("chat", "POST", "/v1/chat/completions", _chat()),
    Probe("chat stream", "POST", "/v1/chat/completions", _chat(stream=True)),
    Probe(
        "chat stream usage", "POST", "/v1/chat/completions", _chat(stream=True, stream_options={"include_usage": True})
    ),  # fmt: skip
    Probe("chat stop", "POST", "/v1/chat/completions", _chat(stop=["\u2603\u2603"])),
    Probe("chat logprobs", "POST", "/v1/chat/completions", _chat(logprobs=True, top_logprobs=2)),
    Probe("chat n=2", "POST", "/v1/chat/completions", _chat(n=2)),
    Probe("chat max_tokens too large", "POST", "/v1/chat/completions", _chat(max_tokens=4000)),
    Probe(
        "chat prompt too long",
        "POST",
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": LONG_PROMPT}]),
    ),  # fmt: skip
    Probe("chat unknown model", "POST", "/v1/chat/completions", _chat(model="no-such-model")),
    Probe("chat negative temperature", "POST", "/v1/chat/completions", _chat(temperature=-1)),
    Probe("chat without messages", "POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 8}),
    Probe("chat bad json", "POST", "/v1/chat/completions", raw='{"model": "qwen2.5-7b-instruct", "messages": ['),
    # Completions.
    Probe("completion", "POST", "/v1/completions", _completion()),
    Probe("completion stream", "POST", "/v1/completions", _completion(stream=True)),
    Probe(
        "completion stream usage",
        "POST",
        "/v1/completions",
        _completion(stream=True, stream_options={"include_usage": True}),
    ),  # fmt: skip
    Probe("completion token ids", "POST", "/v1/completions", _completion(prompt=[17, 42, 99, 256, 1024])),
    Probe("completion two prompts", "POST", "/v1/completions", _completion(prompt=[PROMPT, "A second prompt"])),
    Probe("completion n=2", "POST", "/v1/completions", _completion(n=2)),
    Probe("completion logprobs", "POST", "/v1/completions", _completion(logprobs=2)),
    Probe(
        "completion return token ids", "POST", "/v1/completions", _completion(stream=True, return_token_ids=True)
    ),  # fmt: skip
    # Responses (the store is on in both).
    Probe(
        "responses create",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Name three rivers.", "max_output_tokens": 8, "temperature": 0},
    ),  # fmt: skip
    Probe(
        "responses stream",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Name three rivers.", "max_output_tokens": 8, "temperature": 0, "stream": True},
    ),
    Probe(
        "responses follow-up",
        "POST",
        "/v1/responses",
        {
            "model": MODEL,
            "input": "And three more.",
            "max_output_tokens": 8,
            "temperature": 0,
            "previous_response_id": "{id:responses create}",
        },
        needs=("responses create",),
    ),  # fmt: skip
    Probe("responses retrieve", "GET", "/v1/responses/{id:responses create}", needs=("responses create",)),
    Probe("responses unknown id", "GET", "/v1/responses/resp_nosuchresponse"),
    Probe(
        "responses background",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Name three rivers.", "max_output_tokens": 8, "background": True},
    ),
    Probe("responses cancel done", "POST", "/v1/responses/{id:responses create}/cancel", needs=("responses create",)),
    # Anthropic Messages.
    Probe("messages", "POST", "/v1/messages", _messages()),
    Probe("messages stream", "POST", "/v1/messages", _messages(stream=True)),
    Probe(
        "messages count tokens",
        "POST",
        "/v1/messages/count_tokens",
        {"model": MODEL, "messages": [{"role": "user", "content": "Name three rivers."}]},
    ),  # fmt: skip
    Probe(
        "messages without max_tokens",
        "POST",
        "/v1/messages",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    ),  # fmt: skip
    Probe("messages bad messages", "POST", "/v1/messages", _messages(messages="not a list")),
    Probe("messages unknown model", "POST", "/v1/messages", _messages(model="no-such-model")),
    # Tokenizer and the routes a generating model does not serve.
    Probe("tokenize prompt", "POST", "/tokenize", {"model": MODEL, "prompt": PROMPT}),
    Probe("tokenize chat", "POST", "/tokenize", {"model": MODEL, "messages": USER}),
    Probe("embeddings on a generating model", "POST", "/v1/embeddings", {"model": MODEL, "input": "hi"}),
)

assert len({p.name for p in CORPUS}) == len(CORPUS), "probe names are keys"
assert json.dumps([p.body for p in CORPUS])  # every body is JSON
