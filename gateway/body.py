"""Body: parse and check an OpenAI completion request body, estimate its tokens, rewrite it for the engine.

The body is read once: `parse_body` keeps the raw bytes beside the parsed fields, and `upstream_body` writes what
the engine gets: the client's fields, with the gateway's own set (the tenant's ``cache_salt``, the usage chunk of a
stream, the served name).

**Fields clients may not send** (`ENGINE_ONLY`, the same on every route): vLLM's extensions that change
scheduling, caching or transfer are the gateway's to set, so a body carrying one (not null) is a 400 naming it:
``priority`` (vLLM's queue order), ``request_id`` (the engine's id of the request, and of a stored response),
``session_id`` (published in KV events), ``kv_transfer_params`` and ``ec_transfer_params`` (remote KV / encoder
cache transfer: another engine's blocks), ``vllm_xargs`` (arbitrary extension arguments). A null one is dropped.
``cache_salt`` is combined with the tenant's (`gateway.cache_salt`), never forwarded as sent; docs/gateway.md has
the table.

Tokens are estimated without a tokenizer (a gateway must not load one per model): prompt characters / 4 plus 4
per chat message, rounded up. The estimate only sizes the tokens-per-minute reservation; the engine's own
``usage`` settles the bill when the request ends.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.cache_salt import check_client_salt
from gateway.errors import BadRequest, UndecodableBody

__all__ = ["DEFAULT_RESERVE_TOKENS", "ENGINE_ONLY", "PATHS", "RUNNERS", "ParsedRequest", "parse_body"]

# Reserved for the completion when the request sets no max_tokens (reconciled with the actual count at the end).
DEFAULT_RESERVE_TOKENS = 1024

Kind = Literal["chat", "completion", "embedding", "response", "message", "count"]
# Where each kind goes on the engine, and which of vLLM's runners serves it (``engine.runner``): vLLM 0.33 serves
# OpenAI's Responses and Anthropic's Messages beside chat on a generative server.
PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "response": "/v1/responses",
    "message": "/v1/messages",
    "count": "/v1/messages/count_tokens",  # Anthropic's: a Messages body's prompt tokens, nothing generated
}
RUNNERS: dict[Kind, str] = {
    "chat": "generate",
    "completion": "generate",
    "embedding": "pooling",
    "response": "generate",
    "message": "generate",
    "count": "generate",
}

# vLLM 0.32-0.34 body fields that are the gateway's: refused when a client sets one (module docstring).
ENGINE_ONLY = ("priority", "request_id", "session_id", "kv_transfer_params", "ec_transfer_params", "vllm_xargs")
_OWNED = frozenset((*ENGINE_ONLY, "cache_salt"))  # never forwarded as the client sent them


@dataclass(frozen=True)
class ParsedRequest:
    """One request body: the bytes as received and the fields the gateway reads from them."""

    raw: bytes = field(repr=False)
    kind: Kind
    model: str
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage set by the client
    prompt: str
    prompt_tokens: int  # estimate
    max_tokens: int  # per choice, as reserved
    n: int
    payload: dict[str, Any]
    previous_response_id: str | None = None  # a Responses follow-up: the response it continues (the client's id)
    client_salt: str | None = None  # the client's own ``cache_salt`` (checked), combined with the tenant's

    @property
    def reserve_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens * self.n

    def upstream_body(
        self, served_name: str | None = None, previous_engine_id: str | None = None, cache_salt: str | None = None
    ) -> bytes:
        """The body sent to the engine: the client's fields less the gateway's own (`ENGINE_ONLY` left null,
        ``cache_salt``), with ``cache_salt`` set when given; streams always ask for the final usage chunk, an alias
        of the model (its repository id) becomes ``served_name``, the only name the engine serves, and a follow-up
        names its previous response by the engine's id (``previous_engine_id``)."""
        renamed = served_name is not None and served_name != self.model
        unchanged = not renamed and previous_engine_id is None and cache_salt is None
        if unchanged and (not self.stream or self.client_wants_usage) and _OWNED.isdisjoint(self.payload):
            return self.raw  # a token count without fields to drop: the bytes as received
        payload = {key: value for key, value in self.payload.items() if key not in _OWNED}
        if renamed:
            payload["model"] = served_name
        if previous_engine_id is not None:
            payload["previous_response_id"] = previous_engine_id
        if self.stream and not self.client_wants_usage:
            options = payload.get("stream_options")
            payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        if cache_salt is not None:
            payload["cache_salt"] = cache_salt
        return json.dumps(payload, separators=(",", ":")).encode()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # a surrogate escape at all: then look closer


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in ``value`` holds half a surrogate pair (json decodes a pair into one char)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _positive_int(payload: dict[str, Any], key: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"'{key}' must be a positive integer", param=key)
    return value


def _json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object of text."""
    try:
        payload = json.loads(raw.decode("utf-8"))  # strict: bytes that are not UTF-8 are the client's error
    except (ValueError, UnicodeDecodeError):
        raise UndecodableBody("request body is not valid UTF-8 JSON") from None
    except RecursionError:
        raise UndecodableBody("request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    if _LONE_SURROGATE.search(raw) and _has_lone_surrogate(payload):
        # JSON may escape one half of a surrogate pair ("\ud800"); no engine can encode such a string.
        raise BadRequest("request body holds a lone UTF-16 surrogate escape, which is not text")
    return payload


def _chat_prompt(payload: dict[str, Any]) -> tuple[str, int]:
    """A chat request's prompt text (for affinity) and its estimated tokens."""
    items = payload.get("messages")
    if not isinstance(items, list) or not items or not all(isinstance(m, dict) for m in items):
        raise BadRequest("'messages' must be a non-empty list of message objects", param="messages")
    prompt = "\n".join(f"{m.get('role', '')}:{_text(m.get('content'))}" for m in items)
    return prompt, math.ceil(len(prompt) / 4) + 4 * len(items)


def _completion_prompt(payload: dict[str, Any], key: str = "prompt") -> tuple[str, int]:
    """A completion request's prompt text (for affinity) and its tokens, counted or estimated; an embeddings
    request's ``input`` takes the same four shapes."""
    value = payload.get(key)
    if isinstance(value, str):
        return value, math.ceil(len(value) / 4)
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return " ".join(map(str, value[:512])), len(value)
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        prompt = "\n".join(value)
        return prompt, math.ceil(len(prompt) / 4)
    if isinstance(value, list) and value and all(_token_ids(t) for t in value):  # a batch of token lists
        return " ".join(map(str, value[0][:512])), sum(len(t) for t in value)
    raise BadRequest(
        f"'{key}' must be a string, a list of strings, a list of token ids or a list of token id lists", param=key
    )


def _response_prompt(payload: dict[str, Any]) -> tuple[str, int]:
    """A Responses request's prompt text (its instructions and input items) and its estimated tokens."""
    value = payload.get("input")
    if isinstance(value, str):
        items: list[Any] = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value and all(isinstance(i, dict) for i in value):
        items = value
    else:
        raise BadRequest("'input' must be a string or a non-empty list of input items", param="input")
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", param="instructions")
    head = f"system:{instructions}\n" if instructions else ""
    prompt = head + "\n".join(f"{i.get('role', '')}:{_text(i.get('content', i.get('output')))}" for i in items)
    return prompt, math.ceil(len(prompt) / 4) + 4 * len(items)


def _message_prompt(payload: dict[str, Any]) -> tuple[str, int]:
    """An Anthropic Messages request's prompt text (its system and messages) and its estimated tokens."""
    prompt, tokens = _chat_prompt(payload)
    system = payload.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BadRequest("'system' must be a string or a list of text blocks", param="system")
    head = _text(system)
    return (f"system:{head}\n{prompt}" if head else prompt), tokens + math.ceil(len(head) / 4)


def _previous(payload: dict[str, Any]) -> str | None:
    value = payload.get("previous_response_id")
    if value is not None and (not isinstance(value, str) or not value):
        raise BadRequest("'previous_response_id' must be a response id", param="previous_response_id")
    return value


def _generation_limits(payload: dict[str, Any], kind: Kind) -> tuple[int, int]:
    """(max tokens per choice as reserved, choices) of a generation."""
    if kind == "response":
        return _positive_int(payload, "max_output_tokens") or DEFAULT_RESERVE_TOKENS, 1
    if kind == "count":
        return 0, 1
    if kind == "message":  # Anthropic requires it
        asked = _positive_int(payload, "max_tokens")
        if asked is None:
            raise BadRequest("'max_tokens' is required", param="max_tokens")
        return asked, 1
    asked = _positive_int(payload, "max_completion_tokens") or _positive_int(payload, "max_tokens")
    return asked or DEFAULT_RESERVE_TOKENS, _positive_int(payload, "n") or 1


_PROMPTS = {"chat": _chat_prompt, "completion": _completion_prompt, "response": _response_prompt,
            "message": _message_prompt, "count": _message_prompt}  # fmt: skip


def parse_body(raw: bytes, kind: Kind) -> ParsedRequest:
    """Check the fields the gateway relies on (the engine checks the rest); BadRequest names the field."""
    payload = _json_object(raw)
    for name in ENGINE_ONLY:
        if payload.get(name) is not None:
            raise BadRequest(f"'{name}' is set by the gateway, not by clients", param=name)
    client_salt = payload.get("cache_salt")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string", param="model")
    stream = payload.get("stream")
    stream = False if stream is None else stream  # the API allows null: not streamed
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    options = payload.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    if kind == "embedding":  # no stream, no completion: the prompt's tokens are the whole bill
        prompt, prompt_tokens = _completion_prompt(payload, "input")
        stream, wants_usage, max_tokens, n = False, False, 0, 1
    else:
        prompt, prompt_tokens = _PROMPTS[kind](payload)
        max_tokens, n = _generation_limits(payload, kind)
        # Responses and Messages streams always carry their usage (in their last events): nothing to add or hide.
        wants_usage = wants_usage or kind in ("response", "message")
    return ParsedRequest(
        raw=raw,
        kind=kind,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        prompt=prompt,
        prompt_tokens=max(1, prompt_tokens),
        max_tokens=max_tokens,
        n=n,
        payload=payload,
        previous_response_id=_previous(payload) if kind == "response" else None,
        client_salt=None if client_salt is None else check_client_salt(client_salt),
    )
