"""Continuation: the request that continues a broken stream on another engine, by token ids or by text.

Text cannot be continued exactly: the generated ids ("st", "orage") detokenize to text that re-encodes to other ids
("storage"), so the next engine sees another context and a greedy answer can change at the cut. So a stream the
gateway may resume asks its engine for ``return_token_ids: true`` (vLLM 0.11+: ``prompt_token_ids`` in the first
chunk, top level for chat, in the choice for completions; each chunk's own ``token_ids`` in its choice), relays
the events without them when the client did not ask for them (a present field set back to null, what vLLM sends
without the flag), and, when every generated token came with its id, continues by token ids instead:
``POST /v1/completions`` with the prompt's ids plus the generated ids as its ``prompt``, the sampling fields the
completions API shares (`_TOKEN_PATH_CARRIED`), and a chat's completions chunks rewritten into chat chunks. Ids
whose text has not been shown yet (the tail of an incomplete UTF-8 character) are left for the next engine to
generate again. Text resume stays the fallback: an engine that gave no ids, a request whose fields the
completions API cannot carry (tools, structured output, logprobs), stop strings (vLLM holds back the text that
could start one, so the shown text lags the ids), a chat with no token limit (completions default to 16).

By text (`gateway.resume`): the chat's messages plus the text so far as a final assistant message continued, or
the completion's prompt plus the text; ``max_tokens`` / ``max_completion_tokens`` (and ``min_tokens``) less the
tokens already sent either way.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.body import ParsedRequest
from gateway.resume import Continuation, Transcript

__all__ = ["Continuation", "continuation", "continuation_body"]

_COMPLETIONS = "/v1/completions"
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default (null means it too)
# Chat fields a completions request takes as they are (vLLM 0.32/0.33 ``CompletionRequest``): sampling, stopping,
# detokenization and the cache partition. The prompt's own fields (messages, templates, add_generation_prompt...)
# are in the prompt's ids already; any other field set to something more than its default keeps text resume.
_TOKEN_PATH_CARRIED = frozenset(
    {
        "model", "n", "stream", "stream_options", "user", "cache_salt",
        "temperature", "top_p", "top_k", "min_p", "seed", "logit_bias", "allowed_token_ids", "bad_words",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty", "watermarking",
        "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
        "skip_special_tokens", "spaces_between_special_tokens",
    }
)  # fmt: skip
_TOKEN_PATH_DROPPED = frozenset(
    {
        "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
        "chat_template_kwargs", "documents", "reasoning_effort", "truncate_prompt_tokens", "truncation_side",
        "max_tokens", "max_completion_tokens", "return_token_ids", "return_prompt_text", "parallel_tool_calls",
        "include_reasoning", "echo",
    }
)  # fmt: skip
_PROMPT_LIMITS = ("truncate_prompt_tokens", "truncation_side")  # the ids sent back are the truncated prompt already
# A field left at one of these changes nothing of the generation.
_DEFAULTS: tuple[Any, ...] = (None, False, 0, "", [], {}, "none", "auto")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def continuation(parsed: ParsedRequest, upstream_body: bytes, transcript: Transcript) -> Continuation | None:
    """The request that continues ``transcript``: by token ids where it can, else by its text (see the module
    docstring); ``upstream_body`` is the body first sent upstream. None when it cannot be continued."""
    if not transcript.can_continue:
        return None
    if not transcript.parts:  # nothing shown yet but the role delta: ask again (that delta is dropped)
        return Continuation(upstream_body, keeps_ids=True)
    payload: dict[str, Any] = json.loads(upstream_body)
    if transcript.has_ids and _token_path_fits(parsed.kind, payload):
        return _by_ids(parsed.kind, payload, transcript)
    body = _by_text(parsed.kind, payload, transcript)
    return None if body is None else Continuation(body, sent=transcript.tokens)


def continuation_body(parsed: ParsedRequest, upstream_body: bytes, transcript: Transcript) -> bytes | None:
    """`continuation`'s body (None when the stream cannot be continued)."""
    found = continuation(parsed, upstream_body, transcript)
    return None if found is None else found.body


def _token_path_fits(kind: str, payload: dict[str, Any]) -> bool:
    """Whether a completions request by token ids can carry everything the request asks of the generation."""
    if payload.get("stop") and payload.get("include_stop_str_in_output") is not True:
        return False  # vLLM holds back text that may begin a stop string: the text shown lags the ids
    if payload.get("prompt_logprobs") is not None:
        return False  # the longer prompt's logprobs are not the client's
    if kind == "completion":
        return True  # the same API: every field carries over
    if _int(payload.get("max_completion_tokens")) is None and _int(payload.get("max_tokens")) is None:
        return False  # a chat with no limit runs to the context's end; completions stop at 16 by default
    for message in payload["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            return False  # images and audio are more than their placeholder ids in the prompt
    for key, value in payload.items():
        if key in _TOKEN_PATH_CARRIED or key in _TOKEN_PATH_DROPPED or value in _DEFAULTS:
            continue
        if key == "response_format" and value == {"type": "text"}:
            continue
        return False  # tools, structured output, logprobs, beam search...: no completions equivalent here
    return True


def _left(payload: dict[str, Any], keys: tuple[str, ...], sent: int, default: int | None = None) -> bool:
    """Take ``sent`` tokens off each of the request's limits ``keys`` that is set (the last one ``default`` when
    unset) and off its ``min_tokens``; False when no token is left."""
    for key in keys:
        limit = _int(payload.get(key))
        if limit is None and key == keys[-1]:
            limit = default
        if limit is not None:
            if limit - sent < 1:
                return False
            payload[key] = limit - sent
    least = _int(payload.get("min_tokens"))
    if least is not None:
        payload["min_tokens"] = max(0, least - sent)
    return True


def _by_ids(kind: str, payload: dict[str, Any], transcript: Transcript) -> Continuation | None:
    """``POST /v1/completions`` with the prompt's ids and the generated ids shown so far as its prompt."""
    sent = transcript.shown
    prompt = [*(transcript.prompt_ids or ()), *transcript.ids[:sent]]  # has_ids: the prompt's ids are known
    if kind == "chat":
        limit = _int(payload.get("max_completion_tokens"))
        body = {key: value for key, value in payload.items() if key in _TOKEN_PATH_CARRIED}
        body["max_tokens"] = limit if limit is not None else payload["max_tokens"]
    else:
        body = {key: value for key, value in payload.items() if key not in _PROMPT_LIMITS}
    body.update(prompt=prompt, return_token_ids=True)
    if not _left(body, ("max_tokens",), sent, _COMPLETIONS_DEFAULT_MAX_TOKENS):
        return None
    return Continuation(_dumps(body), _COMPLETIONS, sent, completions_for_chat=kind == "chat", keeps_ids=True)


def _by_text(kind: str, payload: dict[str, Any], transcript: Transcript) -> bytes | None:
    """The request with the text shown so far as the assistant's prefill (chat) or the prompt's end."""
    text, sent = transcript.text, transcript.tokens
    if kind == "chat":
        messages = list(payload["messages"])
        if payload.get("continue_final_message") is True:
            last = messages[-1]
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        payload.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    else:
        prompt = payload["prompt"]
        payload["prompt"] = prompt + text if isinstance(prompt, str) else [prompt[0] + text]
    if not _left(payload, ("max_tokens", "max_completion_tokens"), sent):
        return None
    return _dumps(payload)
