"""Resume: what a stream has shown its client so far, and the request that continues it on another engine.

A stream broken mid-way (engine killed, connection lost) is continued with vLLM's own means:

* chat: the messages plus the text generated so far as a final assistant message, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (a final assistant message the client
  itself sent to be continued gets the text appended instead);
* completions: the prompt plus the text generated so far (a prompt of token ids cannot take text: not resumed);
* ``max_tokens`` / ``max_completion_tokens`` (and ``min_tokens``) less the tokens already sent.

A stream the gateway may resume asks its engine for ``return_token_ids`` (the ids are hidden again from a client
that did not ask for them): where every token came with its id, it is continued by token ids instead, exactly
(`gateway.continuation`).

`Transcript` reads every event relayed to the client: it keeps the text and the tokens (content-bearing events,
one token each as vLLM streams them), the response's ``id``, ``created`` and ``model``, and whether the stream can
still be continued faithfully (one choice; nothing but text in the deltas: tool calls, reasoning or a second choice
cannot be replayed as a prefix; not finished yet). After a resume it rewrites the new engine's events so the
client sees one stream: the first response's id, created and model; no second role-only first delta; ``usage``
covering both parts (prompt: the original prompt, without the text sent back; completion: all tokens).

An in-band engine error event (``data: {"error": ...}`` with a 5xx code or none, what vLLM sends when its engine
dies) is a failure like a broken connection: `Transcript.relay` stops at it. A 4xx error event is the request's own
problem: it is relayed as is and the stream is no longer resumed. So is ``finish_reason: "abort"`` on a stream that
can still be continued: no client asked for it (a client that leaves is not relayed to), so its engine ended the
request itself, as vLLM (0.18 and later) does to what is unfinished when its ``--shutdown-timeout`` runs out and to
what arrives while it shuts down (`vllm/v1/engine/core.py`), and as a sleep in ``abort`` mode does: the drain of a
scale-down, a node's or a pod's restart hands the stream on instead of ending it short. The abort's own text, if
any, is relayed without the finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.body import ParsedRequest

__all__ = ["Continuation", "Transcript", "aborted"]

_TEXT_ONLY_DELTA = frozenset({"role", "content"})
_IDS = ("prompt_token_ids", "token_ids")  # the fields ``return_token_ids`` adds to an event


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: Any) -> list[int] | None:
    """A list of token ids, else None."""
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    return None


def _hide_ids(payload: dict[str, Any]) -> bool:
    """Set the ids ``return_token_ids`` added back to null, as vLLM sends them without it; whether any was set."""
    changed = False
    for holder in (payload, *(c for c in payload.get("choices") or () if isinstance(c, dict))):
        for key in _IDS:
            if holder.get(key) is not None:
                holder[key], changed = None, True
    return changed


def _ids_only(payload: dict[str, Any]) -> bool:
    """Whether a chat chunk carries nothing but ids: vLLM would not have sent it without ``return_token_ids``."""
    if payload.get("usage") is not None or not payload.get("choices"):
        return False
    for choice in payload["choices"]:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or choice.get("finish_reason") is not None or choice.get("logprobs"):
            return False
        if any(v is not None for v in delta.values()):
            return False
    return True


def _as_chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A completions chunk's choice as a chat chunk's (a chat continued on /v1/completions)."""
    text = choice.get("text")
    finish = choice.get("finish_reason")
    found: dict[str, Any] = {
        "index": choice.get("index", 0),
        "delta": {"content": text if isinstance(text, str) else ""},
        "logprobs": None,
        "finish_reason": finish,
    }
    if finish is not None:
        found["stop_reason"] = choice.get("stop_reason")
    if "token_ids" in choice:
        found["token_ids"] = choice["token_ids"]
    return found


def aborted(payload: dict[str, Any]) -> bool:
    """Whether an engine's answer or event ends a choice with ``finish_reason: "abort"``."""
    choices = payload.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices)


def _unfinished(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An aborting event without its finish (its text goes on to the client); None when it carries no text."""
    choices = [dict(c, finish_reason=None) for c in payload["choices"] if isinstance(c, dict)]
    has_text = any((c.get("delta") or {}).get("content") or c.get("text") for c in choices)
    return {**payload, "choices": choices} if has_text else None


def _may_resume(parsed: ParsedRequest) -> bool:
    """Whether the request, as sent, can be continued from a text prefix at all."""
    payload = parsed.payload
    if parsed.kind not in ("chat", "completion"):  # a Responses or Messages stream is not continued (yet)
        return False
    if parsed.n != 1 or payload.get("best_of") not in (None, 1) or payload.get("echo"):
        return False
    if parsed.kind == "completion":
        prompt = payload.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))
    if payload.get("continue_final_message") is True:  # the client's own prefill: the text is appended to it
        last = payload["messages"][-1]
        return last.get("role") == "assistant" and isinstance(last.get("content"), str)
    return True


@dataclass(frozen=True)
class Continuation:
    """The request that continues a stream: its body, the engine path it goes to (None: the request's own), the
    generated tokens it sends back as prompt, and whether the engine answers in completions chunks a chat stream
    must be rewritten from."""

    body: bytes
    path: str | None = None
    sent: int = 0
    completions_for_chat: bool = False
    keeps_ids: bool = False  # the prompt's ids and the ids sent stay those of the stream (not re-tokenized text)


@dataclass
class Transcript:
    """A stream as its client has seen it (see the module docstring). Build it with `for_request`."""

    kind: str
    parts: list[str] = field(default_factory=list)
    tokens: int = 0  # content-bearing events relayed
    head: tuple[Any, Any, Any] | None = None  # the first response's id, created, model
    resumable: bool = True
    finished: bool = False  # a choice carried its finish_reason: only usage and [DONE] were left
    done: bool = False  # [DONE] relayed
    offset: int = -1  # tokens sent before the current engine's part began; -1: still the first engine
    hide_ids: bool = True  # the client did not ask for return_token_ids: the ids are the gateway's own
    prompt_ids: list[int] | None = None  # the prompt as the first engine tokenized it
    ids: list[int] = field(default_factory=list)  # every generated token's id, in order
    shown: int = 0  # how many of ``ids`` have their text shown (the rest: an incomplete character's bytes)
    ids_complete: bool = True  # every event with text carried its token ids
    completions_for_chat: bool = False  # the current engine continues a chat on /v1/completions

    @classmethod
    def for_request(cls, parsed: ParsedRequest) -> Transcript | None:
        """A transcript for a request that could be resumed, else None (its stream ends as it always did)."""
        if not _may_resume(parsed):
            return None
        return cls(parsed.kind, hide_ids=parsed.payload.get("return_token_ids") is not True)

    def request_body(self, upstream_body: bytes) -> bytes:
        """The body the first engine gets: ``upstream_body`` asking for the token ids (resume by token ids)."""
        if not self.hide_ids:
            return upstream_body  # the client asked for them itself
        return _dumps({**json.loads(upstream_body), "return_token_ids": True})

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def can_continue(self) -> bool:
        return self.resumable and not self.finished and not self.done

    @property
    def has_ids(self) -> bool:
        """Whether the prompt's ids and an id for every token shown are known: the stream resumes by token ids."""
        return self.prompt_ids is not None and self.ids_complete

    def begin_resumed_part(self, continued: Continuation | None = None) -> None:
        """The next events come from a new engine continuing the stream as ``continued`` asks (by default: the text
        so far): rewrite them from now on."""
        sent = self.tokens if continued is None else continued.sent
        self.offset, self.done = sent, False
        self.completions_for_chat = continued is not None and continued.completions_for_chat
        if continued is not None and continued.keeps_ids:
            del self.ids[sent:]  # ids not sent back (their text unshown) come again from the next engine
            self.shown = self.tokens = sent
        else:
            self.ids_complete = False  # the next engine's prompt is re-tokenized text: our ids end here

    def relay(self, blob: bytes) -> tuple[bytes, str | None]:
        """Complete events from the engine -> (the bytes to send on, a failure met in them or None).

        At a failure (an engine error event) the events before it are returned and the rest is dropped.
        """
        kept: list[bytes] = []
        for raw in blob.split(b"\n\n")[:-1]:
            event = raw + b"\n\n"
            data = raw[5:].strip() if raw.startswith(b"data:") else None
            if data is None:  # a comment or another field: nothing to read
                kept.append(event)
                continue
            if data == b"[DONE]":
                self.done = True
                kept.append(event)
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                payload = None
            if not isinstance(payload, dict):
                self.resumable = False
                kept.append(event)
                continue
            error = payload.get("error")
            if isinstance(error, dict) and "choices" not in payload:
                code = _int(error.get("code"))
                if code is None or code >= 500:
                    message = error.get("message")
                    return b"".join(kept), f"the engine failed mid-stream: {message}"
                self.resumable = False  # the request's own problem: relayed, and not worth repeating
                kept.append(event)
                continue
            if self.can_continue and aborted(payload):
                unfinished = _unfinished(payload)
                if unfinished is not None:
                    kept.append(self._relayed(unfinished, b"data: " + _dumps(unfinished) + b"\n\n"))
                return b"".join(kept), "the engine aborted the request (finish_reason abort: it is stopping)"
            kept.append(self._relayed(payload, event))
        return b"".join(kept), None

    def _relayed(self, payload: dict[str, Any], event: bytes) -> bytes:
        """``event`` (``payload``'s) as the client gets it: rewritten into the first stream after a resume, without
        the ids the client did not ask for, or nothing (a resumed engine's role-only first delta, an event that
        only carried ids); observed either way."""
        changed = self.offset >= 0
        if changed:
            rewritten = self._rewrite(payload)
            if rewritten is None:
                return b""
            payload = rewritten
        self._observe(payload)
        if self.hide_ids and _hide_ids(payload):
            if self.kind == "chat" and _ids_only(payload):
                return b""  # vLLM sends a chunk without text only for its ids (return_token_ids)
            changed = True
        return b"data: " + _dumps(payload) + b"\n\n" if changed else event

    def _observe(self, payload: dict[str, Any]) -> None:
        if self.head is None:
            self.head = (payload.get("id"), payload.get("created"), payload.get("model"))
        if self.prompt_ids is None and self.offset < 0 and self.kind == "chat":
            self.prompt_ids = _ids(payload.get("prompt_token_ids"))
        choices = payload.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                self.resumable = False
                continue
            if self.prompt_ids is None and self.offset < 0 and self.kind == "completion":
                self.prompt_ids = _ids(choice.get("prompt_token_ids"))
            ids = _ids(choice.get("token_ids"))
            self.ids += ids or ()
            if choice.get("finish_reason") is not None:
                self.finished = True
            if self.kind == "chat":
                delta = choice.get("delta")
                delta = delta if isinstance(delta, dict) else {}
                if any(v is not None for k, v in delta.items() if k not in _TEXT_ONLY_DELTA):
                    self.resumable = False  # tool calls, reasoning: not a text prefix
                text = delta.get("content")
            else:
                text = choice.get("text")
            if isinstance(text, str) and text:
                self.parts.append(text)
                self.tokens += 1
                if not ids:
                    self.ids_complete = False  # this engine does not return token ids (or text came without any)
                self.shown = len(self.ids)

    def _rewrite(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A resumed engine's event as part of the first stream; None to drop it (its role-only first delta)."""
        if self.head is not None:
            payload["id"], payload["created"], payload["model"] = self.head
        choices = payload.get("choices")
        if isinstance(choices, list):
            for choice in choices:  # the client had the prompt's ids (if it asked) from the first engine
                if isinstance(choice, dict) and choice.get("prompt_token_ids") is not None:
                    choice["prompt_token_ids"] = None
            if self.completions_for_chat:
                payload["object"] = "chat.completion.chunk"
                choices = payload["choices"] = [_as_chat_choice(c) for c in choices if isinstance(c, dict)]
        if payload.get("prompt_token_ids") is not None:
            payload["prompt_token_ids"] = None
        if self.kind == "chat" and isinstance(choices, list):
            kept = []
            for choice in choices:
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if isinstance(delta, dict) and "role" in delta:
                    del delta["role"]  # the client had its role delta from the first engine
                    if not delta.get("content") and choice.get("finish_reason") is None:
                        continue
                kept.append(choice)
            if not kept and choices and payload.get("usage") is None:
                return None
            payload["choices"] = kept
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._fix_usage(usage)
        return payload

    def _fix_usage(self, usage: dict[str, Any]) -> None:
        """The resumed engine counted the text sent back as prompt: count it as the completion it was."""
        prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        if prompt is None or completion is None:
            return
        prompt, completion = max(0, prompt - self.offset), completion + self.offset
        usage.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        if isinstance(details, dict) and cached is not None:
            details["cached_tokens"] = min(cached, prompt)
